"""Proximal Policy Optimization (clipped surrogate) for discrete and Gaussian continuous actions."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pickaxe.algos.base import Algorithm, guarded_step
from pickaxe.algos.configs import PPOConfig
from pickaxe.algos.core import (
    adam,
    approx_kl,
    clipped_surrogate,
    explained_variance,
    linear_schedule,
    normalize,
    value_loss,
)
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import RolloutBuffer
from pickaxe.models.actor_critic import ActorCritic


def ppo_loss(
    policy: ActorCritic, mb: Batch, cfg: PPOConfig, clip: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO loss on a minibatch with ``obs, action, logprob, value, advantage, return``."""
    logprob, entropy, value = policy.evaluate_actions(mb["obs"], mb["action"])
    advantage = normalize(mb["advantage"]) if cfg.normalize_advantage else mb["advantage"]
    pg, _, clipped = clipped_surrogate(logprob, mb["logprob"], advantage, clip, clip)
    pg_loss = pg.mean()
    v_loss = value_loss(value, mb["value"], mb["return"], cfg.value_clip).mean()
    ent = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * ent
    stats = {
        "loss/policy": pg_loss.detach(),
        "loss/value": v_loss.detach(),
        "loss/entropy": ent.detach(),
        "ppo/approx_kl": approx_kl(logprob.detach(), mb["logprob"]),
        "ppo/clip_fraction": clipped.float().mean(),
    }
    return loss, stats


def compute_targets(policy: ActorCritic, rollout: RolloutBuffer, batch: Batch) -> Batch:
    """GAE advantages and returns of a ``[T, N]`` rollout, stored in ``rollout``; returns the flattened batch.

    Bootstraps from V(``next_obs``) under ``policy`` unless ``terminated`` (truncation bootstraps); the
    rollout's ``gamma`` and ``gae_lambda`` apply.
    """
    with torch.no_grad():
        next_value = policy.value(batch["next_obs"].flatten(0, 1)).view(batch.batch_size)
    return rollout.add(batch, next_value)


class PPO(Algorithm):
    """PPO on an ``ActorCritic``: GAE over each rollout, then ``epochs`` passes of shuffled minibatches."""

    def __init__(self, policy: ActorCritic, config: PPOConfig | None = None) -> None:
        self.policy = policy
        self.config = cfg = config or PPOConfig()
        self.optimizer = adam(policy.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.rollout = RolloutBuffer(cfg.gamma, cfg.gae_lambda)
        self.progress = 0.0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Anneal learning rate and clip range when their schedules are linear."""
        self.progress = step / max(total_steps, 1)

    def _scheduled(self, value: float, schedule: str) -> float:
        return linear_schedule(value, 0.0, self.progress) if schedule == "linear" else value

    def update(self, batch: Batch) -> dict[str, float]:
        """GAE on the ``[T, N]`` rollout (bootstrapping from V(next_obs) unless terminated), then PPO epochs."""
        cfg = self.config
        data = compute_targets(self.policy, self.rollout, batch)
        lr = self._scheduled(cfg.lr, cfg.lr_schedule)
        clip = self._scheduled(cfg.clip, cfg.clip_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        history: list[dict[str, torch.Tensor]] = []
        epochs_done = 0
        for _ in range(cfg.epochs):
            epochs_done += 1
            for mb in self.rollout.minibatches(cfg.minibatch_size):
                loss, stats = ppo_loss(self.policy, mb, cfg, clip)
                stats["grad_norm"] = guarded_step(loss, self.policy, self.optimizer, cfg.max_grad_norm, "ppo loss")
                history.append(stats)
            if cfg.target_kl is not None and float(history[-1]["ppo/approx_kl"]) > cfg.target_kl:
                break
        metrics = {k: float(torch.stack([h[k] for h in history]).mean()) for k in history[0]}
        metrics["ppo/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["ppo/lr"] = lr
        metrics["ppo/clip"] = clip
        metrics["ppo/epochs"] = float(epochs_done)  # fewer than cfg.epochs when target_kl stopped the update
        metrics["ppo/gradient_steps"] = float(len(history))
        return metrics

    def networks(self) -> dict[str, nn.Module]:
        """The actor-critic."""
        return {"policy": self.policy}

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimizer and schedule position."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), "progress": self.progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = float(state["progress"])
