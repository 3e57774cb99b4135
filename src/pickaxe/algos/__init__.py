"""Algorithms: one file each, sharing loss pieces from ``core``."""

from pickaxe.algos.base import Algorithm
from pickaxe.algos.dqn import DQN, DQNConfig
from pickaxe.algos.ppo import PPO, PPOConfig

__all__ = ["DQN", "PPO", "Algorithm", "DQNConfig", "PPOConfig"]
