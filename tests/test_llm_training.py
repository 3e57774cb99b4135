"""LLM learning: gradient-accumulation invariance, on-policy checks, GRPO raising reward, SFT learning, the
config/recipe/CLI plumbing and a complete tiny run through ``pickaxe.train.build.train``."""

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

from pickaxe.algos.grpo import GRPO, GRPOConfig
from pickaxe.algos.sft import SFT, SFTConfig
from pickaxe.envs.text import Arithmetic, Example, PromptEnv
from pickaxe.models.lm import tiny_lm
from pickaxe.models.tokenizer import char_tokenizer
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import DemoCollector, TextCollector
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm import build_llm_trainer, evaluate_llm_run
from pickaxe.train.llm_config import (
    LLMEvalConfig,
    LLMTrainConfig,
    LMConfig,
    TextCollectorConfig,
    WarmStartConfig,
)

TOK = char_tokenizer()
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0, n=4)


def _model(seed: int = 0):
    return tiny_lm(len(TOK), hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, seed=seed)


def _grpo_batch(model, seed: int = 0, reference=None):
    env = PromptEnv(Arithmetic(2), seed=seed, eval_size=5)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=seed)
    collector = TextCollector(env, engine, TOK, prompts=6, sampling=SAMPLING, policy=model, reference=reference)
    batch = collector.collect()
    batch["reward"] = torch.rand(len(batch), generator=torch.Generator().manual_seed(seed))  # a signal everywhere
    return batch


def _step_grads(algo) -> list[torch.Tensor]:
    """Record the (clipped) gradient every optimizer step of ``algo`` applies, flattened. Updates are compared by
    these, not by the weights after Adam: Adam's first step is about lr x sign(gradient), so float noise in a
    mathematically zero gradient (Qwen2's key bias: a constant added to every key leaves the softmax unchanged)
    would move a weight by a full step either way."""
    seen: list[torch.Tensor] = []
    step = algo.optimizer.step

    def recording(*args, **kwargs):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in algo.model.parameters()]
        seen.append(torch.cat([g.detach().flatten() for g in grads]).clone())
        return step(*args, **kwargs)

    algo.optimizer.step = recording
    return seen


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


OPTIONS = {
    "plain": {},
    "length-sorted": {"micro_batch_layout": "length-sorted"},
    "packed": {"micro_batch_layout": "packed"},
    "checkpointing": {"gradient_checkpointing": True},
    "chunked": {"logprob_chunk_tokens": 5},
}


