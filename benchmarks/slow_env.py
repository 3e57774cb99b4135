"""``SlowCartPole-v1``: CartPole that burns ``ms`` milliseconds of CPU per step, standing in for an env whose step
costs real compute (a simulator). Used by ``benchmarks/dist.py`` as ``slow_env:SlowCartPole-v1``."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class BusyStep(gym.Wrapper):
    """Spins for ``ms`` milliseconds in every ``step`` (busy, not sleeping: it holds a core like a simulator)."""

    def __init__(self, env: gym.Env, ms: float = 1.0) -> None:
        super().__init__(env)
        self.seconds = ms / 1000.0

    def step(self, action: Any) -> Any:
        """Burn the CPU time, then step the wrapped env."""
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


def make_slow(ms: float = 1.0, **kwargs: Any) -> gym.Env:
    """CartPole-v1 behind ``BusyStep``."""
    return BusyStep(gym.make("CartPole-v1", **kwargs), ms)


if "SlowCartPole-v1" not in gym.registry:
    gym.register("SlowCartPole-v1", entry_point=make_slow)
