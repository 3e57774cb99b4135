"""Training: the Trainer loop, evaluation, configs and builders."""

from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.train.trainer import FitResult, Trainer, TrainerConfig

__all__ = [
    "CollectorConfig",
    "EnvConfig",
    "FitResult",
    "ModelConfig",
    "TrainConfig",
    "Trainer",
    "TrainerConfig",
    "evaluate",
]