@pytest.mark.parametrize(
    ("aggregation", "options"),
    [(a, "plain") for a in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
    + [("seq-mean-token-mean", o) for o in OPTIONS if o != "plain"],
)
def test_grpo_gradient_accumulation_invariance(aggregation: str, options: str) -> None:
    base = _model()
    batch = _grpo_batch(base, reference=_model(seed=5))
    results = []
    for micro in (24, 5):  # one micro-batch vs five uneven ones
        model = copy.deepcopy(base)
        cfg = GRPOConfig(
            lr=1e-3,
            aggregation=aggregation,
            micro_batch_size=micro,
            kl_coef=0.1,
            max_grad_norm=1e9,
            **OPTIONS[options],
        )
        algo = GRPO(model, cfg, SAMPLING)
        grads = _step_grads(algo)
        metrics = algo.update(batch.clone())
        assert not torch.equal(_params(model), _params(base))
        results.append((grads[0], metrics["loss/policy"]))
    (g_full, loss_full), (g_micro, loss_micro) = results
    assert g_full.abs().max() > 1e-3  # a real gradient
    assert loss_micro == pytest.approx(loss_full, rel=1e-4, abs=1e-6)
    assert torch.allclose(g_full, g_micro, atol=1e-6), (g_full - g_micro).abs().max()


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_sft_gradient_accumulation_invariance(aggregation: str) -> None:
    base = _model()
    batch = DemoCollector(PromptEnv(Arithmetic(2), seed=0, eval_size=5), TOK, batch_size=12).collect()
    out = []
    for micro in (12, 5):
        model = copy.deepcopy(base)
        cfg = SFTConfig(lr=1e-3, micro_batch_size=micro, max_grad_norm=1e9, aggregation=aggregation)
        sft = SFT(model, cfg)
        grads = _step_grads(sft)
        sft.update(batch.clone())
        out.append(grads[0])
    assert out[0].abs().max() > 1e-3
    assert torch.allclose(out[0], out[1], atol=1e-6), (out[0] - out[1]).abs().max()


def test_grpo_logs_checks_and_stays_quiet_on_policy() -> None:
    model = _model()
    batch = _grpo_batch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = GRPO(copy.deepcopy(model), GRPOConfig(), SAMPLING).update(batch.clone())
    assert metrics["check/logprob_diff_max"] < 1e-4
    assert 0.0 <= metrics["grpo/clip_fraction"] <= 1.0
    assert metrics["grpo/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_grpo_warns_when_sampler_and_learner_disagree() -> None:
    model = _model()
    batch = _grpo_batch(model)
    wrong = GRPO(copy.deepcopy(model), GRPOConfig(), SamplingParams(max_new_tokens=4, temperature=0.5, n=4))
    with pytest.warns(RuntimeWarning, match=r"learner and sampler should agree.*temperature/top-k/top-p"):
        metrics = wrong.update(batch.clone())
    assert metrics["check/logprob_diff_max"] > 1e-2
    stale = batch.clone()
    stale["policy_version"] += 3
    with pytest.warns(RuntimeWarning, match="sampled with policy version 3 but the learner is at version 0"):
        shifted = stale.clone()
        shifted["logprob"] = torch.where(shifted["loss_mask"], shifted["logprob"] - 0.1, shifted["logprob"])
        GRPO(copy.deepcopy(model), GRPOConfig(), SAMPLING).update(shifted)


@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig.variant("dr-grpo"),
        GRPOConfig.variant("dapo"),
        GRPOConfig.variant("gspo"),
        GRPOConfig(tis_cap=2.0, kl_coef=0.05, kl_in="reward", kl_estimator="k1", epochs=2, mini_batches=2),
    ],
    ids=["dr-grpo", "dapo", "gspo", "tis-kl-reward-multi-step"],
)
def test_grpo_variants_update(cfg: GRPOConfig) -> None:
    model = _model()
    batch = _grpo_batch(model, reference=_model(seed=5))
    batch["reward"][:4] = 1.0  # one group with no variance
    metrics = GRPO(model, cfg, SAMPLING).update(batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    if cfg.dynamic_sampling:
        assert metrics["grpo/kept_fraction"] == pytest.approx(20 / 24)
    if cfg.tis_cap is not None:
        assert metrics["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert "kl/seq_sum_mean" in metrics and "kl/token_mean" in metrics


def _digit_reward(prompt: str, completion: str, metadata: dict) -> float:
    return sum(c.isdigit() for c in completion) / 4


@pytest.mark.parametrize("advantage", ["group", "rloo", "reinforce++-baseline"])
def test_short_grpo_run_increases_mean_reward(advantage: str) -> None:
    torch.manual_seed(0)
    model = _model(seed=1)
    env = PromptEnv([Example(f"{i}+{i}=", str(2 * i)) for i in range(40)], rewards=[_digit_reward], seed=0)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, n=8)
    algo = GRPO(model, GRPOConfig(lr=3e-3, micro_batch_size=64, advantage=advantage), sampling, seed=0)
    engine = HFEngine(model, TOK.eos_token_id, TOK.pad_token_id, seed=0)
    collector = TextCollector(env, engine, TOK, 8, sampling, model, version_fn=lambda: algo.version)
    rewards = []
    for _ in range(30):
        batch = collector.collect()
        rewards.append(float(batch["reward"].mean()))
        algo.update(batch)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, [round(r, 2) for r in rewards]


def _tiny_cfg(**overrides) -> LLMTrainConfig:
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.warm_start = WarmStartConfig(updates=4, batch_size=16, log_every=2)
    cfg.collector = TextCollectorConfig(prompts=4, group_size=4)
    cfg.eval = LLMEvalConfig(prompts=12, samples=4, pass_k=2)
    cfg.trainer = TrainerConfig(total_steps=32, eval_every=16)
    cfg.device = "cpu"
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def _records(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir, deterministic=True)


def test_tiny_llm_run_end_to_end(tmp_path: Path) -> None:
    result, _ = train(_tiny_cfg(seed=3), run_dir=tmp_path / "a")
    assert result.steps == 32
    records = _records(tmp_path / "a")
    assert [r["warm_start/update"] for r in records if "warm_start/update" in r] == [2.0, 4.0]
    evals = [r for r in records if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 16, 32]  # before, periodic, final
    for r in evals:
        assert r["eval/accuracy_ci_low"] <= r["eval/accuracy"] <= r["eval/accuracy_ci_high"]
        assert {"eval/pass@1", "eval/pass@2", "eval/return_mean"} <= set(r)
    assert "check/logprob_diff_max" in records[-1] and "kl/token_mean" in records[-1]
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["kind"] == "llm" and config["algo_name"] == "grpo"
    assert LLMTrainConfig.from_dict(config) == _tiny_cfg(seed=3)
    assert (tmp_path / "a" / "model.safetensors").is_file()
    run_cfg = LLMTrainConfig.from_dict(config)
    final = evaluate_llm_run(run_cfg, tmp_path / "a")  # the run's own eval settings: 12 prompts, pass@2 of 4
    assert final == {k: v for k, v in evals[-1].items() if k.startswith("eval/")}  # same weights, same numbers
    assert evaluate_llm_run(run_cfg, tmp_path / "a", checkpoint="latest") == final
    at_16 = evaluate_llm_run(run_cfg, tmp_path / "a", checkpoint=16)  # the checkpoint of the step-16 evaluation
    assert at_16 == {k: v for k, v in evals[1].items() if k.startswith("eval/")}
    assert evaluate_llm_run(run_cfg, tmp_path / "a", prompts=5)["eval/prompts"] == 5.0
    assert run_cfg == _tiny_cfg(seed=3)  # evaluating did not change the config
    train(_tiny_cfg(seed=3), run_dir=tmp_path / "b")
    assert _records(tmp_path / "b") == records  # same seed, same numbers


def test_sft_recipe_builds_and_learns() -> None:
    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.collector = TextCollectorConfig(prompts=32)
    cfg.eval = LLMEvalConfig(prompts=8, samples=0)
    cfg.trainer = TrainerConfig(total_steps=32 * 30, eval_every=32 * 30)
    cfg.algo.lr = 3e-3
    history = build_llm_trainer(cfg).fit().history
    assert history[-1]["sft/token_nll"] < history[0]["sft/token_nll"] - 1.0


def test_llm_recipes_parse_through_the_cli_layer() -> None:
    from pickaxe.errors import ConfigError
    from pickaxe.recipes.args import parse_train

    assert {"arith-sft", "arith-grpo", "reverse-grpo"} <= set(LLM_RECIPES)
    for name, recipe in LLM_RECIPES.items():
        cfg = recipe.make()
        assert cfg.recipe == name and cfg.to_dict()["kind"] == "llm"
    args = ["--algo.lr", "1e-5", "--model.path", "/some/dir", "--algo.aggregation", "seq-mean-token-sum-norm"]
    parsed, _ = parse_train("arith-grpo", args)
    assert parsed.algo.lr == 1e-5 and parsed.model.path == "/some/dir"
    assert parsed.algo.aggregation == "seq-mean-token-sum-norm"
    with pytest.raises(ConfigError, match=r"did you mean --algo\.kl-coef"):
        parse_train("arith-grpo", ["--algo.kl-coeff", "0.1"])


def test_llm_run_resumes_exactly(tmp_path: Path) -> None:
    from llm_runs import assert_resume_is_exact

    assert_resume_is_exact(_tiny_cfg(seed=4), tmp_path, cut=16)  # stops half-way, checkpointing at step 16


def test_grpo_state_restores_the_mini_batch_shuffle() -> None:
    cfg = GRPOConfig(lr=1e-3, mini_batches=3, max_grad_norm=1e9)
    first, second = _grpo_batch(_model(), seed=0), _grpo_batch(_model(), seed=1)
    a = GRPO(_model(), cfg, SAMPLING, seed=7)
    a.update(first.clone())
    b = GRPO(_model(seed=3), cfg, SAMPLING, seed=99)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # as from a checkpoint: no tensor shared with a
    a.update(second.clone())
    b.update(second.clone())
    assert torch.equal(_params(a.model), _params(b.model))  # same mini-batches in the same order


def test_set_changes_grpo_learning_rate_live(tmp_path: Path) -> None:
    from pickaxe.runs.run import Run
    from pickaxe.train.llm import build_llm_trainer
    from pickaxe.train.overrides import mutable_keys, parse_changes, request

    cfg = _tiny_cfg(seed=1)
    assert {"algo.lr", "algo.clip_high"} <= set(mutable_keys(cfg.algo))
    run = Run(tmp_path / "r", config=cfg.to_dict(), seed=cfg.seed)
    trainer = build_llm_trainer(cfg, run)
    request(run.path, parse_changes(["algo.lr=2e-4"], mutable_keys(cfg.algo)))  # what `pickaxe set` does
    trainer.fit()
    run.close()
    updates = [r for r in _records(run.path) if "grpo/lr" in r]
    assert updates and all(r["grpo/lr"] == pytest.approx(2e-4) for r in updates)
    assert updates[0]["override/algo.lr"] == 2e-4


def test_warm_start_stops_at_its_target_nll() -> None:
    """The warm start ends at a stage of learning (windowed token NLL), not at an update count that lands before
    SFT's sharp transition on one machine and after it on another."""
    from pickaxe.train.llm import build_model, warm_start

    cfg = _tiny_cfg(seed=2)
    cfg.warm_start = WarmStartConfig(updates=60, target_nll=50.0, batch_size=8, log_every=100)  # reached at once
    model, tok = build_model(cfg, torch.device("cpu"), 0)
    out = warm_start(cfg, model, tok, 0, None, False)
    assert out["warm_start/updates"] == WarmStartConfig.NLL_WINDOW  # as soon as the window is full
    cfg.warm_start = WarmStartConfig(updates=30, target_nll=1e-6, batch_size=8)  # never reached: the cap, said
    with pytest.warns(RuntimeWarning, match=r"has not reached warm_start\.target_nll 1e-06.*--warm-start\.updates"):
        assert warm_start(cfg, model, tok, 0, None, False)["warm_start/updates"] == 30


@pytest.mark.slow
def test_arith_grpo_recipe_shows_its_gain(tmp_path: Path) -> None:
    """The flagship demo as documented (docs/llm.md): the warm start ends inside SFT's transition and GRPO lifts
    held-out greedy accuracy clear of both 95% intervals (about 4 minutes on 2 cores)."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.device = "cpu"
    train(cfg, run_dir=tmp_path / "r")
    evals = [r for r in _records(tmp_path / "r") if "eval/accuracy" in r]
    before, after = evals[0], evals[-1]
    assert 0.3 < before["eval/accuracy"] < 0.8  # inside the transition: something left for GRPO to do
    assert after["eval/accuracy_ci_low"] > before["eval/accuracy_ci_high"]


def test_summary_shows_pass_at_k_with_its_interval_not_as_extra_entries(capsys, monkeypatch) -> None:
    from pickaxe.train.llm import print_llm_summary

    monkeypatch.setenv("COLUMNS", "200")  # one line per cell
    from pickaxe.train.trainer import FitResult

    record = {"eval/accuracy": 0.5, "eval/accuracy_ci_low": 0.4, "eval/accuracy_ci_high": 0.6, "eval/pass@1": 0.3,
              "eval/pass@1_ci_low": 0.25, "eval/pass@1_ci_high": 0.35, "eval/return_mean": 0.5}  # fmt: skip
    print_llm_summary(record, FitResult(steps=1, wall_s=1.0, history=[record]))
    out = capsys.readouterr().out
    assert "pass@1=0.300 [0.250, 0.350]" in out and "_ci_low" not in out
