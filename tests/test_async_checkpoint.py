"""``--trainer.async-checkpoint``: a checkpoint written in the background holds the state of the moment it was asked
for (training changes the tensors in place right after), is committed like a synchronous one, a failed background
write leaves the previous checkpoint in use, and a run SIGKILLed while its checkpoint is being written in the
background resumes from the previous one to exactly the numbers of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pickaxe.recipes import get_recipe
from pickaxe.runs.checkpoint import CheckpointManager, CheckpointWarning
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import resume, train


def _state(value: float) -> dict:
    return {"w": torch.full((64, 8), value), "opt": {"m": torch.arange(10.0) * value}, "step": int(value)}


def test_a_background_save_holds_the_state_of_the_moment_it_was_asked_for(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=5)
    state = _state(1.0)
    path = manager.save_async(10, state, metric=1.0)
    state["w"].add_(100.0)  # training goes on changing the tensors in place
    state["opt"]["m"].zero_()
    assert manager.wait() == path and path.name == "step-000000000010"
    loaded, info = manager.load()
    assert info.step == 10 and info.metric == 1.0
    assert torch.equal(loaded["w"], torch.full((64, 8), 1.0)) and torch.equal(loaded["opt"]["m"], torch.arange(10.0))
    assert manager.wait() is None  # nothing in flight any more
    # the same files as a synchronous save of the same state
    sync = CheckpointManager(tmp_path / "sync").save(10, _state(1.0), metric=1.0)
    assert (sync / "tensors.safetensors").read_bytes() == (path / "tensors.safetensors").read_bytes()


def test_a_second_save_finishes_the_first_and_retention_applies(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1, keep_best=0)
    manager.save_async(1, _state(1.0))
    manager.save_async(2, _state(2.0))  # waits for step 1's write first
    manager.save(3, _state(3.0))  # a synchronous save too
    assert [i.step for i in manager.list()] == [3]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_failed_background_write_is_raised_once_and_the_previous_checkpoint_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(tmp_path, keep_last=5)
    manager.save(1, _state(1.0))
    import pickaxe.runs.tensorfile as tensorfile

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensorfile, "write_tensors", full_disk)
    manager.save_async(2, _state(2.0))
    with pytest.raises(OSError, match="No space left"):
        manager.wait()
    assert manager.wait() is None
    assert [i.step for i in manager.list()] == [1] and not list((tmp_path / "checkpoints").glob(".tmp-*"))
    manager.save_async(3, _state(3.0))
    with pytest.warns(CheckpointWarning, match="written in the background failed"):
        _, info = manager.load()  # a reader finishes the save in flight and reports its failure
    assert info.step == 1


def _cfg(async_checkpoint: bool):
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.save_every, cfg.trainer.eval_every = 2048, 512, 1024
    cfg.trainer.keep_last, cfg.trainer.keep_best, cfg.trainer.stop_at_target = 1, 0, False
    cfg.trainer.async_checkpoint = async_checkpoint
    return cfg


ARGS = [
    "--trainer.total-steps", "2048", "--save-every", "512", "--trainer.eval-every", "1024", "--trainer.keep-last", "1",
    "--trainer.keep-best", "0", "--trainer.stop-at-target", "False", "--no-progress", "--trainer.async-checkpoint",
]  # fmt: skip


def test_a_run_killed_during_a_background_write_resumes_exactly(tmp_path: Path) -> None:
    train(_cfg(async_checkpoint=False), run_dir=tmp_path / "sync")
    reference = read_metrics(tmp_path / "sync", deterministic=True)
    train(_cfg(async_checkpoint=True), run_dir=tmp_path / "async")
    assert read_metrics(tmp_path / "async", deterministic=True) == reference  # saving never changes the numbers
    for name in ("sync", "async"):
        assert (tmp_path / name / "checkpoints" / "latest").read_text() == "step-000000002048\n"
    sync_ckpt, async_ckpt = (tmp_path / n / "checkpoints" / "step-000000002048" for n in ("sync", "async"))
    assert (sync_ckpt / "tensors.safetensors").read_bytes() == (async_ckpt / "tensors.safetensors").read_bytes()

    run_dir = tmp_path / "killed"
    env = {**os.environ, "PICKAXE_FAULT": "checkpoint-tensors:2"}  # in the background write of step 1024
    cmd = [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", *ARGS, "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-000000000512\n"
    resume(run_dir)
    assert read_metrics(run_dir, deterministic=True) == reference


def test_a_bad_value_for_the_flag_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--trainer.async-checkpoint", "often"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "async-checkpoint" in proc.stderr
