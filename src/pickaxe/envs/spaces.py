"""Automatic observation adaptation (as Stable-Baselines3 chooses from the spaces) and the checks of which spaces the
networks take, so every env a user names reaches the collector, the replay buffers and the networks as a Box.

Observations, adapted by ``pickaxe.envs.make`` with gymnasium's own wrappers:

- ``Box``: unchanged (a rank-3 uint8 Box is an image: the networks put the Nature CNN on it);
- ``Discrete``: one-hot; ``MultiDiscrete``: concatenated one-hots; ``MultiBinary``: the bits; ``Dict`` and ``Tuple``
  (of any of these, nested): every part flattened and concatenated in gymnasium's order (``Dict`` keys sorted).
  All of them go through ``FlattenObservation`` then ``DtypeObservation(float32)``. An image inside a Dict or Tuple
  is flattened too (its pixels, unscaled, feed the MLP): there is no per-key CNN.
- ``Text``, ``Graph``, ``Sequence``, ``OneOf`` (alone or inside a Dict/Tuple): refused, no network takes them.

Actions: PPO's ``ActorCritic`` takes ``Discrete`` (categorical), ``Box`` (Gaussian), ``MultiDiscrete`` (independent
categoricals) and ``MultiBinary`` (Bernoulli); value-based and continuous-control algorithms take fewer
(``ACTION_SPACES``).
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import DtypeObservation, FlattenObservation

from pickaxe.errors import PickaxeError


class SpaceError(PickaxeError, ValueError):
    """An env whose observation or action space no network takes, or an algorithm that cannot act in it."""


_FLAT_LEAVES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
ACTOR_CRITIC_ACTIONS = ("Discrete", "Box", "MultiDiscrete", "MultiBinary")
"""Action spaces ``ActorCritic`` (PPO and the other policy-gradient algorithms) takes."""
ACTION_SPACES: dict[str, tuple[str, ...]] = {
    "dqn": ("Discrete",),
    "ddpg": ("Box",),
    "td3": ("Box",),
    "sac": ("Box", "Discrete"),
    "bc": ("Box", "Discrete"),
    "td3-bc": ("Box",),
    "iql": ("Box", "Discrete"),
    "cql": ("Box", "Discrete"),
    "iql-online": ("Box", "Discrete"),
    "cql-online": ("Box", "Discrete"),
    "redq": ("Box",),
    "iqn": ("Discrete",),
    "fqf": ("Discrete",),
    "bdq": ("MultiDiscrete",),
    "bcq": ("Discrete",),
    "crr": ("Box", "Discrete"),
}
"""Algorithm name -> the action spaces it takes, where that is fewer than ``ACTOR_CRITIC_ACTIONS``."""
_ALTERNATIVES = {"Discrete": "ppo or dqn", "Box": "ppo or sac", "MultiDiscrete": "ppo", "MultiBinary": "ppo"}


def _unsupported_part(space: gym.Space) -> gym.Space | None:
    """The first part of ``space`` that cannot be flattened into a vector, or None."""
    if isinstance(space, _FLAT_LEAVES):
        return None
    if isinstance(space, spaces.Dict | spaces.Tuple):
        for part in space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces:
            bad = _unsupported_part(part)
            if bad is not None:
                return bad
        return None
    return space


def check_observation_space(space: gym.Space, env_id: str = "the env") -> None:
    """Raise ``SpaceError`` (one line naming the part and the fix) when no network can take ``space``."""
    bad = _unsupported_part(space)
    if bad is not None:
        where = "" if bad is space else f" (inside {type(space).__name__})"
        raise SpaceError(
            f"environment {env_id!r}: observations of space {type(bad).__name__}{where} cannot feed a network; fix: "
            "wrap the env to give Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple observations"
        )


def check_action_space(space: gym.Space, algo: str | None = None, env_id: str = "the env") -> None:
    """Raise ``SpaceError`` when no policy acts in ``space``, or when algorithm ``algo`` cannot."""
    kind = type(space).__name__
    if kind not in ACTOR_CRITIC_ACTIONS:
        raise SpaceError(
            f"environment {env_id!r}: actions of space {kind} are not supported; fix: wrap the env to take "
            f"{', '.join(ACTOR_CRITIC_ACTIONS)} actions"
        )
    takes = ACTION_SPACES.get(algo or "", ACTOR_CRITIC_ACTIONS)
    if kind not in takes:
        raise SpaceError(
            f"{algo} takes {' or '.join(takes)} actions, environment {env_id!r} has {kind} actions; fix: train it with "
            f"a {_ALTERNATIVES[kind]} recipe (`pickaxe recipes`)"
        )


def needs_flattening(space: gym.Space) -> bool:
    """Whether ``space`` must be flattened to a Box before a network sees it."""
    return not isinstance(space, spaces.Box)


def adapt_observations(env: gym.Env) -> gym.Env:
    """``env`` with observations a network takes: a Box as it is, any other space flattened to float32 (one-hot
    for the discrete kinds) with ``FlattenObservation``; an unsupported space raises ``SpaceError``."""
    space = env.observation_space
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    check_observation_space(space, env_id)
    if not needs_flattening(space):
        return env
    with warnings.catch_warnings():  # float64 bounds (of a Dict's parts) cast to float32: expected, not news
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        return DtypeObservation(FlattenObservation(env), np.float32)
