"""Named LLM configs (``LLM_RECIPES``): SFT and GRPO on the built-in verifiable tasks with a tiny model.

Each runs on 2 CPU cores in minutes; ``--model.path DIR`` swaps in any local transformers causal LM.
"""

from __future__ import annotations

from pickaxe.algos.configs import GRPOConfig, SFTConfig
from pickaxe.recipes import Recipe
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm_config import (
    EngineConfig,
    LLMEvalConfig,
    LLMTrainConfig,
    LMConfig,
    TaskConfig,
    TextCollectorConfig,
    WarmStartConfig,
)


def _tiny() -> LMConfig:
    """The tiny model of the recipes: Qwen2-style, 4 layers of width 128 (about 0.8M parameters)."""
    return LMConfig(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=512, max_positions=64)


def _arith_sft() -> LLMTrainConfig:
    return LLMTrainConfig(
        recipe="arith-sft",
        algo=SFTConfig(lr=3e-3, micro_batch_size=128),
        model=_tiny(),
        task=TaskConfig(name="addition", digits=2),
        engine=EngineConfig(max_new_tokens=5),
        collector=TextCollectorConfig(prompts=128),
        eval=LLMEvalConfig(prompts=500, samples=8, pass_k=8),
        trainer=TrainerConfig(total_steps=128 * 800, eval_every=128 * 200),
    )


def _arith_grpo() -> LLMTrainConfig:
    # SFT on addition learns in a sharp transition (held-out accuracy ~0.1 -> ~0.7 within ~200 updates) whose
    # position moves by hundreds of updates with the seed or the CPU's float rounding, so a fixed number of
    # updates lands before it on one machine and after it on another. The warm start therefore stops at a token
    # NLL, a stage of learning, not at an update count: in the transition, where the model can often sample the
    # right sum but does not reliably say it greedily, which GRPO fixes.
    return LLMTrainConfig(
        recipe="arith-grpo",
        algo=GRPOConfig(lr=1e-4, micro_batch_size=256, kl_coef=0.005, kl_estimator="k3"),
        model=_tiny(),
        task=TaskConfig(name="addition", digits=2),
        engine=EngineConfig(max_new_tokens=5, temperature=1.0),
        collector=TextCollectorConfig(prompts=32, group_size=8),
        eval=LLMEvalConfig(prompts=500, samples=8, pass_k=8),
        warm_start=WarmStartConfig(updates=4000, target_nll=0.4, lr=3e-3, batch_size=128, log_every=100),
        trainer=TrainerConfig(total_steps=256 * 100, eval_every=256 * 50),
    )


def _reverse_grpo() -> LLMTrainConfig:
    return LLMTrainConfig(
        recipe="reverse-grpo",
        algo=GRPOConfig(lr=1e-4, micro_batch_size=256, kl_coef=0.005),
        model=_tiny(),
        task=TaskConfig(name="reverse", min_len=3, max_len=6),
        engine=EngineConfig(max_new_tokens=7, temperature=1.0),
        collector=TextCollectorConfig(prompts=32, group_size=8),
        eval=LLMEvalConfig(prompts=500, samples=8, pass_k=8),
        warm_start=WarmStartConfig(updates=70, lr=3e-3, batch_size=128, log_every=10),
        trainer=TrainerConfig(total_steps=256 * 100, eval_every=256 * 50),
    )


LLM_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("arith-sft", "SFT of a tiny Qwen2-style LM on 2-digit addition (held-out accuracy, pass@k)", _arith_sft),
        Recipe(
            "arith-grpo",
            "SFT warm start, then GRPO on 2-digit addition; held-out accuracy before/after with 95% CIs",
            _arith_grpo,
        ),
        Recipe("reverse-grpo", "SFT warm start, then GRPO on digit-string reversal", _reverse_grpo),
    )
}
