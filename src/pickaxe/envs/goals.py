"""A tiny goal-conditioned task, registered as ``pickaxe/PointGoal-v0`` when ``pickaxe.envs`` is imported.

A point on the plane ``[-1, 1]^2`` moves by ``step_size * action`` (actions in ``[-1, 1]^2``) towards a goal drawn
uniformly at every reset; it has the interface of gymnasium-robotics' ``GoalEnv`` (``observation``,
``achieved_goal`` (the point), ``desired_goal`` in a Dict; a vectorised ``compute_reward`` and
``compute_terminated``) and Fetch's sparse reward: 0 within ``distance_threshold`` of the goal, -1 elsewhere, and
``info["is_success"]``. Episodes end by time (30 steps), or with ``terminate_on_success`` on reaching the goal.
A random policy rarely ends on the goal; hindsight replay learns it in a few thousand steps. Its state is a handful
of plain attributes, so checkpoints capture it exactly (``pickaxe.envs.state``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

POINT_GOAL_ID = "pickaxe/PointGoal-v0"


class PointGoalEnv(gym.Env):
    """Reach a goal on the plane (see the module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self, step_size: float = 0.1, distance_threshold: float = 0.1, terminate_on_success: bool = False
    ) -> None:
        if not (0 < step_size <= 2 and 0 < distance_threshold <= 2):
            raise ValueError(
                f"PointGoal needs 0 < step_size <= 2 and 0 < distance_threshold <= 2, got {step_size}, "
                f"{distance_threshold}"
            )
        self.step_size, self.distance_threshold = step_size, distance_threshold
        self.terminate_on_success = terminate_on_success
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.position = np.zeros(2, dtype=np.float32)
        self.goal = np.zeros(2, dtype=np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            "observation": self.position.copy(),
            "achieved_goal": self.position.copy(),
            "desired_goal": self.goal.copy(),
        }

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 where the achieved goal is within ``distance_threshold`` of the desired one, else -1 (vectorised over
        leading axes)."""
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > self.distance_threshold).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """With ``terminate_on_success``, whether the goal is reached; else never (vectorised)."""
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return (distance <= self.distance_threshold) & self.terminate_on_success

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Draw a start and a goal uniformly on the plane."""
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self._obs(), {"is_success": False}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Move; reward, termination and success from the goal functions."""
        move = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0) * self.step_size
        self.position = np.clip(self.position + move, -1.0, 1.0).astype(np.float32)
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        terminated = bool(self.compute_terminated(obs["achieved_goal"], obs["desired_goal"], {}))
        return obs, reward, terminated, False, {"is_success": reward == 0.0}


def register() -> None:
    """Register ``pickaxe/PointGoal-v0`` (idempotent)."""
    if POINT_GOAL_ID not in gym.registry:
        gym.register(POINT_GOAL_ID, entry_point=PointGoalEnv, max_episode_steps=30)
