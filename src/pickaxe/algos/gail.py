"""GAIL (Ho & Ermon 2016): imitation from demonstrations with env interaction.

Each update, before PPO's: the discriminator takes ``disc_steps`` guarded Adam steps, each on ``disc_batch_size``
demonstration pairs (the next ones of the ``DatasetSampler`` over ``--data.dataset``: a shuffled pass, exact on
resume) against as many pairs drawn from the fresh rollout; then the rollout's env rewards are replaced by the
discriminator's reward (``gail_core.discriminator_reward``) and PPO's own update (GAE, clipped surrogate, its
options) runs on them unchanged. The env's rewards are never learned from; the collector still logs the true episode
returns (``rollout/return_mean``) and evaluation runs in the env, so the imitation is judged by the env's return.

The discriminator reads the observation (flattened) and the action: one-hot on Discrete actions, clipped to the
space's bounds on Box actions (the env acts with the clipped action, and the demonstrations lie within the bounds).
Its weights, its optimizer and the demonstration sampler's position and RNG are in ``state_dict``, so a killed run
resumes exactly; the model file holds only the policy (acting needs no discriminator).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from pickaxe.algos.base import guarded_step
from pickaxe.algos.core import adam
from pickaxe.algos.gail_core import (
    absorbing_value,
    discriminator_accuracy,
    discriminator_loss,
    discriminator_reward,
    gradient_penalty,
)
from pickaxe.algos.imitation_configs import GAILConfig
from pickaxe.algos.ppo import PPO, actor_critic, normalized
from pickaxe.data.batch import Batch
from pickaxe.errors import ConfigError
from pickaxe.models.mlp import mlp, obs_dim, single_spaces


class Discriminator(nn.Module):
    """An MLP from ``(s, a)`` to the logit of "this pair is the expert's"."""

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, hidden: int, absorbing: bool = False
    ) -> None:
        super().__init__()
        self.absorbing = absorbing
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete and not (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1):
            raise ConfigError(f"gail takes Discrete or 1-D Box actions, got {action_space}; use ppo")
        self.act_dim = int(action_space.n) if self.discrete else int(action_space.shape[0])
        self.in_dim = obs_dim(observation_space) + self.act_dim + int(absorbing)
        low = np.zeros(self.act_dim) if self.discrete else np.asarray(action_space.low, np.float32)
        high = np.zeros(self.act_dim) if self.discrete else np.asarray(action_space.high, np.float32)
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32), persistent=False)
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32), persistent=False)
        self.net = mlp(self.in_dim, (hidden, hidden), 1, activation="tanh")

    def inputs(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Rows ``[B, in_dim]`` of the flattened observation and the encoded action (and, with ``absorbing``, a 0
        flag: not the absorbing state)."""
        if self.discrete:
            act = F.one_hot(action.long().reshape(-1), self.act_dim).float()
        else:
            act = torch.maximum(torch.minimum(action.reshape(-1, self.act_dim).float(), self.high), self.low)
        parts = [obs.reshape(act.shape[0], -1).float(), act]
        if self.absorbing:
            parts.append(act.new_zeros(act.shape[0], 1))
        return torch.cat(parts, -1)

    def absorbing_rows(self, n: int) -> torch.Tensor:
        """``n`` rows ``[n, in_dim]`` of the absorbing state: zero observation and action, the flag 1 (Kostrikov et
        al. 2019's encoding)."""
        rows = self.low.new_zeros(n, self.in_dim)
        rows[:, -1] = 1.0
        return rows

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The logit of each row of discriminator inputs ``x``, ``[B]``."""
        return self.net(x).squeeze(-1)


class GAIL(PPO):
    """PPO on the reward of a ``Discriminator`` trained before each PPO update (``GAILConfig``). The demonstrations
    come through :meth:`use_demonstrations` (``train.build`` gives them the sampler over ``--data.dataset``); without
    them the algorithm acts and evaluates but cannot update."""

    supports_data_parallel = False

    def __init__(self, policy: nn.Module, discriminator: Discriminator, config: GAILConfig) -> None:
        super().__init__(policy, config)
        self.discriminator = discriminator
        self.disc_optimizer = adam(discriminator.parameters(), lr=config.disc_lr)
        self.demonstrations: Any = None

    def use_demonstrations(self, sampler: Any) -> None:
        """Imitate the pairs ``sampler`` (an ``offline.sampler.DatasetSampler``) yields; its ``steps`` is the
        discriminator's batch size."""
        self.demonstrations = sampler

    def update(self, batch: Batch) -> dict[str, float]:
        """Discriminator steps on the demonstrations against the ``[T, N]`` rollout, the rollout's rewards replaced
        by the discriminator's, then PPO's update; the metrics of both, with the env's and the discriminator's mean
        reward per step."""
        if self.demonstrations is None:
            raise RuntimeError("GAIL has no demonstrations: train.build gives it the --data.dataset sampler")
        cfg: GAILConfig = self.config
        disc = self.discriminator
        x = disc.inputs(batch["obs"].flatten(0, 1), batch["action"].flatten(0, 1))
        ends = int(batch["terminated"].sum()) if disc.absorbing else 0
        pool = torch.cat([x, disc.absorbing_rows(ends)]) if ends else x
        stats = self._train_discriminator(pool, cfg)
        with torch.no_grad():
            reward = discriminator_reward(disc.logits(x), cfg.reward).view(batch.batch_size)
            if disc.absorbing:
                absorbed = discriminator_reward(disc.logits(disc.absorbing_rows(1)), cfg.reward)[0]
                reward = reward + batch["terminated"].to(reward.dtype) * absorbing_value(absorbed, cfg.gamma)
                stats["gail/absorbing_reward"] = float(absorbed)
        stats["gail/env_reward_mean"] = float(batch["reward"].float().mean())
        stats["gail/reward_mean"] = float(reward.mean())
        batch.set("reward", reward.to(batch["reward"].dtype))
        metrics = super().update(batch)
        metrics.update(stats)
        return metrics

    def _train_discriminator(self, policy_x: torch.Tensor, cfg: GAILConfig) -> dict[str, float]:
        """``cfg.disc_steps`` guarded steps, each on a batch of demonstrations and as many rows drawn from the
        rollout's ``policy_x``; the last step's cross-entropy (without the penalty), accuracies and penalty."""
        disc, n = self.discriminator, policy_x.shape[0]
        for group in self.disc_optimizer.param_groups:
            group["lr"] = cfg.disc_lr
        stats: dict[str, float] = {}
        for step in range(cfg.disc_steps):
            demo = self.demonstrations.collect(cfg.disc_batch_size)
            expert_x = disc.inputs(demo["obs"], demo["action"])
            if disc.absorbing:  # each demonstrated termination also steps into the absorbing state
                expert_x = torch.cat([expert_x, disc.absorbing_rows(int(demo["terminated"].sum()))])
            rows = torch.randint(n, (expert_x.shape[0],), device=policy_x.device)
            mine = policy_x[rows]
            expert_logits, policy_logits = disc.logits(expert_x), disc.logits(mine)
            loss = bce = discriminator_loss(expert_logits, policy_logits)
            penalty = None
            if cfg.grad_penalty > 0:
                mix = torch.rand(expert_x.shape[0], device=expert_x.device)
                penalty = gradient_penalty(disc.logits, expert_x, mine, mix)
                loss = loss + cfg.grad_penalty * penalty
            norm = guarded_step(loss, disc, self.disc_optimizer, cfg.max_grad_norm, name="discriminator loss")
            if step < cfg.disc_steps - 1:
                continue
            stats = {"loss/discriminator": float(bce.detach()), "gail/disc_grad_norm": float(norm)}
            if penalty is not None:
                stats["loss/grad_penalty"] = float(penalty.detach())
            stats["gail/expert_accuracy"], stats["gail/policy_accuracy"] = discriminator_accuracy(
                expert_logits.detach(), policy_logits.detach()
            )
        return stats

    def state_dict(self) -> dict[str, Any]:
        """PPO's state plus the discriminator, its optimizer and the demonstration sampler's position and RNG."""
        state = super().state_dict()
        state["discriminator"] = self.discriminator.state_dict()
        state["disc_optimizer"] = self.disc_optimizer.state_dict()
        if self.demonstrations is not None:
            state["demonstrations"] = self.demonstrations.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (a sampler on other data than the checkpoint's is refused)."""
        super().load_state_dict(state)
        self.discriminator.load_state_dict(state["discriminator"])
        self.disc_optimizer.load_state_dict(state["disc_optimizer"])
        if self.demonstrations is not None and "demonstrations" in state:
            self.demonstrations.load_state_dict(state["demonstrations"])


def build_gail(config: GAILConfig, envs: Any, model: Any, device: torch.device, seed: int) -> GAIL:
    """PPO's actor-critic (as ``build_ppo`` makes it) and a discriminator sized from ``envs``' spaces."""
    obs_space, action_space = single_spaces(envs)
    disc = Discriminator(obs_space, action_space, config.disc_hidden, config.absorbing).to(device)
    policy = normalized(actor_critic(envs, model), envs, config).to(device)
    return GAIL(policy, disc, config)
