"""Proximal Policy Optimization (clipped surrogate) for discrete and Gaussian continuous actions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step, data_parallel, my_share
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
from pickaxe.models.mlp import single_spaces
from pickaxe.models.normalize import ObsNormalized, RewardScaler
from pickaxe.models.shared_torso import shared_actor_critic


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
    """PPO on an ``ActorCritic``: GAE over each rollout, then ``epochs`` passes of shuffled minibatches.

    With data-parallel learners each computes the loss of its share of every minibatch's rows (advantages
    normalised over the whole minibatch, its loss weighted by its share of the rows) and the gradients are summed,
    so each step is the single-process one. Every learner must draw the same shuffle (the same torch RNG state).
    """

    supports_data_parallel = True
    loss_name: str = "ppo loss"

    def __init__(self, policy: nn.Module, config: Any = None) -> None:
        self.policy = policy
        self.config = cfg = config or PPOConfig()
        self.optimizer = self._optimizer()
        self.rollout = RolloutBuffer(cfg.gamma, cfg.gae_lambda)
        self.progress = 0.0
        if cfg.normalize_obs and getattr(policy, "obs_norm", None) is None:
            raise ValueError(
                "normalize_obs needs a policy with an obs_norm (wrap it in models.normalize.ObsNormalized)"
            )
        self.reward_scaler = RewardScaler(cfg.gamma, cfg.reward_clip) if cfg.normalize_reward else None

    def _optimizer(self) -> torch.optim.Optimizer:
        return adam(self.policy.parameters(), lr=self.config.lr, eps=self.config.adam_eps)

    def set_progress(self, step: int, total_steps: int) -> None:
        """Anneal learning rate and clip range when their schedules are linear."""
        self.progress = step / max(total_steps, 1)

    def _scheduled(self, value: float, schedule: str) -> float:
        return linear_schedule(value, 0.0, self.progress) if schedule == "linear" else value

    def update(self, batch: Batch) -> dict[str, float]:
        """GAE on the ``[T, N]`` rollout (bootstrapping from V(next_obs) unless terminated), then PPO epochs."""
        cfg = self.config
        self._scale_rewards(batch)
        data = self._targets(batch)
        lr = self._scheduled(cfg.lr, cfg.lr_schedule)
        clip = self._scheduled(cfg.clip, cfg.clip_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        history: list[dict[str, float]] = []
        epochs_done = 0
        sharded = data_parallel()[1] > 1
        share_cfg = replace(cfg, normalize_advantage=False) if sharded else cfg  # shares get normalised advantages
        for _ in range(cfg.epochs):
            epochs_done += 1
            for mb in self.rollout.minibatches(cfg.minibatch_size):
                share, weight = self._my_share(mb) if sharded else (mb, None)
                history.append(self._step(share, share_cfg, clip, weight))
            if cfg.target_kl is not None and history[-1]["ppo/approx_kl"] > cfg.target_kl:
                break
        # float32 means, as the per-step values were computed
        metrics = {k: float(torch.tensor([h[k] for h in history]).mean()) for k in history[0]}
        metrics["ppo/explained_variance"] = explained_variance(data["value"], data["return"])
        metrics["ppo/lr"] = lr
        metrics["ppo/clip"] = clip
        metrics["ppo/epochs"] = float(epochs_done)  # fewer than cfg.epochs when target_kl stopped the update
        metrics["ppo/gradient_steps"] = float(len(history))
        self._update_obs_stats(batch)
        return metrics

    def _targets(self, batch: Batch) -> Batch:
        """Advantages and returns of the ``[T, N]`` rollout, stored in ``self.rollout``; the flattened batch."""
        return compute_targets(self.policy, self.rollout, batch)

    def _trained(self) -> nn.Module:
        """Every module the optimizer steps (its gradients clipped together): the policy."""
        return self.policy

    def _scale_rewards(self, batch: Batch) -> None:
        """With ``normalize_reward``: replace the rollout's rewards by their scaled values, in place."""
        if self.reward_scaler is not None:
            done = batch["terminated"] | batch["truncated"]
            batch.set("reward", self.reward_scaler.scale(batch["reward"], done))

    def _update_obs_stats(self, batch: Batch) -> None:
        """With ``normalize_obs``: merge the rollout's raw observations into the statistics, after learning from it
        (the next rollout is sampled, and learned from, with the new frozen statistics)."""
        norm = getattr(self.policy, "obs_norm", None)
        if self.config.normalize_obs and norm is not None:
            norm.update(batch["obs"])

    def _my_share(self, mb: Batch) -> tuple[Batch, float]:
        """This learner's rows of minibatch ``mb`` (advantages normalised over all of ``mb`` when configured) and
        the weight of its loss, its share of the rows (the learners' weighted losses sum to the loss of ``mb``)."""
        rows = torch.tensor(list(my_share(mb.batch_size[0])), dtype=torch.long, device=mb.device)
        advantage = normalize(mb["advantage"]) if self.config.normalize_advantage else mb["advantage"]
        share = mb[rows]
        share["advantage"] = advantage[rows]
        return share, len(rows) / mb.batch_size[0]

    def _step(self, mb: Batch, cfg: PPOConfig, clip: float, weight: float | None) -> dict[str, float]:
        """One guarded optimizer step on minibatch ``mb`` (or, with ``weight``, this learner's share of one: its
        loss and metrics weighted, then summed over the learners); the step's metrics, read in its one host read."""
        loss, stats = self._loss(mb, cfg, clip)
        if weight is not None:
            loss, stats = loss * weight, {k: v * weight for k, v in stats.items()}
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sums = torch.stack([v.float().reshape(()) for v in stats.values()])
        values = clip_and_step(
            self._trained(),
            self.optimizer,
            self.config.max_grad_norm,
            loss,
            name=self.loss_name,
            sums=sums,
            reduce=True,
        )
        return {**dict(zip(stats, values[2:], strict=True)), "grad_norm": values[0]}

    def _loss(self, mb: Batch, cfg: Any, clip: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return ppo_loss(self.policy, mb, cfg, clip)

    def networks(self) -> dict[str, nn.Module]:
        """The actor-critic (with its observation statistics when ``normalize_obs``)."""
        return {"policy": self.policy}

    def state_dict(self) -> dict[str, Any]:
        """Policy (observation statistics included), optimizer, schedule position and reward statistics."""
        state = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": self.progress,
        }
        if self.reward_scaler is not None:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = float(state["progress"])
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state["reward_scaler"])


def actor_critic(envs: Any, model: Any) -> nn.Module:
    """The ``ActorCritic`` of ``model``'s shape for ``envs``: separate actor and critic MLPs, or one shared torso
    with linear heads when ``model.shared``."""
    if getattr(model, "shared", False):
        return shared_actor_critic(envs, tuple(model.hidden), model.activation)
    return ActorCritic.for_env(envs, hidden=tuple(model.hidden), activation=model.activation)


def normalized(policy: nn.Module, envs: Any, config: Any) -> nn.Module:
    """``policy`` behind an observation normaliser when ``config.normalize_obs``, else ``policy`` itself."""
    if not config.normalize_obs:
        return policy
    return ObsNormalized(policy, tuple(single_spaces(envs)[0].shape), config.obs_clip)


def build_ppo(config: PPOConfig, envs: Any, model: Any, device: torch.device, seed: int) -> PPO:
    """PPO with an ``ActorCritic`` sized from ``envs``' spaces and shaped by ``model`` (``hidden``, ``activation``,
    ``shared``), behind an observation normaliser when ``config.normalize_obs``."""
    policy = actor_critic(envs, model)
    return PPO(normalized(policy, envs, config).to(device), config)
