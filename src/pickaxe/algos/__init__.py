"""Algorithms: one file each, sharing loss pieces from ``core``."""

from pickaxe.algos.base import Algorithm
from pickaxe.algos.dqn import DQN, DQNConfig
from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.ppo import PPO, PPOConfig
from pickaxe.algos.sft import SFT, SFTConfig

__all__ = ["DQN", "GRPO", "PPO", "SFT", "Algorithm", "DQNConfig", "GRPOConfig", "PPOConfig", "SFTConfig"]
