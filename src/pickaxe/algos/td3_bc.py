"""TD3+BC (Fujimoto & Gu 2021, "A minimalist approach to offline RL"): TD3's critics, targets, delayed actor and
target smoothing on dataset batches, with the actor loss ``-lambda Q_1(s, pi(s)) + (pi(s) - a)^2`` and ``lambda =
alpha / mean|Q_1|`` (``offline_core.td3_bc_actor_loss``). Box actions, in the normalised box ``[-1, 1]^A``."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.core import adam
from pickaxe.algos.offline import OfflineAlgorithm, normalized_inputs
from pickaxe.algos.offline_configs import TD3BCConfig
from pickaxe.algos.offline_core import td3_bc_actor_loss
from pickaxe.algos.td3 import TD3Policy, smoothed_target_action, td3_target
from pickaxe.models.continuous import ActionScale, DeterministicActor, QEnsemble, box_action_dim, frozen, polyak
from pickaxe.models.mlp import single_spaces


class _Learned(nn.Module):
    def __init__(self, actor: nn.Module, critic: QEnsemble) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic


class TD3BC(OfflineAlgorithm):
    """TD3+BC: every gradient step updates the critics; every ``policy_delay``-th also the actor (with the BC term)
    and, by Polyak averaging, both targets."""

    prefix = "td3_bc"
    metric_names = ("loss/critic", "loss/actor", "td3_bc/q_mean", "td3_bc/lambda", "td3_bc/bc_mse")

    def __init__(
        self, actor: DeterministicActor, critic: QEnsemble, action_space: gym.Space, config: TD3BCConfig | None = None
    ) -> None:
        self.config = cfg = config or TD3BCConfig()
        self.policy = TD3Policy(actor, action_space, noise=0.0)
        self.policy.to(next(critic.parameters()).device)
        self.actor, self.critic = actor, critic
        self.learned = _Learned(actor, critic)
        self.actor_target = copy.deepcopy(actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(critic).requires_grad_(False)
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        self.optimizer = adam(groups, lr=cfg.lr)

    def set_learning_rates(self) -> None:
        """Critic and actor rates, read afresh."""
        self.optimizer.param_groups[0]["lr"] = self.config.critic_lr or self.config.lr
        self.optimizer.param_groups[1]["lr"] = self.config.lr

    def _actor_step(self) -> bool:
        return (self.num_updates + 1) % self.config.policy_delay == 0

    def losses(self, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Critic loss (TD3's target), plus the TD3+BC actor loss on actor steps (reported on every step)."""
        cfg = self.config
        obs, next_obs = mb["obs"], mb["next_obs"]
        a = self.unit_action(mb)
        with torch.no_grad():
            next_a = self.actor_target(next_obs)
            if cfg.target_noise > 0:
                noise = cfg.target_noise * torch.randn_like(next_a)
                next_a = smoothed_target_action(next_a, noise, cfg.target_noise_clip)
            y = td3_target(
                mb["reward"], self.critic_target(next_obs, next_a), mb["terminated"], cfg.gamma, mb.get("discount")
            )
        q = self.critic(obs, a)
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        actor_step = self._actor_step()
        # between actor steps the actor loss is only reported: computed without a graph (the same values)
        with contextlib.nullcontext() if actor_step else torch.no_grad():
            pi = self.actor(obs)
            with frozen(self.critic) if actor_step else contextlib.nullcontext():
                actor_loss, lam = td3_bc_actor_loss(self.critic(obs, pi)[0], pi, a, cfg.alpha)
        total = critic_loss + actor_loss if actor_step else critic_loss
        with torch.no_grad():  # reported only: no graph for the stats
            stats = torch.stack([critic_loss, actor_loss, q.mean(), torch.as_tensor(lam), (pi - a).pow(2).mean()])
        return total, stats

    def after_step(self) -> None:
        """Polyak updates of both targets after an actor step."""
        if self._actor_step():
            polyak(self.critic_target, self.critic, self.config.tau)
            polyak(self.actor_target, self.actor, self.config.tau)

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics and the targets."""
        return {
            "actor": self.actor,
            "critic": self.critic,
            "q_target": self.critic_target,
            "actor_target": self.actor_target,
        }


def build_td3_bc(config: TD3BCConfig, envs: Any, model: Any, device: torch.device, seed: int) -> TD3BC:
    """TD3+BC sized from ``envs``' spaces (or a dataset sampler's); bounded Box actions."""
    obs_space, action_space = single_spaces(envs)
    dim = box_action_dim(action_space)
    ActionScale(action_space)
    hidden, activation = tuple(model.hidden), model.activation
    actor = DeterministicActor(obs_space, dim, hidden, activation)
    critic = QEnsemble(obs_space, dim, 2, hidden, activation)
    normalized_inputs(config, obs_space, actor, critic)
    return TD3BC(actor.to(device), critic.to(device), action_space, config)
