"""Algorithms: one file each, sharing loss pieces from ``core``; their configs live torch-free in ``configs``.

Attributes load on first use, so importing ``pickaxe.algos.configs`` does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pickaxe.lazy import lazy_getattr

_LAZY = {
    "Algorithm": "pickaxe.algos.base",
    "DQN": "pickaxe.algos.dqn",
    "GRPO": "pickaxe.algos.grpo",
    "LLMPPO": "pickaxe.algos.llm_ppo",
    "PPO": "pickaxe.algos.ppo",
    "SFT": "pickaxe.algos.sft",
    "DPOConfig": "pickaxe.algos.configs",
    "DQNConfig": "pickaxe.algos.configs",
    "GRPOConfig": "pickaxe.algos.configs",
    "LLMPPOConfig": "pickaxe.algos.configs",
    "PPOConfig": "pickaxe.algos.configs",
    "RewardModelConfig": "pickaxe.algos.configs",
    "SFTConfig": "pickaxe.algos.configs",
}
__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from pickaxe.algos.base import Algorithm  # noqa: F401
    from pickaxe.algos.configs import (  # noqa: F401
        DPOConfig,
        DQNConfig,
        GRPOConfig,
        LLMPPOConfig,
        PPOConfig,
        RewardModelConfig,
        SFTConfig,
    )
    from pickaxe.algos.dqn import DQN  # noqa: F401
    from pickaxe.algos.grpo import GRPO  # noqa: F401
    from pickaxe.algos.ppo import PPO  # noqa: F401
    from pickaxe.algos.sft import SFT  # noqa: F401


__getattr__ = lazy_getattr("pickaxe.algos", _LAZY, globals())
