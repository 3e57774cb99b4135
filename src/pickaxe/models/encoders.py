"""Observation encoders: the first stage of every classic-RL network, chosen from the observation space.

A flat (or flattenable) Box goes through as a float vector; an image Box (rank 3, uint8) goes through the Nature
CNN; a goal observation (``GoalBox``: ``[observation, desired_goal, achieved_goal]``) goes through as its
observation and desired goal, the achieved goal left out. Every network (actor-critic, Q-network, continuous-control
actors and critics) puts its MLP on top of ``encoder_for(space)``, so a new kind of observation is taught once, here.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.envs.spaces import GoalBox
from pickaxe.models.mlp import hooked


def is_image_space(space: gym.Space) -> bool:
    """Whether ``space`` holds images: a rank-3 uint8 Box, channels first or last."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image shape is ``H, W, C`` (the last axis is the smallest) rather than ``C, H, W``."""
    return shape[-1] < shape[0] and shape[-1] <= 16


class FlatEncoder(nn.Module):
    """A vector observation as float32, flattened to ``[B, features]``."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, *shape]`` -> ``[B, features]`` float32."""
        return obs.flatten(1).float()


def encode(encoder: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """``encoder(obs)``, where a hook-free ``FlatEncoder`` given a batch that is already ``[B, features]`` float32
    returns the batch itself without a module call (what its forward returns there: flatten and float are the
    identity). A learner calls a Q-network several times a step, and the call costs more than the identity."""
    if type(encoder) is FlatEncoder and obs.dim() == 2 and obs.dtype == torch.float32 and not hooked(encoder):
        return obs
    return encoder(obs)


class GoalEncoder(nn.Module):
    """A flat goal observation's leading ``features`` (the observation and the desired goal) as float32."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, observation + 2 goal]`` -> ``[B, observation + goal]`` float32."""
        return obs[:, : self.features].float()


class NatureCNN(nn.Module):
    """The DQN paper's convolutional torso (Mnih et al. 2015): three conv layers and a 512-unit linear layer, on
    uint8 images scaled to [0, 1]; channels-last inputs are transposed."""

    def __init__(self, shape: tuple[int, ...], features: int = 512) -> None:
        super().__init__()
        self.channels_last = channels_last(shape)
        c, h, w = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.head = nn.Sequential(nn.Linear(n, features), nn.ReLU())
        self.features = features
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.orthogonal_(m.weight, np.sqrt(2))
                nn.init.zeros_(m.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` (or ``[B, H, W, C]``) uint8 -> ``[B, features]``."""
        x = obs.permute(0, 3, 1, 2) if self.channels_last else obs
        return self.head(self.conv(x.float() / 255.0))


def encoder_for(space: gym.Space) -> tuple[nn.Module, int]:
    """``(encoder, features)`` for observations of ``space``: the Nature CNN for images, the observation and desired
    goal of a ``GoalBox``, else the flattened Box.

    Non-Box spaces (Discrete, MultiDiscrete, MultiBinary, Dict, Tuple) are flattened to a Box by ``pickaxe.envs.make``
    before they reach a network; handing one in here directly is refused with the fix."""
    if is_image_space(space):
        cnn = NatureCNN(tuple(space.shape))
        return cnn, cnn.features
    if isinstance(space, GoalBox):
        n = space.policy_features
        return GoalEncoder(n), n
    if isinstance(space, gym.spaces.Box):
        n = int(np.prod(space.shape))
        return FlatEncoder(n), n
    raise ValueError(
        f"networks take Box observations, got {space}; make the envs with pickaxe.envs.make (it flattens other "
        "spaces) or wrap the env in gymnasium.wrappers.FlattenObservation"
    )
