"""``build_llm_run``: the builder of every LLM run, chosen by the type of ``cfg.algo`` (what ``pickaxe train`` calls
for a config of kind ``llm``)."""

from __future__ import annotations

from typing import Any

from pickaxe.algos.configs import DPOConfig, RewardModelConfig
from pickaxe.runs.run import Run
from pickaxe.train.best_of_n import build_best_of_n
from pickaxe.train.llm import build_llm_trainer
from pickaxe.train.llm_config import BestOfNConfig, LLMTrainConfig
from pickaxe.train.preference_runs import build_dpo_trainer, build_reward_model_trainer

__all__ = ["build_llm_run"]


def build_llm_run(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> Any:
    """Reward model, DPO, best-of-n, or (SFT and the on-policy methods) :func:`build_llm_trainer`."""
    if isinstance(cfg.algo, RewardModelConfig):
        return build_reward_model_trainer(cfg, run, progress)
    if isinstance(cfg.algo, DPOConfig):
        return build_dpo_trainer(cfg, run, progress)
    if isinstance(cfg.algo, BestOfNConfig):
        return build_best_of_n(cfg, run, progress)
    return build_llm_trainer(cfg, run, progress)
