"""Conservative Q-learning (Kumar et al. 2020) on dataset batches.

Box actions, on SAC (``CQL``): SAC's twin critics, squashed Gaussian actor and automatic temperature, with the
critics' loss adding ``cql_alpha`` times CQL(H)'s penalty, ``logsumexp_a Q(s, a) - Q(s, a_data)``, the log-sum-exp
estimated from ``action_samples`` uniform and as many policy actions per state (``offline_core.cql_continuous_penalty``;
the sampled actions are constants to it, so it reaches only the critics). Discrete actions, on DQN (``DiscreteCQL``):
a Q-network with a Polyak target, the squared TD error to ``r + gamma max_a Q'(s', a)`` plus ``cql_alpha`` times the
exact penalty (``cql_discrete_penalty``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.core import adam, td_target
from pickaxe.algos.offline import OfflineAlgorithm, normalized_inputs
from pickaxe.algos.offline_configs import CQLConfig
from pickaxe.algos.offline_core import cql_continuous_penalty, cql_discrete_penalty
from pickaxe.algos.sac import SACPolicy, default_target_entropy, sac_actor_loss, sac_critic_target, temperature_loss
from pickaxe.models.continuous import ActionScale, QEnsemble, SquashedGaussianActor, box_action_dim, frozen, polyak
from pickaxe.models.mlp import single_spaces
from pickaxe.models.q_network import EpsilonGreedy, QNetwork


class _Learned(nn.Module):
    def __init__(self, actor: nn.Module, critic: QEnsemble, log_alpha: float) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic
        self.log_alpha = nn.Parameter(torch.tensor(float(log_alpha)))


class CQL(OfflineAlgorithm):
    """CQL(H) on SAC for Box actions."""

    prefix = "cql"
    metric_names = ("loss/critic", "loss/actor", "loss/alpha", "cql/penalty", "cql/alpha", "cql/q_mean")

    def __init__(
        self, actor: SquashedGaussianActor, critic: QEnsemble, action_space: gym.Space, config: CQLConfig | None = None
    ) -> None:
        self.config = cfg = config or CQLConfig()
        self.policy = SACPolicy(actor, action_space)
        self.auto_alpha = cfg.alpha == "auto"
        self.learned = _Learned(actor, critic, math.log(cfg.alpha_init if self.auto_alpha else float(cfg.alpha)))
        self.learned.to(next(critic.parameters()).device)
        self.policy.to(next(critic.parameters()).device)
        self.actor, self.critic = actor, critic
        self.target = copy.deepcopy(critic).requires_grad_(False)
        self.action_dim = box_action_dim(action_space)
        self.target_entropy = default_target_entropy(action_space)
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        if self.auto_alpha:
            groups.append({"params": [self.learned.log_alpha], "lr": cfg.lr})
        else:
            self.learned.log_alpha.requires_grad_(False)
        self.optimizer = adam(groups, lr=cfg.lr)

    def set_learning_rates(self) -> None:
        """Critic rate on the first group, ``lr`` on the others."""
        groups = self.optimizer.param_groups
        groups[0]["lr"] = self.config.critic_lr or self.config.lr
        for group in groups[1:]:
            group["lr"] = self.config.lr

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """SAC's critic, actor and temperature losses, the critics' with the conservative penalty added."""
        cfg = self.config
        log_alpha = self.learned.log_alpha
        alpha = log_alpha.detach().exp()
        obs, next_obs = mb["obs"], mb["next_obs"]
        b, k = obs.shape[0], cfg.action_samples
        assert self.policy.scale is not None
        # one actor pass: the actor's sample at s, at s' (target), and k samples per s for the penalty
        repeated = obs.unsqueeze(0).expand(k, *obs.shape).reshape(k * b, *obs.shape[1:])
        actions, logps = self.actor.sample(torch.cat([obs, next_obs, repeated]))
        a, next_a, sampled = actions.split([b, b, k * b])
        logp, next_logp, sampled_logp = logps.split([b, b, k * b])
        with torch.no_grad():
            y = sac_critic_target(
                mb["reward"],
                self.target(next_obs, next_a),
                next_logp,
                mb["terminated"],
                cfg.gamma,
                alpha,
                mb.get("discount"),
            )
        q_data = self.critic(obs, self.unit_action(mb))
        critic_loss = 0.5 * (q_data - y.unsqueeze(0)).pow(2).mean(-1).sum()
        uniform = torch.rand(k * b, self.action_dim, device=obs.device) * 2.0 - 1.0
        q_more = self.critic(torch.cat([repeated, repeated]), torch.cat([uniform, sampled.detach()]))
        q_random, q_policy = q_more.reshape(q_more.shape[0], 2 * k, b).split(k, dim=1)
        penalty = cql_continuous_penalty(
            q_random, q_policy, sampled_logp.detach().reshape(1, k, b), q_data, self.action_dim
        )
        with frozen(self.critic):
            actor_loss = sac_actor_loss(logp, self.critic(obs, a), alpha)
        total = critic_loss + cfg.cql_alpha * penalty.sum() + actor_loss
        alpha_loss = temperature_loss(log_alpha, logp, self.target_entropy) if self.auto_alpha else obs.new_zeros(())
        total = total + alpha_loss
        with torch.no_grad():  # reported only: no graph for the stats
            stats = torch.stack([critic_loss, actor_loss, alpha_loss, penalty.mean(), alpha, q_data.mean()])
        return total, stats

    def after_step(self) -> None:
        """Polyak update of the target critics."""
        polyak(self.target, self.critic, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics and their targets."""
        return {"actor": self.actor, "critic": self.critic, "q_target": self.target}


