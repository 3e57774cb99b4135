"""Environments: gymnasium vector envs (classic RL)."""

from pickaxe.envs.make import EnvError, SeededVectorEnv, check_env_id, make

__all__ = ["EnvError", "SeededVectorEnv", "check_env_id", "make"]
