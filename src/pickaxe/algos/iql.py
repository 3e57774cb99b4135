"""Implicit Q-learning (Kostrikov, Nair & Levine 2021) on dataset batches, for Box and Discrete actions.

Per gradient step (one backward pass over three independent losses, one fused Adam step):

- V(s) fits an upper expectile of the target critics' ``min_i Q'_i(s, a)`` on the dataset's actions
  (``offline_core.expectile_loss``);
- Q_i(s, a) fit ``r + gamma (1 - terminated) V(s')``, so no action outside the data is ever evaluated;
- the policy maximises the likelihood of the dataset's actions weighted by ``min(exp(beta (Q' - V)), max_weight)``
  (``advantage_weights``, ``weighted_nll``): categorical on Discrete actions, a Gaussian with a tanh mean on Box.

With ``actor_lr_schedule cosine`` the policy's learning rate decays over the run's gradient steps
(``core.cosine_schedule`` at ``num_updates / (total_steps / batch_size)``, set before every step; the update counter
is in the state, so a resume continues the schedule exactly).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.core import adam, cosine_schedule, td_target
from pickaxe.algos.offline import OfflineAlgorithm, actor_for, normalized_inputs
from pickaxe.algos.offline_configs import IQLConfig
from pickaxe.algos.offline_core import advantage_weights, expectile_loss, gaussian_logprob, weighted_nll
from pickaxe.algos.sac import SACPolicy
from pickaxe.models.continuous import QEnsemble, box_action_dim, polyak
from pickaxe.models.mlp import single_spaces


class _Learned(nn.Module):
    def __init__(self, actor: nn.Module, critic: QEnsemble, value: QEnsemble) -> None:
        super().__init__()
        self.actor, self.critic, self.value = actor, critic, value


class IQL(OfflineAlgorithm):
    """IQL: twin critics with Polyak targets, a state-value network and an advantage-weighted policy."""

    prefix = "iql"
    metric_names = ("loss/critic", "loss/value", "loss/actor", "iql/q_mean", "iql/v_mean", "iql/weight_mean")

    def __init__(
        self,
        actor: nn.Module,
        critic: QEnsemble,
        value: QEnsemble,
        action_space: gym.Space,
        config: IQLConfig | None = None,
    ) -> None:
        self.config = cfg = config or IQLConfig()
        self.policy = SACPolicy(actor, action_space)
        self.discrete = self.policy.discrete
        self.policy.to(next(critic.parameters()).device)
        self.actor, self.critic, self.value = actor, critic, value
        self.learned = _Learned(actor, critic, value)
        self.target = copy.deepcopy(critic).requires_grad_(False)
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(value.parameters()), "lr": cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        self.optimizer = adam(groups, lr=cfg.lr)

    total_updates: int | None = None
    """Gradient steps of the whole run (``trainer.total_steps / batch_size``), from ``set_progress``."""

    def set_progress(self, step: int, total_steps: int) -> None:
        """Record the run's length in gradient steps, for the cosine schedule of the policy's learning rate."""
        self.total_updates = max(total_steps // self.config.batch_size, 1)

    def actor_lr(self) -> float:
        """The policy's learning rate of the next gradient step: ``lr``, or with ``actor_lr_schedule cosine``
        ``lr * 0.5 * (1 + cos(pi k / N))`` at step ``k = num_updates`` of ``N = total_updates``."""
        cfg = self.config
        if cfg.actor_lr_schedule == "cosine" and self.total_updates is not None:
            return cosine_schedule(cfg.lr, self.num_updates / self.total_updates)
        return cfg.lr

    def set_learning_rates(self) -> None:
        """Critic, value and actor rates, read afresh before every gradient step."""
        groups = self.optimizer.param_groups
        groups[0]["lr"] = self.config.critic_lr or self.config.lr
        groups[1]["lr"] = self.config.lr
        groups[2]["lr"] = self.actor_lr()

    def learn(self, minibatches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
        """``OfflineAlgorithm.learn``, with the policy's learning rate of its last step (``iql/actor_lr``)."""
        metrics = super().learn(minibatches)
        metrics["iql/actor_lr"] = float(self.optimizer.param_groups[2]["lr"])
        return metrics

    def _q(self, net: QEnsemble, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[n, B]`` values of the dataset's actions (Discrete: gathered from all actions' values; Box: ``action``
        in the policy's ``[-1, 1]`` box)."""
        if self.discrete:
            q_all = net(obs)
            index = action.long().reshape(1, -1, 1).expand(q_all.shape[0], -1, 1)
            return q_all.gather(-1, index).squeeze(-1)
        return net(obs, action)

    def _logprob(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            return self.actor(obs).gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
        mean, log_std = self.actor(obs)
        return gaussian_logprob(mean, log_std, action)

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Value (expectile), critic (TD to V(s')) and policy (advantage-weighted) losses, summed. ``V(s')`` is a
        constant to every loss: computed without a graph, so the backward pass covers ``V(s)``'s rows only."""
        cfg = self.config
        obs = mb["obs"]
        action = mb["action"] if self.discrete else self.unit_action(mb)
        v = self.value(obs).reshape(-1)
        with torch.no_grad():
            next_v = self.value(mb["next_obs"]).reshape(-1)
            q_target = self._q(self.target, obs, action).min(dim=0).values
            y = td_target(mb["reward"], next_v, mb["terminated"], cfg.gamma, mb.get("discount"))
        value_loss = expectile_loss(q_target - v, cfg.expectile)
        q = self._q(self.critic, obs, action)
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        weights = advantage_weights(q_target - v.detach(), cfg.beta, cfg.max_weight)
        actor_loss = weighted_nll(self._logprob(obs, action), weights)
        total = critic_loss + value_loss + actor_loss
        with torch.no_grad():
            stats = torch.stack([critic_loss, value_loss, actor_loss, q.mean(), v.mean(), weights.mean()])
        return total, stats

    def after_step(self) -> None:
        """Polyak update of the target critics."""
        polyak(self.target, self.critic, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics, their targets and the value."""
        return {"actor": self.actor, "critic": self.critic, "q_target": self.target, "value": self.value}


def build_iql(config: IQLConfig, envs: Any, model: Any, device: torch.device, seed: int) -> IQL:
    """IQL sized from ``envs``' spaces (or a dataset sampler's): Discrete actions get all-action critics."""
    obs_space, action_space = single_spaces(envs)
    hidden, activation = tuple(model.hidden), model.activation
    actor = actor_for(obs_space, action_space, model)
    if isinstance(action_space, gym.spaces.Discrete):
        critic = QEnsemble(obs_space, 0, 2, hidden, activation, outputs=int(action_space.n))
    else:
        critic = QEnsemble(obs_space, box_action_dim(action_space), 2, hidden, activation)
    value = QEnsemble(obs_space, 0, 1, hidden, activation, outputs=1)
    normalized_inputs(config, obs_space, actor, critic, value)
    return IQL(actor.to(device), critic.to(device), value.to(device), action_space, config)
