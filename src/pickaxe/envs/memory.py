"""Tasks that need memory, registered as gymnasium ids when ``pickaxe.envs`` is imported.

- ``pickaxe/RepeatFirst-v0``: the first observation shows one of ``cues`` one-hot cues; ``delay`` blank steps
  follow, then a query step (the last input flag set) where the action must name the cue: +1 if right, -1 if
  wrong, 0 on every other step. A policy without memory scores 0 in expectation (it cannot tell the cues apart at
  the query); one that remembers scores 1.
- ``pickaxe/CartPoleNoVel-v1``: CartPole-v1 with the velocities masked out (observations: cart position and pole
  angle), so balancing needs velocities estimated from past observations.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class RepeatFirstEnv(gym.Env):
    """Remember the first observation's cue for ``delay`` steps, then repeat it (see the module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, delay: int = 4, cues: int = 2) -> None:
        if delay < 0 or cues < 2:
            raise ValueError(f"RepeatFirst needs delay >= 0 and cues >= 2, got delay={delay}, cues={cues}")
        self.delay, self.cues = delay, cues
        self.observation_space = gym.spaces.Box(0.0, 1.0, (cues + 1,), np.float32)
        self.action_space = gym.spaces.Discrete(cues)
        self.cue = 0
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.cues + 1, dtype=np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        if self.t == self.delay:
            obs[-1] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Draw a new cue and show it."""
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.cues))
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Advance one step; the step at ``delay`` (the query) scores the action and ends the episode."""
        if self.t == self.delay:
            reward = 1.0 if int(action) == self.cue else -1.0
            self.t += 1
            return np.zeros(self.cues + 1, dtype=np.float32), reward, True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}


class MaskVelocity(gym.ObservationWrapper):
    """CartPole's observation without the velocities: ``[x, theta]``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        high = np.array([4.8, 0.42], dtype=np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Keep cart position and pole angle."""
        return np.asarray(observation, dtype=np.float32)[[0, 2]]


def masked_cartpole(**kwargs: Any) -> gym.Env:
    """CartPole (gymnasium's dynamics) with the velocities masked out."""
    return MaskVelocity(CartPoleEnv(**kwargs))


def register() -> None:
    """Register the memory tasks' ids (idempotent)."""
    if "pickaxe/RepeatFirst-v0" not in gym.registry:
        gym.register("pickaxe/RepeatFirst-v0", entry_point=RepeatFirstEnv)
    if "pickaxe/CartPoleNoVel-v1" not in gym.registry:
        gym.register(
            "pickaxe/CartPoleNoVel-v1", entry_point=masked_cartpole, max_episode_steps=500, reward_threshold=475.0
        )


register()
