"""Ctrl-C loses nothing: SIGINT/SIGTERM checkpoint at the next iteration boundary and `pickaxe resume` continues
exactly; a second Ctrl-C aborts at once (a repeated SIGTERM does not); checkpoints never change a run's numbers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import Run, read_metrics
from pickaxe.train.build import build_trainer, resume, train
from pickaxe.train.trainer import TrainingInterrupted

# no --save-every: the defaults must make the run resumable
ARGS = ["--trainer.total-steps", "6144", "--trainer.stop-at-target", "False", "--no-progress"]


@pytest.fixture(autouse=True)
def _ctrl_c_deliverable():
    """Ctrl-C must reach the code under test however pytest was started: a job started in the background by a
    non-interactive shell inherits SIGINT ignored, and the Trainer rightly keeps an ignored signal ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _default_sigint() -> None:
    """In a child before exec: SIGINT back to its default, so Python turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pickaxe.cli", *args]


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_signal_checkpoints_at_a_boundary_and_resume_continues_exactly(
    tmp_path: Path, sig: signal.Signals, capfd: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    cfg = get_recipe("cartpole-ppo")  # what ARGS say, in this process: the uninterrupted reference
    cfg.trainer.total_steps, cfg.trainer.stop_at_target = 6144, False
    train(cfg, run_dir=a)

    proc = subprocess.Popen(
        _cmd("train", "cartpole-ppo", *ARGS, "--run-dir", str(b)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # the first metrics line: well inside fit
        if (b / "metrics.jsonl").exists() and (b / "metrics.jsonl").read_text().strip():
            break
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    stderr = err.decode()
    assert proc.returncode not in (0, 2), stderr  # nonzero, and not what a supervisor treats as "done"

    steps = [r["step"] for r in read_metrics(b)]
    assert 0 < steps[-1] < 6144
    ckpt = b / "checkpoints" / f"step-{steps[-1]:012d}"  # at the boundary after the last logged iteration
    assert ckpt.is_dir() and (b / "checkpoints" / "latest").read_text().strip() == ckpt.name
    line = next(ln for ln in stderr.splitlines() if "interrupted" in ln)
    assert str(ckpt) in line and f"pickaxe resume {b}" in line
    assert any(e["message"].startswith("interrupted") for e in _events(b))
    assert json.loads((b / "status.json").read_text())["state"] == "interrupted"

    capfd.readouterr()
    resume(b)  # what `pickaxe resume DIR` runs
    assert f"resumed from {ckpt.name} at step {steps[-1]}" in capfd.readouterr().err
    assert read_metrics(a, deterministic=True) == read_metrics(b, deterministic=True)
    assert json.loads((b / "status.json").read_text())["state"] == "finished"


def _small_trainer(tmp_path: Path, name: str, **trainer: object):
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.eval_every = 2048, 1024
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    run = Run(tmp_path / name, config=cfg.to_dict(), seed=cfg.seed, tensorboard=False)
    return build_trainer(cfg, run=run), run


def test_second_ctrl_c_aborts_at_once_and_the_last_checkpoint_stands(tmp_path: Path) -> None:
    trainer, run = _small_trainer(tmp_path, "r", save_every=512)
    real_iteration, real_save = trainer._iteration, trainer.save_checkpoint

    def iteration(*args):
        record = real_iteration(*args)
        if trainer.step == 768:  # between the checkpoints at 512 and 1024
            signal.raise_signal(signal.SIGINT)
        return record

    def save(*args, **kwargs):
        if trainer._stop_signal is not None:  # the save the first Ctrl-C asked for: the user presses again
            signal.raise_signal(signal.SIGINT)
        return real_save(*args, **kwargs)

    trainer._iteration, trainer.save_checkpoint = iteration, save
    with pytest.raises(KeyboardInterrupt) as exc:
        trainer.fit()
    run.close()
    assert not isinstance(exc.value, TrainingInterrupted)
    assert (run.path / "checkpoints" / "latest").read_text().strip() == "step-000000000512"
    assert not (run.path / "checkpoints" / "step-000000000768").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored after fit


def test_repeated_sigterm_still_checkpoints(tmp_path: Path) -> None:
    """Regression: a queue cancel signals a --max-restarts supervisor's whole process group and the supervisor
    forwards the SIGTERM, so the training got it twice and aborted without the checkpoint the first one asked for
    (Slurm at a time limit does the same). A repeated SIGTERM is the same stop: it checkpoints and exits."""
    trainer, run = _small_trainer(tmp_path, "r", save_every=512)
    real_iteration = trainer._iteration

    def iteration(*args):
        record = real_iteration(*args)
        if trainer.step == 768:  # between the checkpoints at 512 and 1024: two senders, one stop
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
        return record

    trainer._iteration = iteration
    with pytest.raises(TrainingInterrupted) as exc:
        trainer.fit()
    run.close()
    assert exc.value.signum == signal.SIGTERM
    assert (run.path / "checkpoints" / "latest").read_text().strip() == "step-000000000768"


def test_handlers_only_in_the_main_thread(tmp_path: Path) -> None:
    trainer, run = _small_trainer(tmp_path, "r")
    errors: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=fit)
    thread.start()
    thread.join()
    run.close()
    assert not errors  # signal.signal outside the main thread would raise ValueError
    assert (run.path / "model.safetensors").is_file()


def test_checkpoints_never_change_the_numbers(tmp_path: Path) -> None:
    many, run = _small_trainer(tmp_path, "many", save_every=256, save_at_eval=True)
    many.fit()
    run.close()
    none, run = _small_trainer(tmp_path, "none", save_every=0, save_at_eval=False, keep_best=0)
    none.fit()
    run.close()
    assert len(list((tmp_path / "none" / "checkpoints").glob("step-*"))) == 1  # only the final one
    assert read_metrics(tmp_path / "many", deterministic=True) == read_metrics(tmp_path / "none", deterministic=True)


def test_default_run_checkpoints_at_every_evaluation(tmp_path: Path) -> None:
    trainer, run = _small_trainer(tmp_path, "r", keep_last=10)
    trainer.fit()
    run.close()
    names = sorted(p.name for p in (run.path / "checkpoints").glob("step-*"))
    assert names == ["step-000000001024", "step-000000002048"]


def test_resume_without_a_checkpoint_is_refused_unless_allowed(tmp_path: Path) -> None:
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps = 512
    Run(tmp_path / "r", config=cfg.to_dict(), tensorboard=False).close()  # a run killed before any checkpoint
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 256}\n')
    with pytest.raises(PickaxeError, match=r"has no checkpoint to resume from") as exc:
        resume(tmp_path / "r")
    assert "\n" not in str(exc.value)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == '{"step": 256}\n'  # nothing written or lost
    run = Run.open(tmp_path / "r", tensorboard=False)
    trainer = build_trainer(cfg, run=run)
    assert trainer.resume(allow_empty=True) is None  # the supervisor's restart: start again from step 0
    trainer.fit()
    run.close()
    assert [r["step"] for r in read_metrics(tmp_path / "r")] == [256, 512]


def test_target_stops_the_run_unless_told_otherwise(tmp_path: Path) -> None:
    for stop in (True, False):
        cfg = get_recipe("cartpole-ppo")
        assert cfg.trainer.target_return == 475.0 and cfg.trainer.stop_at_target
        cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.target_return = 2048, 512, 0.0
        cfg.trainer.stop_at_target = stop
        result, _ = train(cfg, run_dir=tmp_path / str(stop))
        assert result.solved_step == 512
        assert result.steps == (512 if stop else 2048)


def test_a_run_resumed_after_reaching_its_target_still_reports_when(tmp_path: Path, capsys) -> None:
    # a run that trains past its target (stop-at-target off), killed after reaching it, then resumed: the end-of-run
    # table once raised a TypeError here (the checkpoint kept the step the target was reached at, not the seconds)
    import os

    from pickaxe.train.trainer import print_summary

    run_dir = tmp_path / "r"
    flags = ["--trainer.total-steps", "2048", "--trainer.eval-every", "512", "--trainer.target-return", "0",
             "--trainer.stop-at-target", "False", "--save-every", "512", "--no-progress"]  # fmt: skip
    env = {**os.environ, "PICKAXE_FAULT": "iteration:7"}  # SIGKILL at the 7th iteration (after step 1536)
    killed = subprocess.run(
        _cmd("train", "cartpole-ppo", "--run-dir", str(run_dir), *flags), env=env, capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    result, run = resume(run_dir)
    assert result.steps == 2048 and result.solved_step == 512
    assert result.solved_wall_s is not None and result.solved_wall_s > 0  # kept by the checkpoint
    print_summary(result, run)
    assert "step 512 after" in capsys.readouterr().out


def test_a_resumed_run_counts_its_earlier_training_time_and_reports_this_sessions_rate(tmp_path: Path, capsys) -> None:
    # the end-of-run table once divided every env step by the resumed segment's seconds (a resumed run looked faster
    # than it was), and the seconds to the target counted only the resumed segment
    import os
    import re

    from pickaxe.runs.checkpoint import CheckpointManager
    from pickaxe.train.trainer import print_summary

    run_dir = tmp_path / "r"
    flags = ["--trainer.total-steps", "2048", "--trainer.eval-every", "2048", "--trainer.target-return", "0",
             "--save-every", "256", "--no-progress"]  # fmt: skip  # one evaluation, at 2048: after the resume
    env = {**os.environ, "PICKAXE_FAULT": "iteration:7"}
    killed = subprocess.run(
        _cmd("train", "cartpole-ppo", "--run-dir", str(run_dir), *flags), env=env, capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    state, info = CheckpointManager(run_dir).load()
    trained_before = state["trainer"]["trained_s"]
    assert trained_before > 0
    result, run = resume(run_dir)
    assert result.start_step == info.step > 0 and result.steps == 2048 and result.solved_step == 2048
    assert result.solved_wall_s is not None and result.solved_wall_s > trained_before
    print_summary(result, run)
    out = capsys.readouterr().out
    rate = re.search(r"\(([\d,]+) steps/s, resumed at step ([\d,]+)\)", out)
    assert rate is not None, out
    assert int(rate.group(2).replace(",", "")) == info.step
    expected = (2048 - info.step) / result.wall_s
    assert int(rate.group(1).replace(",", "")) == pytest.approx(expected, abs=1)
