"""Continuous-control tasks with MultiDiscrete actions, for the algorithms that act in factored discrete spaces
(branching DQN): ``pickaxe/Discretized-v0`` is any env with a bounded Box action space, each action dimension cut into
``bins`` evenly spaced values (``--env.kwargs '{"task": "Reacher-v5", "bins": 11}'``; Pendulum-v1 by default)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class DiscretizeActions(gym.ActionWrapper):
    """A bounded Box action space as ``MultiDiscrete([bins] * dims)``: sub-action ``k`` of dimension ``d`` is
    ``low_d + k (high_d - low_d) / (bins - 1)``."""

    def __init__(self, env: gym.Env, bins: int = 11) -> None:
        super().__init__(env)
        box = env.action_space
        if not isinstance(box, gym.spaces.Box) or not (np.isfinite(box.low).all() and np.isfinite(box.high).all()):
            raise ValueError(f"DiscretizeActions needs a bounded Box action space, got {box}")
        if bins < 2:
            raise ValueError(f"DiscretizeActions needs at least 2 bins per dimension, got {bins}")
        self.box_shape = tuple(box.shape)
        self.box_dtype = box.dtype
        low, high = box.low.reshape(-1).astype(np.float64), box.high.reshape(-1).astype(np.float64)
        self.values = np.linspace(low, high, bins, axis=-1)  # [dims, bins]
        self.action_space = gym.spaces.MultiDiscrete(np.full(low.shape, bins, dtype=np.int64))

    def action(self, action: Any) -> np.ndarray:
        """Bin indices ``[dims]`` -> the Box action they stand for."""
        index = np.asarray(action, dtype=np.int64).reshape(-1)
        chosen = self.values[np.arange(index.size), index]
        return chosen.reshape(self.box_shape).astype(self.box_dtype)


def discretized(task: str = "Pendulum-v1", bins: int = 11, **kwargs: Any) -> gym.Env:
    """Env id ``task`` (made with ``kwargs``) with its Box actions cut into ``bins`` values per dimension."""
    return DiscretizeActions(gym.make(task, **kwargs), bins)


def register() -> None:
    """Register ``pickaxe/Discretized-v0`` (idempotent)."""
    if "pickaxe/Discretized-v0" not in gym.registry:
        gym.register("pickaxe/Discretized-v0", entry_point=discretized)
