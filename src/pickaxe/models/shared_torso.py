"""An actor-critic whose actor and critic share one torso (``--model.shared``), built by composition on
``ActorCritic``: its ``torso`` (the first stage both heads read) becomes the encoder plus the hidden layers, and the
actor and critic become linear heads on the torso's features."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
from torch import nn

from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.encoders import encoder_for
from pickaxe.models.mlp import ACTIVATIONS, single_spaces


def shared_actor_critic(
    envs: gym.vector.VectorEnv | gym.Env, hidden: Sequence[int] = (64, 64), activation: str = "tanh"
) -> ActorCritic:
    """An ``ActorCritic`` for ``envs``' spaces with one shared torso (encoder, then ``hidden`` layers with
    orthogonal init) under a linear actor head (gain 0.01) and a linear critic head (gain 1)."""
    obs_space, act_space = single_spaces(envs)
    encoder, features = encoder_for(obs_space)
    layers: list[nn.Module] = [encoder]
    for size in hidden:
        layer = nn.Linear(features, size)
        nn.init.orthogonal_(layer.weight, math.sqrt(2))
        nn.init.zeros_(layer.bias)
        layers += [layer, ACTIVATIONS[activation]()]
        features = size
    policy = ActorCritic(features, act_space, hidden=(), activation=activation)
    policy.torso = nn.Sequential(*layers)
    return policy
