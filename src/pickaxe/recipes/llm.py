"""Named LLM configs (``LLM_RECIPES``): SFT and GRPO on the built-in verifiable tasks with a tiny model, and the
RLHF stages on the synthetic sorting task (``synthetic-*``), whose preferences come from a hidden gold scorer.

Each runs on 2 CPU cores in minutes; ``--model.path DIR`` swaps in any local transformers causal LM.
"""

from __future__ import annotations

from pickaxe.algos.configs import DPOConfig, GRPOConfig, LLMPPOConfig, RewardModelConfig, SFTConfig
from pickaxe.recipes.recipe import Recipe
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm_config import (
    AgentConfig,
    BestOfNConfig,
    DataConfig,
    EngineConfig,
    LLMEvalConfig,
    LLMTrainConfig,
    LMConfig,
    PreferenceConfig,
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


def _calc_agent_grpo() -> LLMTrainConfig:
    # 3-digit products, which the tiny model cannot compute in its head. The warm start shows it episodes that
    # call the calculator and then say its result. The JSON around a call is learned within ~100 updates; copying
    # the expression into the call and the result out of it comes later, in a sharp transition whose position
    # moves with the seed, so the warm start stops at a token NLL inside it (as arith-grpo's does): the model then
    # often, not reliably, copies right, and GRPO raises accuracy and well-formed tool use (the tool_use term,
    # weighted 0.25, pays an episode whose calls all parse).
    return LLMTrainConfig(
        recipe="calc-agent-grpo",
        algo=GRPOConfig(lr=3e-4, micro_batch_size=256, kl_coef=0.005, kl_estimator="k3"),
        model=LMConfig(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=256, max_positions=192),
        task=TaskConfig(name="multiplication", digits=3),
        engine=EngineConfig(max_new_tokens=96, temperature=1.0),
        collector=TextCollectorConfig(prompts=32, group_size=8),
        eval=LLMEvalConfig(prompts=256, samples=4, pass_k=4),
        agent=AgentConfig(
            tools=("calculator",),
            max_turns=3,
            max_tokens=192,
            describe_tools=False,
            demo="calculator",
            format_weight=0.25,
        ),
        warm_start=WarmStartConfig(updates=1500, target_nll=0.06, lr=3e-3, batch_size=32, log_every=50),
        trainer=TrainerConfig(total_steps=256 * 60, eval_every=256 * 20),
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


# The synthetic RLHF task: sort 3-5 digits. The SFT stage stops early (held-out exact match about 0.43), so
# the policy's samples vary in quality; the hidden gold score (sort-quality: sortedness x digit F1) labels pairs of
# them, a proxy reward model learns from those pairs, and the RL stages optimise the proxy while gold is logged.
# Standalone, each stage warm-starts its own SFT model; `pickaxe pipeline rlhf-synthetic` chains them instead
# (--model.path and --data.reward-model point at the previous stages' exports, --warm-start.updates 0).
# Each recipe gets fresh section objects (a caller may change its config in place).
SORT_SFT_UPDATES = 60


def _synthetic(recipe: str, algo: object, **sections: object) -> LLMTrainConfig:
    """A synthetic-task config: the tiny model, digit sorting, the gold score, 7 new tokens, 256 held-out prompts
    with 4 samples each and (unless ``warm_start`` is given) the short SFT warm start; ``sections`` set the rest."""
    return LLMTrainConfig(
        recipe=recipe,
        algo=algo,
        model=_tiny(),
        task=TaskConfig(name="sort", min_len=3, max_len=5, heldout_fraction=0.2),
        data=DataConfig(gold="sort-quality"),
        engine=EngineConfig(max_new_tokens=7, temperature=1.0),
        eval=LLMEvalConfig(prompts=256, samples=4, pass_k=4),
        **{"warm_start": WarmStartConfig(updates=SORT_SFT_UPDATES, lr=3e-3, batch_size=64, log_every=20), **sections},
    )


def _pairs() -> PreferenceConfig:
    return PreferenceConfig(prompts=512, heldout_prompts=128, samples=4)


def _synthetic_sft() -> LLMTrainConfig:
    return _synthetic(
        "synthetic-sft",
        SFTConfig(lr=3e-3, micro_batch_size=64),
        warm_start=WarmStartConfig(),  # this stage is the SFT
        collector=TextCollectorConfig(prompts=64),
        trainer=TrainerConfig(total_steps=64 * SORT_SFT_UPDATES, eval_every=64 * 30),
    )


def _synthetic_rm() -> LLMTrainConfig:
    return _synthetic(
        "synthetic-rm",
        RewardModelConfig(lr=1e-3, micro_batch_size=128),
        preferences=_pairs(),
        collector=TextCollectorConfig(prompts=64),
        trainer=TrainerConfig(total_steps=128 * 150, eval_every=128 * 50),
    )


def _synthetic_ppo() -> LLMTrainConfig:
    return _synthetic(
        "synthetic-ppo",
        LLMPPOConfig(lr=1e-4, micro_batch_size=128, kl_coef=0.02),
        collector=TextCollectorConfig(prompts=64, group_size=1),
        trainer=TrainerConfig(total_steps=64 * 60, eval_every=64 * 10),
    )


def _synthetic_rloo() -> LLMTrainConfig:
    return _synthetic(
        "synthetic-rloo",
        GRPOConfig(lr=1e-4, micro_batch_size=128, advantage="rloo", kl_coef=0.02, kl_in="reward", kl_estimator="k1"),
        collector=TextCollectorConfig(prompts=16, group_size=4),
        trainer=TrainerConfig(total_steps=64 * 60, eval_every=64 * 10),
    )


def _synthetic_dpo() -> LLMTrainConfig:
    return _synthetic(
        "synthetic-dpo",
        DPOConfig(lr=1e-4, beta=0.1, micro_batch_size=128),
        preferences=_pairs(),
        collector=TextCollectorConfig(prompts=64),
        trainer=TrainerConfig(total_steps=128 * 100, eval_every=128 * 25),
    )


def _synthetic_bon() -> LLMTrainConfig:
    return _synthetic("synthetic-bon", BestOfNConfig(n=(1, 2, 4, 8, 16)))


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
        Recipe(
            "calc-agent-grpo",
            "Agent: SFT on calculator-using episodes, then multi-turn GRPO with the calculator on 3-digit products",
            _calc_agent_grpo,
        ),
        Recipe(
            "synthetic-sft",
            "RLHF stage 1: short SFT of a tiny LM on digit sorting (hidden gold score logged)",
            _synthetic_sft,
        ),
        Recipe(
            "synthetic-rm",
            "RLHF stage 2: a reward model from gold-labelled pairs of the SFT model's samples",
            _synthetic_rm,
        ),
        Recipe(
            "synthetic-ppo",
            "RLHF stage 3: PPO with a critic against the reward model (needs --data.reward-model)",
            _synthetic_ppo,
        ),
        Recipe(
            "synthetic-rloo", "RLHF branch: RLOO against the reward model (needs --data.reward-model)", _synthetic_rloo
        ),
        Recipe("synthetic-dpo", "RLHF branch: DPO on gold-labelled pairs of the SFT model's samples", _synthetic_dpo),
        Recipe(
            "synthetic-bon",
            "RLHF baseline: best-of-n against the reward model (needs --data.reward-model)",
            _synthetic_bon,
        ),
    )
}
