"""Automatic observation adaptation (as Stable-Baselines3 chooses from the spaces) and the checks of which spaces the
networks take, so every env a user names reaches the collector, the replay buffers and the networks as a Box.

Observations, adapted by ``pickaxe.envs.make`` with gymnasium's own wrappers:

- ``Box``: unchanged (a rank-3 uint8 Box is an image: the networks put the Nature CNN on it);
- a goal ``Dict`` (exactly ``observation``, ``achieved_goal`` and ``desired_goal``, Boxes of rank 1, the two goals
  of one shape: gymnasium-robotics' ``GoalEnv``): ``GoalObservation`` makes it the float32 ``GoalBox``
  ``[observation, desired_goal, achieved_goal]``; the networks read the observation and the desired goal, the
  hindsight replay (``pickaxe.data.hindsight``) reads and rewrites the goals;
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
    "gail": ("Box", "Discrete"),
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


GOAL_KEYS = ("observation", "desired_goal", "achieved_goal")
"""The parts of a goal-conditioned observation, in the order ``GoalObservation`` lays them out."""


def goal_sizes(space: gym.Space) -> tuple[int, int] | None:
    """``(observation features, goal features)`` of a goal ``Dict`` observation space (see the module docstring), or
    None for any other space."""
    if not isinstance(space, spaces.Dict) or set(space.spaces) != set(GOAL_KEYS):
        return None
    parts = [space.spaces[k] for k in GOAL_KEYS]
    if not all(isinstance(p, spaces.Box) and len(p.shape) == 1 for p in parts):
        return None
    if parts[1].shape != parts[2].shape:
        return None
    return int(parts[0].shape[0]), int(parts[1].shape[0])


class GoalBox(spaces.Box):
    """A flat goal observation ``[observation, desired_goal, achieved_goal]`` (float32): ``observation`` features,
    then ``goal`` features of each goal (``pickaxe.data.hindsight.GoalLayout`` in the replay)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, observation: int, goal: int) -> None:
        super().__init__(low, high, dtype=np.float32)
        self.observation, self.goal = observation, goal

    @property
    def policy_features(self) -> int:
        """What the networks read: the observation and the desired goal (the leading features)."""
        return self.observation + self.goal

    def __repr__(self) -> str:
        return f"GoalBox(observation={self.observation}, goal={self.goal})"


class GoalObservation(gym.ObservationWrapper):
    """A goal ``Dict`` observation as one float32 vector ``[observation, desired_goal, achieved_goal]``
    (``GoalBox``); the env's ``compute_reward`` is reached through ``unwrapped`` as before."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        sizes = goal_sizes(env.observation_space)
        if sizes is None:
            raise SpaceError(f"GoalObservation needs a Dict of {', '.join(GOAL_KEYS)}, got {env.observation_space}")
        parts = [env.observation_space[k] for k in GOAL_KEYS]
        with warnings.catch_warnings():  # float64 bounds cast to float32: expected
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
            low = np.concatenate([p.low for p in parts]).astype(np.float32)
            high = np.concatenate([p.high for p in parts]).astype(np.float32)
        self.observation_space = GoalBox(low, high, *sizes)

    def observation(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        """The three parts concatenated, as float32."""
        return goal_vector(observation)


def goal_vector(observation: dict[str, np.ndarray]) -> np.ndarray:
    """One goal Dict observation as ``GoalObservation`` lays it out: ``[observation, desired_goal, achieved_goal]``,
    float32."""
    return np.concatenate([np.asarray(observation[k], dtype=np.float32).reshape(-1) for k in GOAL_KEYS])


def needs_flattening(space: gym.Space) -> bool:
    """Whether ``space`` must be flattened to a Box before a network sees it."""
    return not isinstance(space, spaces.Box)


def adapt_observations(env: gym.Env) -> gym.Env:
    """``env`` with observations a network takes: a Box as it is, a goal Dict as a ``GoalBox``
    (``GoalObservation``), any other space flattened to float32 (one-hot for the discrete kinds) with
    ``FlattenObservation``; an unsupported space raises ``SpaceError``."""
    space = env.observation_space
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    check_observation_space(space, env_id)
    if goal_sizes(space) is not None:
        return GoalObservation(env)
    if not needs_flattening(space):
        return env
    with warnings.catch_warnings():  # float64 bounds (of a Dict's parts) cast to float32: expected, not news
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        return DtypeObservation(FlattenObservation(env), np.float32)
