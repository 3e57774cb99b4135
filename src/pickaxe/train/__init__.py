"""Training: the Trainer loop, evaluation, configs and builders.

Attributes load on first use, so importing the configs (``pickaxe.train.config``) does not import torch. Called,
``pickaxe.train(recipe_or_config, run_dir, **overrides)`` trains a run (``pickaxe.api.train``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pickaxe.lazy import lazy_getattr

_LAZY = {
    "CollectorConfig": "pickaxe.train.config",
    "EnvConfig": "pickaxe.train.config",
    "ModelConfig": "pickaxe.train.config",
    "TrainConfig": "pickaxe.train.config",
    "TrainerConfig": "pickaxe.train.config",
    "AgentConfig": "pickaxe.train.llm_config",
    "DataConfig": "pickaxe.train.llm_config",
    "EngineConfig": "pickaxe.train.llm_config",
    "LLMEvalConfig": "pickaxe.train.llm_config",
    "LLMTrainConfig": "pickaxe.train.llm_config",
    "LMConfig": "pickaxe.train.llm_config",
    "PreferenceConfig": "pickaxe.train.llm_config",
    "TextCollectorConfig": "pickaxe.train.llm_config",
    "WarmStartConfig": "pickaxe.train.llm_config",
    "FitResult": "pickaxe.train.trainer",
    "Trainer": "pickaxe.train.trainer",
    "evaluate": "pickaxe.train.evaluate",
}
__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from pickaxe.train.config import (  # noqa: F401
        CollectorConfig,
        EnvConfig,
        ModelConfig,
        TrainConfig,
        TrainerConfig,
    )
    from pickaxe.train.evaluate import evaluate  # noqa: F401
    from pickaxe.train.llm_config import (  # noqa: F401
        AgentConfig,
        DataConfig,
        EngineConfig,
        LLMEvalConfig,
        LLMTrainConfig,
        LMConfig,
        PreferenceConfig,
        TextCollectorConfig,
        WarmStartConfig,
    )
    from pickaxe.train.trainer import FitResult, Trainer  # noqa: F401


__getattr__ = lazy_getattr("pickaxe.train", _LAZY, globals())
