"""Critic-regularised regression (Wang et al. 2020) on dataset batches, for Box and Discrete actions.

Per gradient step (one backward pass, one fused Adam step):

- twin critics fit ``r + gamma (1 - terminated) E_{a'~pi(s')} min_i Q'_i(s', a')`` (Discrete: the exact expectation
  under the policy's probabilities; Box: one policy sample per next state);
- the policy maximises the likelihood of the dataset's actions weighted by ``f(A)`` (``offline_core.crr_weights``):
  ``A(s, a) = min_i Q_i(s, a) - V(s)`` (``crr_advantage``), ``V(s)`` the mean or the max of ``min_i Q_i(s, .)`` over
  the policy's actions (Discrete: every action, the mean weighted by the policy's probabilities; Box:
  ``action_samples`` policy samples), and ``f`` ``min(exp(A / beta), max_weight)`` or ``1[A > 0]``.

The policy is categorical on Discrete actions, a Gaussian with a tanh mean on Box (as behaviour cloning's).
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.core import adam, td_target
from pickaxe.algos.offline import OfflineAlgorithm, actor_for, normalized_inputs
from pickaxe.algos.offline_configs import CRRConfig
from pickaxe.algos.offline_core import crr_advantage, crr_weights, gaussian_logprob, weighted_nll
from pickaxe.algos.sac import SACPolicy
from pickaxe.models.continuous import QEnsemble, box_action_dim, polyak
from pickaxe.models.mlp import single_spaces


class _Learned(nn.Module):
    def __init__(self, actor: nn.Module, critic: QEnsemble) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic


class CRR(OfflineAlgorithm):
    """CRR: twin critics with Polyak targets and an advantage-weighted behaviour-cloning policy."""

    prefix = "crr"
    metric_names = ("loss/critic", "loss/actor", "crr/q_mean", "crr/advantage_mean", "crr/weight_mean")

    def __init__(
        self, actor: nn.Module, critic: QEnsemble, action_space: gym.Space, config: CRRConfig | None = None
    ) -> None:
        self.config = cfg = config or CRRConfig()
        self.policy = SACPolicy(actor, action_space)
        self.discrete = self.policy.discrete
        self.policy.to(next(critic.parameters()).device)
        self.actor, self.critic = actor, critic
        self.learned = _Learned(actor, critic)
        self.target = copy.deepcopy(critic).requires_grad_(False)
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        self.optimizer = adam(groups, lr=cfg.lr)

    def set_learning_rates(self) -> None:
        """Critic rate on the first group, ``lr`` on the actor's."""
        groups = self.optimizer.param_groups
        groups[0]["lr"] = self.config.critic_lr or self.config.lr
        groups[1]["lr"] = self.config.lr

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Critic (TD to the policy's expected target value) and policy (CRR-weighted likelihood) losses, summed."""
        if self.discrete:
            return self._discrete_losses(mb)
        return self._box_losses(mb)

    def _discrete_losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        obs, next_obs = mb["obs"], mb["next_obs"]
        action = mb["action"].long().reshape(-1, 1)
        b = obs.shape[0]
        logprobs, next_logprobs = self.actor(torch.cat([obs, next_obs])).split(b)
        with torch.no_grad():
            next_q = self.target(next_obs).min(dim=0).values  # [B, n]
            next_value = (next_logprobs.exp() * next_q).sum(-1)
            y = td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma, mb.get("discount"))
        q_all = self.critic(obs)  # [2, B, n]
        q = q_all.gather(-1, action.reshape(1, -1, 1).expand(q_all.shape[0], -1, 1)).squeeze(-1)
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        q_min = q_all.detach().min(dim=0).values
        advantage = crr_advantage(
            q_min.gather(-1, action).squeeze(-1), q_min, cfg.advantage, probs=logprobs.detach().exp()
        )
        weights = crr_weights(advantage, cfg.weight, cfg.beta, cfg.max_weight)
        actor_loss = weighted_nll(logprobs.gather(-1, action).squeeze(-1), weights)
        with torch.no_grad():  # reported only: no graph for the stats
            stats = torch.stack([critic_loss, actor_loss, q.mean(), advantage.mean(), weights.mean()])
        return critic_loss + actor_loss, stats

    def _box_losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        assert self.policy.scale is not None
        obs, next_obs = mb["obs"], mb["next_obs"]
        b, k = obs.shape[0], cfg.action_samples
        repeated = obs.unsqueeze(0).expand(k, *obs.shape).reshape(k * b, *obs.shape[1:])
        with torch.no_grad():  # the policy's samples are constants to both losses
            sampled, _ = self.actor.sample(torch.cat([next_obs, repeated]))
            next_a, others = sampled.split([b, k * b])
            next_value = self.target(next_obs, next_a).min(dim=0).values
            y = td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma, mb.get("discount"))
        a = self.unit_action(mb)
        q = self.critic(obs, a)  # [2, B]
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        with torch.no_grad():
            q_others = self.critic(repeated, others).min(dim=0).values.reshape(k, b).T  # [B, k]
        advantage = crr_advantage(q.detach().min(dim=0).values, q_others, cfg.advantage)
        weights = crr_weights(advantage, cfg.weight, cfg.beta, cfg.max_weight)
        mean, log_std = self.actor(obs)
        actor_loss = weighted_nll(gaussian_logprob(mean, log_std, a), weights)
        with torch.no_grad():  # reported only: no graph for the stats
            stats = torch.stack([critic_loss, actor_loss, q.mean(), advantage.mean(), weights.mean()])
        return critic_loss + actor_loss, stats

    def after_step(self) -> None:
        """Polyak update of the target critics."""
        polyak(self.target, self.critic, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics and their targets."""
        return {"actor": self.actor, "critic": self.critic, "q_target": self.target}


def build_crr(config: CRRConfig, envs: Any, model: Any, device: torch.device, seed: int) -> CRR:
    """CRR sized from ``envs``' spaces (or a dataset sampler's): Discrete actions get all-action critics."""
    obs_space, action_space = single_spaces(envs)
    hidden, activation = tuple(model.hidden), model.activation
    actor = actor_for(obs_space, action_space, model)
    if isinstance(action_space, gym.spaces.Discrete):
        critic = QEnsemble(obs_space, 0, 2, hidden, activation, outputs=int(action_space.n))
    else:
        critic = QEnsemble(obs_space, box_action_dim(action_space), 2, hidden, activation)
    normalized_inputs(config, obs_space, actor, critic)
    return CRR(actor.to(device), critic.to(device), action_space, config)
