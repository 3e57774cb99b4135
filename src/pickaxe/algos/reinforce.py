"""REINFORCE (Williams 1992): the Monte-Carlo policy gradient, with or without a learned baseline, on PPO's
actor-critic, rollout storage and normalisations.

The returns are GAE's with lambda 1 (``pickaxe.data.returns.gae``): with a baseline, ``G_t - V(s_t)`` where an
episode cut by truncation or by the rollout's end bootstraps from V of its next observation; without one, the value
and its bootstrap are 0, so each return is the discounted sum of the episode's rewards left in the rollout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from pickaxe.algos.base import data_parallel
from pickaxe.algos.core import adam, explained_variance, normalize
from pickaxe.algos.extra_configs import ReinforceConfig
from pickaxe.algos.ppo import PPO, actor_critic, normalized
from pickaxe.data.batch import Batch


def reinforce_loss(policy: Any, mb: Batch, cfg: ReinforceConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-mean(A log pi(a|s)) - ent_coef * mean(H)``, plus ``vf_coef * mean((V - G)^2)`` with a baseline, on a batch
    with ``obs, action, advantage, return`` (``advantage`` is the return itself without a baseline)."""
    logprob, entropy, value = policy.evaluate_actions(mb["obs"], mb["action"])
    advantage = normalize(mb["advantage"]) if cfg.normalize_advantage else mb["advantage"]
    pg_loss = -(advantage * logprob).mean()
    ent = entropy.mean()
    loss = pg_loss - cfg.ent_coef * ent
    stats = {"loss/policy": pg_loss.detach(), "loss/entropy": ent.detach()}
    if cfg.baseline:
        v_loss = (value - mb["return"]).pow(2).mean()
        loss = loss + cfg.vf_coef * v_loss
        stats["loss/value"] = v_loss.detach()
    return loss, stats


class Reinforce(PPO):
    """REINFORCE: Monte-Carlo returns over each ``[T, N]`` rollout, then one Adam step on all of it. Shares PPO's
    observation and reward normalisation, schedule, checkpoint state and data-parallel split."""

    loss_name = "reinforce loss"

    def __init__(self, policy: torch.nn.Module, config: ReinforceConfig | None = None) -> None:
        super().__init__(policy, config or ReinforceConfig())

    def _optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        params = self.policy.parameters()
        if not cfg.baseline:  # the unused critic stays out of the optimizer (and its state)
            critic = {id(p) for p in critic_of(self.policy).parameters()}
            params = [p for p in self.policy.parameters() if id(p) not in critic]
        return adam(params, lr=cfg.lr, eps=cfg.adam_eps)

    def update(self, batch: Batch) -> dict[str, float]:
        """Returns over the rollout (see the module docstring), then one gradient step on all of it."""
        cfg = self.config
        self._scale_rewards(batch)
        if cfg.baseline:
            with torch.no_grad():
                next_value = self.policy.value(batch["next_obs"].flatten(0, 1)).view(batch.batch_size)
        else:
            next_value = torch.zeros(batch.batch_size, device=batch["reward"].device)
            batch.set("value", torch.zeros_like(next_value))
        data = self.rollout.add(batch, next_value)
        lr = self._scheduled(cfg.lr, cfg.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if data_parallel()[1] > 1:
            share, weight = self._my_share(data)
            metrics = self._step(share, replace(cfg, normalize_advantage=False), 0.0, weight)
        else:
            metrics = self._step(data, cfg, 0.0, None)
        if cfg.baseline:
            metrics["reinforce/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["reinforce/return_mean"] = float(data["return"].mean())
        metrics["reinforce/lr"] = lr
        self._update_obs_stats(batch)
        return metrics

    def _loss(self, mb: Batch, cfg: Any, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return reinforce_loss(self.policy, mb, cfg)


def critic_of(policy: torch.nn.Module) -> torch.nn.Module:
    """The critic MLP of an ``ActorCritic``, through an observation normaliser (``ObsNormalized.inner``)."""
    inner = getattr(policy, "inner", policy)
    return inner.critic


def build_reinforce(config: ReinforceConfig, envs: Any, model: Any, device: torch.device, seed: int) -> Reinforce:
    """REINFORCE with an ``ActorCritic`` sized from ``envs``' spaces and shaped by ``model`` (``hidden``,
    ``activation``, ``shared``), behind an observation normaliser when ``config.normalize_obs``."""
    policy = actor_critic(envs, model)
    return Reinforce(normalized(policy, envs, config).to(device), config)
