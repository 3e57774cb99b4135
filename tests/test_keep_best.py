"""`trainer.keep_best` keeps the best evaluation: every evaluation that beats the best so far is checkpointed with
its eval return, whatever `save_every` says, so `--checkpoint best` finds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pickaxe.recipes import get_recipe
from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import train


@pytest.mark.parametrize("save_at_eval", [False, True])
def test_best_dqn_evaluation_is_kept_with_its_metric(tmp_path: Path, save_at_eval: bool) -> None:
    cfg = get_recipe("cartpole-dqn")
    cfg.seed = 2  # its best evaluation (step 2560 on the CPUs measured) is well before the end
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.eval_episodes = 6144, 512, 3
    cfg.trainer.save_every, cfg.trainer.save_at_eval = 0, save_at_eval
    cfg.trainer.keep_last, cfg.trainer.keep_best, cfg.trainer.target_return = 1, 1, None
    cfg.algo.learning_starts, cfg.algo.buffer_size = 512, 4096
    train(cfg, run_dir=tmp_path / "r")

    records = [r for r in read_metrics(tmp_path / "r") if "eval/return_mean" in r]
    evals = [r["eval/return_mean"] for r in records]
    assert len(evals) == 12 and max(evals) > evals[-1]  # the best evaluation is not the last one
    infos = CheckpointManager(tmp_path / "r").list()
    scored = [i for i in infos if i.metric is not None]
    assert scored, [json.loads((i.path / "meta.json").read_text())["metric"] for i in infos]
    best = max(scored, key=lambda i: i.metric)
    assert best.metric == max(evals)
    best_step = records[evals.index(max(evals))]["step"]  # the first at the best return: its step is the CPU's
    assert len(infos) == 2 and best.step == best_step  # keep_last 1 (the final one) + keep_best 1
