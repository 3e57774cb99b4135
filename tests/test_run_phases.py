"""A run's ``status.json`` tells the truth while it runs: it exists from the run's first moment, names the phase
(loading, warm start, evaluating, training, saving, exporting), moves its step while training, and its wall time
counts loading and the warm start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pickaxe.recipes import get_recipe
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.runs.listing import format_runs, summarize_run
from pickaxe.runs.status import read_status, run_state
from pickaxe.runs.tracking import read_metrics
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig
from pickaxe.train.text_eval import TextEvaluator


def _llm_cfg() -> Any:
    cfg = LLM_RECIPES["arith-sft"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.collector = TextCollectorConfig(prompts=16)
    cfg.eval = LLMEvalConfig(prompts=4, samples=0, before=True)
    cfg.trainer = TrainerConfig(total_steps=32, eval_every=32)
    cfg.warm_start.updates, cfg.warm_start.batch_size, cfg.warm_start.log_every = 2, 8, 1
    cfg.device = "cpu"
    return cfg


def test_an_llm_run_reads_running_with_its_phase_from_its_first_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickaxe.train.llm as llm

    run_dir = tmp_path / "r"
    seen: dict[str, Any] = {}

    def watch(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, (summarize_run(run_dir), read_status(run_dir)))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(llm, "build_model", watch("model load", llm.build_model))  # before any model exists
    monkeypatch.setattr(llm, "warm_start", watch("warm start", llm.warm_start))
    evaluator = TextEvaluator.__call__
    monkeypatch.setattr(TextEvaluator, "__call__", watch("evaluation", evaluator))
    train(_llm_cfg(), run_dir=run_dir)

    for name, phase in (("model load", "loading"), ("warm start", "warm_start")):
        summary, status = seen[name]
        assert summary.state == "running", name  # not "crashed": its process lives
        assert summary.phase == phase, name
        assert status["pid"] and status["wall_s"] >= 0
    summary, _ = seen["evaluation"]  # the evaluation before training
    assert (summary.state, summary.phase) == ("running", "evaluating")
    assert "running (warm start)" in format_runs([seen["warm start"][0]])

    status = read_status(run_dir)
    assert status["state"] == "finished" and "phase" not in status and status["step"] == 32
    records = read_metrics(run_dir)
    warm = max(r["time/warm_start_s"] for r in records if "time/warm_start_s" in r)
    trained = max(r["time/elapsed_s"] for r in records if "time/elapsed_s" in r)
    summary = summarize_run(run_dir)
    assert summary.wall_s >= warm + trained  # the warm start is part of the run's wall time
    assert summary.phase is None and summary.state == "finished"


def test_a_classic_run_moves_its_step_while_it_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickaxe.runs.run as run_module
    from pickaxe.train.trainer import Trainer

    monkeypatch.setattr(run_module, "STATUS_EVERY_S", 0.0, raising=False)  # every log point writes (default: 2 s)
    run_dir = tmp_path / "r"
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.env.eval_envs = 4096, 2048, 2
    cfg.collector.steps, cfg.env.num_envs = 128, 4
    cfg.trainer.stop_at_target = False  # the whole 4,096 steps, whether or not the evaluation at 2,048 solves it
    seen: list[tuple[str, str, int]] = []
    evaluate = Trainer.evaluate

    def watched_evaluate(self: Trainer) -> dict[str, float]:
        status = read_status(run_dir)
        seen.append((run_state(run_dir), status.get("phase", "training"), status["step"]))
        return evaluate(self)

    iteration = Trainer._iteration

    def watched_iteration(self: Trainer, total: int, start: float) -> dict[str, Any]:
        status = read_status(run_dir)
        seen.append((run_state(run_dir), status.get("phase", "training"), status["step"]))
        return iteration(self, total, start)

    monkeypatch.setattr(Trainer, "evaluate", watched_evaluate)
    monkeypatch.setattr(Trainer, "_iteration", watched_iteration)
    train(cfg, run_dir=tmp_path / "r")

    training = [step for state, phase, step in seen if (state, phase) == ("running", "training")]
    assert training[0] == 0 and training == sorted(training)
    assert 0 < training[len(training) // 2] < 4096  # the step moved while the run trained
    assert ("running", "evaluating", 2048) in seen
    assert read_status(run_dir)["step"] == 4096 and run_state(run_dir) == "finished"
