"""Reward-model and DPO runs: preference pairs in, the same Trainer, Run and checkpoints as every other run.

Both start from the run's policy (``--model.path`` or the tiny model, warm-started with SFT when configured) and
read preference pairs from ``preferences.path`` or generate them: the policy samples ``preferences.samples``
completions per prompt and the ``data.gold`` scorer labels every pair (see
:mod:`pickaxe.rollout.gold_preferences`). Generated pairs are written to ``RUN_DIR/preferences/`` before training,
with their sizes and sha256 digests in ``RUN_DIR/preferences/MANIFEST.json``, so a resumed run reads the very same data
and a later stage (DPO after the reward model) can train on it, checked against those digests when it starts.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from rich.console import Console

from pickaxe.algos.base import Algorithm
from pickaxe.algos.dpo import DPO
from pickaxe.algos.reward_model import RewardModelTrainer
from pickaxe.envs.text.preferences import (
    PreferencePair,
    load_preferences,
    record_preference_digests,
    save_preferences,
    split_by_prompt,
    verify_preference_digest,
)
from pickaxe.errors import ConfigError
from pickaxe.eval.stats import wilson_interval
from pickaxe.models.reward import RewardModel
from pickaxe.models.sharding import is_meta
from pickaxe.rollout.engines.base import SamplingParams
from pickaxe.rollout.engines.hf import HFEngine
from pickaxe.rollout.gold_preferences import sample_gold_preferences
from pickaxe.rollout.pair_collector import PairCollector
from pickaxe.rollout.pairs import pack_pairs
from pickaxe.runs.run import Run
from pickaxe.train.llm import (
    LLMTrainer,
    build_env,
    frozen_reference,
    keep_reward_model,
    reference_scorer,
    start_policy,
)
from pickaxe.train.llm_config import LLMTrainConfig
from pickaxe.train.text_eval import TextEvaluator

__all__ = ["build_dpo_trainer", "build_reward_model_trainer", "preference_data"]

_GENERATED = ("heldout.jsonl", "train.jsonl")
"""The preference files a run generates in ``RUN_DIR/preferences``, with their digests in its ``MANIFEST.json``."""


def preference_data(
    cfg: LLMTrainConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    seeds: dict[str, int],
    run: Run | None,
    resuming: bool,
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Training and held-out pairs: from ``preferences.path`` (held-out from ``heldout_path`` or a seeded split by
    prompt), or generated from ``model``'s samples labelled by ``data.gold`` and saved in ``RUN_DIR/preferences``
    (a resumed run reads them back instead of sampling again)."""
    p = cfg.preferences
    if p.path:
        pairs = load_preferences(p.path, ranking_key=p.ranking_key)
        if p.heldout_path:
            return pairs, load_preferences(p.heldout_path, ranking_key=p.ranking_key)
        return split_by_prompt(pairs, seeds["eval_env"], p.path)
    if is_meta(model):  # a sharded learner other than rank 0: no weights to sample with, and it never collects
        placeholder = [PreferencePair("", "a", "b")]  # nor evaluates pairs (rank 0 does)
        return placeholder, placeholder
    folder = run.path / "preferences" if run is not None else None
    if resuming and folder is not None and (folder / "train.jsonl").is_file():  # written last: both are complete
        if not all([verify_preference_digest(folder / n, "the run's own preferences") for n in _GENERATED]):
            record_preference_digests(folder, _GENERATED)  # killed before it recorded them: complete all the same
        return load_preferences(folder / "train.jsonl"), load_preferences(folder / "heldout.jsonl")
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    engine = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.engine.max_batch, seeds["engine"])
    params = SamplingParams(cfg.engine.max_new_tokens, p.temperature, n=p.samples)
    gold = dict(zip(env.reward_names, (fn for fn, _ in env.rewards), strict=True)).get("gold")
    if gold is None:
        raise ConfigError("generated preferences are labelled by one gold score: set --data.gold to a single reward")
    model.eval()
    train = sample_gold_preferences(engine, tokenizer, env.sample(p.prompts), params, gold, seeds["env"],
                                    p.label_temperature)  # fmt: skip
    heldout = sample_gold_preferences(engine, tokenizer, env.eval_examples(p.heldout_prompts), params, gold,
                                      seeds["eval_env"], p.label_temperature)  # fmt: skip
    if not train or not heldout:
        raise ConfigError(
            "the policy's samples gave no pairs with different gold scores: raise --preferences.samples or "
            "--preferences.temperature"
        )
    if folder is not None:
        save_preferences(heldout, folder / "heldout.jsonl")
        save_preferences(train, folder / "train.jsonl")  # written last: its presence means both are complete
        record_preference_digests(folder, _GENERATED)  # what a later stage that trains on them checks
    return train, heldout


