"""Advantage Actor-Critic (A2C, synchronous A3C): one gradient step on each whole rollout, on PPO's pieces."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from pickaxe.algos.base import data_parallel
from pickaxe.algos.configs import A2CConfig
from pickaxe.algos.core import adam, explained_variance, normalize
from pickaxe.algos.ppo import PPO, actor_critic, compute_targets, normalized
from pickaxe.data.batch import Batch


def a2c_loss(policy: Any, mb: Batch, cfg: A2CConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-mean(A log pi(a|s)) + vf_coef * mean((V - R)^2) - ent_coef * mean(H)`` on a batch with ``obs, action,
    advantage, return`` (the value loss without PPO's 1/2, as Stable-Baselines3's A2C)."""
    logprob, entropy, value = policy.evaluate_actions(mb["obs"], mb["action"])
    advantage = normalize(mb["advantage"]) if cfg.normalize_advantage else mb["advantage"]
    pg_loss = -(advantage * logprob).mean()
    v_loss = F.mse_loss(value, mb["return"])
    ent = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    return loss, {"loss/policy": pg_loss.detach(), "loss/value": v_loss.detach(), "loss/entropy": ent.detach()}


class A2C(PPO):
    """A2C: returns and advantages by GAE (``gae_lambda=1``: n-step returns), then one optimizer step (RMSprop or
    Adam) on the whole rollout. Shares PPO's observation and reward normalisation, schedules, checkpoint state and
    data-parallel split (each learner takes its share of the rollout's rows)."""

    loss_name = "a2c loss"

    def __init__(self, policy: torch.nn.Module, config: A2CConfig | None = None) -> None:
        super().__init__(policy, config or A2CConfig())

    def _optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        if cfg.optimizer == "adam":
            return adam(self.policy.parameters(), lr=cfg.lr, eps=cfg.eps)
        return torch.optim.RMSprop(self.policy.parameters(), lr=cfg.lr, alpha=cfg.rms_alpha, eps=cfg.eps)

    def update(self, batch: Batch) -> dict[str, float]:
        """Returns and advantages over the ``[T, N]`` rollout (bootstrapping from V(next_obs) unless terminated),
        then one gradient step on all of it."""
        cfg = self.config
        self._scale_rewards(batch)
        data = compute_targets(self.policy, self.rollout, batch)
        lr = self._scheduled(cfg.lr, cfg.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if data_parallel()[1] > 1:
            share, weight = self._my_share(data)
            metrics = self._step(share, replace(cfg, normalize_advantage=False), 0.0, weight)
        else:
            metrics = self._step(data, cfg, 0.0, None)
        metrics["a2c/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["a2c/lr"] = lr
        self._update_obs_stats(batch)
        return metrics

    def _loss(self, mb: Batch, cfg: Any, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return a2c_loss(self.policy, mb, cfg)


def build_a2c(config: A2CConfig, envs: Any, model: Any, device: torch.device, seed: int) -> A2C:
    """A2C with an ``ActorCritic`` sized from ``envs``' spaces and shaped by ``model`` (``hidden``, ``activation``,
    ``shared``), behind an observation normaliser when ``config.normalize_obs``."""
    policy = actor_critic(envs, model)
    return A2C(normalized(policy, envs, config).to(device), config)