class DiscreteCQL(OfflineAlgorithm):
    """CQL on DQN for Discrete actions: greedy on its Q-network."""

    prefix = "cql"
    metric_names = ("loss/td", "cql/penalty", "cql/q_mean")

    def __init__(self, qnet: QNetwork, config: CQLConfig | None = None) -> None:
        self.config = cfg = config or CQLConfig()
        self.qnet = qnet
        self.learned = qnet
        self.target = copy.deepcopy(qnet).requires_grad_(False)
        self.policy = EpsilonGreedy(qnet, epsilon=0.0)
        self.optimizer = adam(list(qnet.parameters()), lr=cfg.lr)

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Half the squared TD error plus ``cql_alpha`` times the penalty."""
        cfg = self.config
        with torch.no_grad():
            next_value = self.target(mb["next_obs"]).max(-1).values
            y = td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma, mb.get("discount"))
        q_all = self.qnet(mb["obs"])
        q = q_all.gather(-1, mb["action"].long().reshape(-1, 1)).squeeze(-1)
        td = 0.5 * (q - y).pow(2).mean()
        penalty = cql_discrete_penalty(q_all, mb["action"])
        with torch.no_grad():
            stats = torch.stack([td, penalty, q.mean()])
        return td + cfg.cql_alpha * penalty, stats

    def after_step(self) -> None:
        """Polyak update of the target Q-network."""
        polyak(self.target, self.qnet, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """Online and target Q-networks (DQN's names)."""
        return {"q": self.qnet, "q_target": self.target}


def build_cql(config: CQLConfig, envs: Any, model: Any, device: torch.device, seed: int) -> OfflineAlgorithm:
    """CQL sized from ``envs``' spaces (or a dataset sampler's): on SAC for Box actions, on DQN for Discrete."""
    obs_space, action_space = single_spaces(envs)
    hidden, activation = tuple(model.hidden), model.activation
    if isinstance(action_space, gym.spaces.Discrete):
        qnet = QNetwork(obs_space, int(action_space.n), hidden, activation)
        normalized_inputs(config, obs_space, qnet)
        return DiscreteCQL(qnet.to(device), config)
    dim = box_action_dim(action_space)
    ActionScale(action_space)
    actor = SquashedGaussianActor(obs_space, dim, hidden, activation, config.log_std_min, config.log_std_max)
    critic = QEnsemble(obs_space, dim, 2, hidden, activation)
    normalized_inputs(config, obs_space, actor, critic)
    return CQL(actor.to(device), critic.to(device), action_space, config)
