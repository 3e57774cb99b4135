"""TD3 (Fujimoto et al. 2018) and DDPG (Lillicrap et al. 2016, in the TD3 paper's form) on one implementation.

TD3: twin critics and the min of their targets, the actor and the targets updated every ``policy_delay`` critic
steps, target policy smoothing (clipped Gaussian noise on the target action). DDPG is the same code with one
critic, ``policy_delay = 1`` and no smoothing (``DDPGConfig``). Noise scales are relative to the action bounds: the
actor works in ``[-1, 1]^A`` and the env sees ``center + half_range * a``.

A gradient step with an actor update is one backward pass and one fused Adam step over critics and actor (the
actor's loss goes through the critic with its parameters frozen); a step without one leaves the actor's gradients
None, which Adam skips. One host read per gradient step (``clip_and_step``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import Algorithm, clip_and_step
from pickaxe.algos.control_configs import DDPGConfig, TD3Config
from pickaxe.algos.core import adam, td_target
from pickaxe.algos.hindsight import replay_for
from pickaxe.algos.sac import minibatches_of_update, replay_keys
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.data.hindsight import HindsightReplay
from pickaxe.models.continuous import ActionScale, DeterministicActor, QEnsemble, box_action_dim, frozen, polyak
from pickaxe.models.mlp import single_spaces
from pickaxe.models.normalize import frozen_obs_norm


def smoothed_target_action(next_action: torch.Tensor, noise: torch.Tensor, noise_clip: float) -> torch.Tensor:
    """Target policy smoothing: ``clip(mu'(s') + clip(noise, -c, c), -1, 1)`` in the normalised action box
    (``noise`` is already scaled by ``target_noise``)."""
    return (next_action + noise.clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def td3_target(
    reward: torch.Tensor,
    next_q: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    discount: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) min_i Q'_i(s', a')``; ``next_q``: ``[n critics, B]`` (one critic: DDPG's
    target). Truncated steps bootstrap. ``discount``: as ``td_target``'s."""
    return td_target(reward, next_q.min(dim=0).values, terminated, gamma, discount)


def deterministic_actor_loss(q: torch.Tensor) -> torch.Tensor:
    """``-mean Q_1(s, mu(s))``: the actor climbs the first critic (``q``: ``[n, B]``)."""
    return -q[0].mean()


