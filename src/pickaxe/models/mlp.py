"""Multi-layer perceptrons and space helpers shared by the classic-RL models."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU}


def mlp(
    in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh", out_gain: float = 1.0
) -> nn.Sequential:
    """An MLP with orthogonal init (gain sqrt(2) on hidden layers, ``out_gain`` on the output, zero biases)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in itertools.pairwise(dims):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(dims[-1], out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def obs_dim(space: gym.Space) -> int:
    """Flat size of a Box observation space; other spaces are refused with a clear message."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(
        f"MLP models take Box observations, got {space}; make the envs with pickaxe.envs.make (it flattens other "
        "spaces) or wrap the env in gymnasium.wrappers.FlattenObservation"
    )


def single_spaces(envs: gym.vector.VectorEnv | gym.Env) -> tuple[gym.Space, gym.Space]:
    """``(observation_space, action_space)`` of one sub-environment."""
    if isinstance(envs, gym.vector.VectorEnv):
        return envs.single_observation_space, envs.single_action_space
    return envs.observation_space, envs.action_space
