"""Training: the Trainer loop, evaluation, configs and builders."""

from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.train.trainer import FitResult, Trainer

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