class TD3Policy(nn.Module):
    """What TD3/DDPG act with: uniform random actions (torch's RNG) while ``random`` is set (before
    ``learning_starts``), then the actor plus Gaussian noise of std ``noise`` (relative to the half-range), clipped
    to the bounds; ``deterministic=True`` is the actor alone. Actions in env units."""

    def __init__(self, actor: DeterministicActor, action_space: gym.spaces.Box, noise: float) -> None:
        super().__init__()
        self.actor = actor
        self.scale = ActionScale(action_space)
        self.noise = noise
        self.random = False

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions for ``obs``; no extras."""
        if self.random and not deterministic:
            a = torch.rand(obs.shape[0], self.scale.center.numel(), device=obs.device) * 2.0 - 1.0
        else:
            a = self.actor(obs)
            if not deterministic and self.noise > 0:
                a = (a + self.noise * torch.randn_like(a)).clamp(-1.0, 1.0)
        return self.scale.to_env(a), {}


class _Learned(nn.Module):
    """What one TD3 gradient step changes, as one module for ``clip_and_step``."""

    def __init__(self, actor: nn.Module, critic: QEnsemble) -> None:
        super().__init__()
        self.actor, self.critic = actor, critic


class TD3(Algorithm):
    """TD3 (``TD3Config``) or DDPG (``DDPGConfig``): stores each collected batch in a uniform replay buffer (or
    ``buffer``: a ``HindsightReplay`` on goal envs), then takes ``gradient_steps`` critic steps, with an actor step
    and a Polyak update of both targets every ``policy_delay``-th."""

    def __init__(
        self,
        actor: DeterministicActor,
        critic: QEnsemble,
        action_space: gym.spaces.Box,
        config: TD3Config | None = None,
        seed: int = 0,
        buffer: ReplayBuffer | HindsightReplay | None = None,
    ) -> None:
        self.config = cfg = config or TD3Config()
        self.policy = TD3Policy(actor, action_space, cfg.exploration_noise)
        device = next(critic.parameters()).device
        self.policy.to(device)
        self.actor, self.critic = actor, critic
        self.learned = _Learned(actor, critic)
        self.actor_target = copy.deepcopy(actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(critic).requires_grad_(False)
        groups = [
            {"params": list(critic.parameters()), "lr": cfg.critic_lr or cfg.lr},
            {"params": list(actor.parameters()), "lr": cfg.lr},
        ]
        self.optimizer = adam(groups, lr=cfg.lr)
        self.buffer = buffer if buffer is not None else ReplayBuffer(cfg.buffer_size, seed=seed, device=device)
        self.replay_keys = replay_keys(self.buffer)
        self.num_updates = 0

    def set_progress(self, step: int, total_steps: int) -> None:
        """Act uniformly at random until ``learning_starts`` env steps have been taken; read the noise afresh."""
        self.policy.random = step < self.config.learning_starts
        self.policy.noise = self.config.exploration_noise

    def _losses(self, mb: dict[str, torch.Tensor], actor_step: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(total loss, [critic loss, actor loss (0 without an actor step), mean Q])`` of one minibatch."""
        cfg = self.config
        obs, next_obs = mb["obs"], mb["next_obs"]
        with torch.no_grad():
            next_a = self.actor_target(next_obs)
            if cfg.target_noise > 0:
                noise = cfg.target_noise * torch.randn_like(next_a)
                next_a = smoothed_target_action(next_a, noise, cfg.target_noise_clip)
            y = td3_target(mb["reward"], self.critic_target(next_obs, next_a), mb["terminated"], cfg.gamma)
        q = self.critic(obs, self.policy.scale.to_unit(mb["action"]))
        critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
        if actor_step:
            with frozen(self.critic):
                actor_loss = deterministic_actor_loss(self.critic(obs, self.actor(obs)))
            total = critic_loss + actor_loss
        else:
            actor_loss = torch.zeros(())
            total = critic_loss
        return total, torch.stack([critic_loss, actor_loss, q.mean()]).detach()

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` steps are stored, take ``gradient_steps`` gradient steps."""
        cfg = self.config
        self.buffer.extend(batch.select(*self.replay_keys))
        if len(self.buffer) < max(cfg.learning_starts, 1):
            return {}
        self.optimizer.param_groups[0]["lr"] = cfg.critic_lr or cfg.lr
        self.optimizer.param_groups[1]["lr"] = cfg.lr
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        critic_sums, actor_sums, actor_steps = np.zeros(3), 0.0, 0
        for mb in minibatches_of_update(self.buffer, cfg.batch_size, cfg.gradient_steps):
            actor_step = (self.num_updates + 1) % cfg.policy_delay == 0
            total, stats = self._losses(mb, actor_step)
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
            values = clip_and_step(self.learned, self.optimizer, max_norm, sums=stats, name="td3 loss")
            critic_sums += (values[0], values[1], values[3])
            if actor_step:
                actor_sums += values[2]
                actor_steps += 1
                polyak(self.critic_target, self.critic, cfg.tau)
                polyak(self.actor_target, self.actor, cfg.tau)
            self.num_updates += 1
        mean = critic_sums / cfg.gradient_steps
        metrics = {"td3/grad_norm": mean[0], "loss/critic": mean[1], "td3/q_mean": mean[2]}
        if actor_steps:
            metrics["loss/actor"] = actor_sums / actor_steps
        return {k: float(v) for k, v in metrics.items()}

    def networks(self) -> dict[str, nn.Module]:
        """The actor (what acts) first, then the critics and the targets."""
        return {
            "actor": self.actor,
            "critic": self.critic,
            "q_target": self.critic_target,
            "actor_target": self.actor_target,
        }

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizer, replay buffer (with its RNG) and the update counter (it times the delayed steps)."""
        return {
            **{name: net.state_dict() for name, net in self.networks().items()},
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        for name, net in self.networks().items():
            net.load_state_dict(state[name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.num_updates = int(state["num_updates"])


def build_td3(config: TD3Config, envs: Any, model: Any, device: torch.device, seed: int) -> TD3:
    """TD3 (or DDPG, for a ``DDPGConfig``) sized from ``envs``' spaces with ``model``'s hidden sizes and activation;
    ``seed`` seeds the replay (hindsight replay with ``config.her``). Needs a bounded Box action space. With
    ``config.normalize_obs`` the networks take frozen observation statistics, which ``--warm-start.run`` loads."""
    obs_space, action_space = single_spaces(envs)
    dim = box_action_dim(action_space)
    ActionScale(action_space)  # refuses unbounded Boxes before anything is built
    hidden, activation = tuple(model.hidden), model.activation
    actor = DeterministicActor(obs_space, dim, hidden, activation)
    critic = QEnsemble(obs_space, dim, 2 if config.twin else 1, hidden, activation)
    if config.normalize_obs:  # the statistics of the TD3+BC run it continues, loaded with its weights
        frozen_obs_norm(obs_space, actor, critic)
    buffer = replay_for(config, envs, device, seed)
    return TD3(actor.to(device), critic.to(device), action_space, config, seed=seed, buffer=buffer)


def build_ddpg(config: DDPGConfig, envs: Any, model: Any, device: torch.device, seed: int) -> TD3:
    """DDPG: :func:`build_td3` with a ``DDPGConfig`` (one critic, no delay, no smoothing by default)."""
    return build_td3(config, envs, model, device, seed)
