"""Environments: gymnasium vector envs (classic RL)."""

from pickaxe.envs.discretize import register as _register_discretized
from pickaxe.envs.goals import register as _register_goal_tasks
from pickaxe.envs.make import EnvError, SeededVectorEnv, check_env_id, make
from pickaxe.envs.memory import register as _register_memory_tasks

_register_memory_tasks()  # pickaxe/RepeatFirst-v0, pickaxe/CartPoleNoVel-v1
_register_discretized()  # pickaxe/Discretized-v0
_register_goal_tasks()  # pickaxe/PointGoal-v0

__all__ = ["EnvError", "SeededVectorEnv", "check_env_id", "make"]