class PairAccuracyEvaluator:
    """Held-out pairwise accuracy of a reward model with its 95% Wilson interval; ``eval/return_mean`` is the
    accuracy, so ``keep_best`` keeps the most accurate checkpoint."""

    def __init__(self, pairs: list[PreferencePair], tokenizer: Any) -> None:
        self.batch = pack_pairs(pairs, tokenizer)
        self.n = len(pairs)

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo`` (a ``RewardModelTrainer``)."""
        assert isinstance(algo, RewardModelTrainer)
        accuracy = algo.evaluate(self.batch)
        low, high = wilson_interval(round(accuracy * self.n), self.n)
        return {
            "eval/accuracy": accuracy,
            "eval/accuracy_ci_low": low,
            "eval/accuracy_ci_high": high,
            "eval/return_mean": accuracy,
            "eval/pairs": float(self.n),
        }


class DPOEvaluator:
    """The text evaluation of the policy (held-out reward terms, gold, KL to the reference) plus DPO's implicit-
    reward accuracy and margin on held-out pairs."""

    def __init__(self, text: TextEvaluator, pairs: list[PreferencePair], tokenizer: Any) -> None:
        self.text = text
        self.batch = pack_pairs(pairs, tokenizer, pair_ids=range(len(pairs)))

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo`` (a ``DPO``)."""
        assert isinstance(algo, DPO)
        return {**self.text(algo), **{f"eval/{k.split('/')[-1]}": v for k, v in algo.evaluate(self.batch).items()}}


def build_reward_model_trainer(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> LLMTrainer:
    """A reward model (the policy's decoder and a new scalar head) trained with the Bradley–Terry loss on the
    run's preference pairs, ``collector.prompts`` pairs a batch; evaluated by held-out pairwise accuracy. The
    finished run exports the reward model (and tokenizer) to ``RUN_DIR/export``."""
    model, tokenizer, seeds, device, resuming = start_policy(cfg, run, progress)
    train_pairs, heldout = preference_data(cfg, model, tokenizer, seeds, run, resuming)
    with torch.device("meta") if is_meta(model) else contextlib.nullcontext():  # its head too, on a meta build
        reward_model = RewardModel.from_lm(model, seed=seeds["algo"])
    del model
    algo = RewardModelTrainer(reward_model, cfg.algo)
    collector = PairCollector(train_pairs, tokenizer, cfg.collector.prompts, seeds["env"], device)
    evaluator = PairAccuracyEvaluator(heldout, tokenizer)
    if progress:
        Console().print(f"preference pairs: {len(train_pairs)} for training, {len(heldout)} held out")
    return LLMTrainer.assemble(cfg, algo, collector, evaluator, run, progress, resuming, (reward_model, tokenizer))


def build_dpo_trainer(cfg: LLMTrainConfig, run: Run | None = None, progress: bool = False) -> LLMTrainer:
    """DPO (or IPO) of the policy against a frozen copy of itself on the run's preference pairs, ``collector.prompts``
    pairs a batch; evaluated on held-out prompts (reward terms, gold, KL to the reference) and held-out pairs. The
    finished run exports the policy to ``RUN_DIR/export``."""
    model, tokenizer, seeds, device, resuming = start_policy(cfg, run, progress)
    train_pairs, heldout = preference_data(cfg, model, tokenizer, seeds, run, resuming)
    reference = frozen_reference(model)
    algo = DPO(model, cfg.algo, reference)
    collector = PairCollector(train_pairs, tokenizer, cfg.collector.prompts, seeds["env"], device)
    env = build_env(cfg, seeds["env"], seeds["eval_env"], tokenizer, device)
    engine = HFEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, cfg.engine.max_batch, seeds["engine"])
    # sharded learners shard DPO's reference too: the evaluator's KL then scores it with every learner
    algo.shard_reference = cfg.dist.shard_reference
    sharded = cfg.dist.shard == "fsdp" and cfg.dist.shard_reference and cfg.dist.learners > 1
    scorer = reference_scorer(algo) if sharded else reference
    keep_reward_model(cfg, env, algo)  # and a reward model its evaluation scores with (--data.reward-model)
    text = TextEvaluator(env, engine, tokenizer, cfg.eval, cfg.engine.max_new_tokens, seeds["eval"], scorer)
    evaluator = DPOEvaluator(text, heldout, tokenizer)
    if progress:
        Console().print(f"preference pairs: {len(train_pairs)} for training, {len(heldout)} held out")
    return LLMTrainer.assemble(cfg, algo, collector, evaluator, run, progress, resuming, (model, tokenizer))
