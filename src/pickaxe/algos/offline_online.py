"""Offline algorithms trained online: IQL and CQL learning from a replay buffer that the collector fills.

This is what offline-to-online fine-tuning continues with (``pickaxe train pendulum-iql-online --warm-start.run
DIR``): the offline algorithm itself, unchanged losses and networks, its minibatches drawn from a replay buffer
instead of a dataset pass. The warm start (``train/online_start.py``) loads the offline run's whole training state
(networks, optimizer moments, CQL's temperature) and puts the offline dataset in the replay before the first env
step, as the IQL paper's fine-tuning and CQL's in Cal-QL (Nakamoto et al. 2023) do.

``ReplayTrained`` wraps the offline algorithm (``inner``): its ``update`` stores each collected batch, then takes
``gradient_steps`` of ``inner``'s gradient steps on uniform replay minibatches (``OfflineAlgorithm.learn``). Its
``networks()`` are ``inner``'s, under the offline run's names, so an offline run's model loads into it whole.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from pickaxe.algos.base import Algorithm
from pickaxe.algos.cql import build_cql
from pickaxe.algos.iql import build_iql
from pickaxe.algos.offline import OfflineAlgorithm
from pickaxe.algos.offline_configs import CQLOnlineConfig, IQLOnlineConfig
from pickaxe.algos.sac import REPLAY_KEYS, minibatches_of_update
from pickaxe.data.batch import Batch
from pickaxe.data.buffers import ReplayBuffer
from pickaxe.models.mlp import single_spaces


class EpsilonExplore:
    """A Discrete policy with a uniformly random action (torch's RNG) with probability ``epsilon`` in place of the
    wrapped policy's, when not deterministic; deterministic actions are the wrapped policy's."""

    def __init__(self, policy: Any, n_actions: int, epsilon: float) -> None:
        self.policy, self.n, self.epsilon = policy, n_actions, epsilon

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The wrapped policy's actions, some replaced by random ones; no extras."""
        action, extras = self.policy.act(obs, deterministic)
        if deterministic or self.epsilon <= 0.0:
            return action, extras
        explore = torch.rand(action.shape, device=action.device) < self.epsilon
        return torch.where(explore, torch.randint(self.n, action.shape, device=action.device), action), extras


class ReplayTrained(Algorithm):
    """An ``OfflineAlgorithm`` trained online: each collected batch goes into a uniform replay buffer, then
    ``gradient_steps`` gradient steps of the offline algorithm on replay minibatches of ``batch_size``."""

    def __init__(self, inner: OfflineAlgorithm, action_space: gym.Space, seed: int, device: torch.device) -> None:
        self.inner = inner
        self.config = inner.config  # one object: a live change reaches the offline algorithm's losses too
        self.policy: Any = inner.policy
        self.explore = None
        if isinstance(action_space, gym.spaces.Discrete):
            self.explore = self.policy = EpsilonExplore(inner.policy, int(action_space.n), 0.0)
        self.buffer = ReplayBuffer(self.config.buffer_size, seed=seed, device=device)

    def set_progress(self, step: int, total_steps: int) -> None:
        """Read the exploration rate afresh."""
        if self.explore is not None:
            self.explore.epsilon = self.config.exploration_epsilon

    def update(self, batch: Batch) -> dict[str, float]:
        """Store ``batch``; once ``learning_starts`` transitions are stored, take ``gradient_steps`` gradient
        steps on uniform replay minibatches."""
        cfg = self.config
        self.buffer.extend(batch.select(*REPLAY_KEYS))
        if len(self.buffer) < max(cfg.learning_starts, 1):
            return {}
        return self.inner.learn(minibatches_of_update(self.buffer, cfg.batch_size, cfg.gradient_steps))

    def load_offline_state(self, state: dict[str, Any]) -> None:
        """Continue the offline run whose algorithm state (a checkpoint's ``algo``) is ``state``: its networks,
        optimizer moments, temperature and update count."""
        self.inner.load_state_dict(state)

    def networks(self) -> dict[str, nn.Module]:
        """The offline algorithm's networks, under its names."""
        return self.inner.networks()

    def state_dict(self) -> dict[str, Any]:
        """The offline algorithm's state and the replay buffer (with its RNG)."""
        return {**self.inner.state_dict(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.inner.load_state_dict(state)
        self.buffer.load_state_dict(state["buffer"])


def build_iql_online(config: IQLOnlineConfig, envs: Any, model: Any, device: torch.device, seed: int) -> ReplayTrained:
    """IQL (``build_iql``'s networks) trained online; ``seed`` seeds the replay."""
    return ReplayTrained(build_iql(config, envs, model, device, seed), single_spaces(envs)[1], seed, device)


def build_cql_online(config: CQLOnlineConfig, envs: Any, model: Any, device: torch.device, seed: int) -> ReplayTrained:
    """CQL (``build_cql``'s networks: on SAC for Box actions, on DQN for Discrete) trained online; ``seed`` seeds the
    replay."""
    return ReplayTrained(build_cql(config, envs, model, device, seed), single_spaces(envs)[1], seed, device)
