"""`pickaxe set` changes a hyper-parameter of a running run at a logged step; resume replays it exactly."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import resume

ARGS = ["--trainer.total-steps", "16384", "--save-every", "2048", "--trainer.keep-last", "20", "--no-progress"]
ARGS += ["--trainer.stop-at-target", "False"]  # the change must land before the end


def _metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir, deterministic=True)


def _only_checkpoint(run_dir: Path, step: int) -> None:
    keep = f"step-{step:012d}"
    for ckpt in (run_dir / "checkpoints").glob("step-*"):
        if ckpt.name != keep:
            shutil.rmtree(ckpt)
    (run_dir / "checkpoints" / "latest").write_text(keep)


def test_set_changes_lr_at_a_logged_step_and_resume_replays_it(tmp_path: Path) -> None:
    a = tmp_path / "a"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", *ARGS, "--run-dir", str(a)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until it is well into training
        path = a / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= 20:
            break
        time.sleep(0.05)
    assert main(["set", str(a), "algo.lr=1e-4"]) == 0
    assert proc.wait(timeout=180) == 0, proc.stderr.read()

    records = _metrics(a)
    changed = [r for r in records if "override/algo.lr" in r]
    assert len(changed) == 1 and changed[0]["override/algo.lr"] == 1e-4
    step = changed[0]["step"]
    assert all(r["ppo/lr"] == 1e-4 for r in records if r["step"] >= step)
    assert all(r["ppo/lr"] == 3e-3 for r in records if r["step"] < step)
    history = [json.loads(line) for line in (a / "overrides.jsonl").read_text().splitlines()]
    assert history == [{"step": step - 256, "key": "algo.lr", "value": 1e-4}]

    before = max(s for s in range(2048, 16384, 2048) if s < step - 256)
    after = min(s for s in range(2048, 16384, 2048) if s >= step)
    for name, ckpt in (("before", before), ("after", after)):
        b = tmp_path / name
        shutil.copytree(a, b)
        _only_checkpoint(b, ckpt)
        resume(b)
        assert _metrics(b) == records, name


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("algo.gamma=0.5", "algo.gamma cannot change while a run trains; mutable keys: algo.clip"),
        ("algo.lr=fast", "algo.lr takes float, got 'fast'"),
        ("algo.lr", "expected KEY=VALUE"),
    ],
)
def test_set_refuses_bad_changes(tmp_path: Path, capsys, assignment: str, message: str) -> None:
    from pickaxe.recipes import get_recipe
    from pickaxe.runs.run import Run

    cfg = get_recipe("cartpole-ppo")
    Run(tmp_path / "r", config=cfg.to_dict(), tensorboard=False).close()
    assert main(["set", str(tmp_path / "r"), assignment]) == 2
    assert capsys.readouterr().err.startswith(f"pickaxe: error: {message}")  # the key as the user wrote it
    assert not (tmp_path / "r" / "control").exists() or not list((tmp_path / "r" / "control").iterdir())


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("algo.lr=nan", "algo.lr must be a finite number, got nan"),
        ("algo.lr=inf", "algo.lr must be a finite number, got inf"),
        ("algo.lr=1e400", "algo.lr must be a finite number, got inf"),
        ("algo.lr=-1", "algo.lr must be > 0 and <= 10, got -1.0"),
        ("algo.epochs=-3", "algo.epochs must be >= 1 and <= 10000, got -3"),
        ("algo.epochs=1e23", "algo.epochs takes int, got '1e23'"),
        ("algo.minibatch_size=0", "algo.minibatch_size must be >= 1, got 0"),
    ],
)
def test_set_refuses_values_out_of_range(tmp_path: Path, capsys, assignment: str, message: str) -> None:
    from pickaxe.recipes import get_recipe
    from pickaxe.runs.run import Run

    Run(tmp_path / "r", config=get_recipe("cartpole-ppo").to_dict(), tensorboard=False).close()
    assert main(["set", str(tmp_path / "r"), assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r" / "control").exists() or not list((tmp_path / "r" / "control").iterdir())


def _trainer(tmp_path: Path, total: int = 2048, **trainer):
    from pickaxe.recipes import get_recipe
    from pickaxe.runs.run import Run
    from pickaxe.train.build import build_trainer

    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.save_every, cfg.trainer.eval_every = total, 1024, 1024
    cfg.trainer.keep_last, cfg.trainer.stop_at_target = 20, False
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    run = Run(tmp_path / "r", config=cfg.to_dict(), seed=cfg.seed, tensorboard=False)
    return build_trainer(cfg, run=run), run


def test_bad_requests_dropped_into_control_are_refused_and_removed(tmp_path: Path) -> None:
    trainer, run = _trainer(tmp_path, total=512)
    control = run.path / "control"
    control.mkdir()
    requests = ['{"algo.lr": -1}', '{"lr": 0.1}', '{"algo.gamma": 0.5}', '{"algo.epochs": 1e23}', "[1, 2]"]
    for i, text in enumerate(requests):
        (control / f"{i:03d}.json").write_text(text)
    trainer.fit()
    run.close()
    assert trainer.algo.config.lr == 3e-3 and trainer.algo.config.epochs == 10
    assert not list(control.iterdir())
    assert not (run.path / "overrides.jsonl").exists()
    events = [json.loads(line)["message"] for line in (run.path / "events.jsonl").read_text().splitlines()]
    refused = [m for m in events if m.startswith("refused live change request")]
    assert len(refused) == len(requests)
    assert "algo.lr must be > 0" in refused[0] and "'lr' is not a config key" in refused[1]
    assert "algo.gamma cannot change while a run trains" in refused[2]
    assert not any("override/" in k for r in read_metrics(run.path) for k in r)


def test_a_bad_history_entry_does_not_break_every_resume(tmp_path: Path) -> None:
    trainer, run = _trainer(tmp_path, total=1024)
    trainer.fit()
    run.close()
    (run.path / "overrides.jsonl").write_text('{"step": 0, "key": "lr", "value": 0.1}\n')
    resume(run.path)  # a key without a dot used to crash here, every time
    assert (run.path / "overrides.jsonl").read_text() == ""
    assert "dropped live change lr=0.1 at step 0" in (run.path / "events.jsonl").read_text()


def test_nonfinite_after_a_live_change_stops_with_an_undo_that_works(tmp_path: Path, monkeypatch, capsys) -> None:
    import pickaxe.algos.ppo as ppo_module
    from pickaxe.train.overrides import request
    from pickaxe.train.trainer import TrainingStopped

    real = ppo_module.ppo_loss

    def loss(policy, mb, cfg, clip):  # a learning rate above 1 blows the loss up, deterministically
        out, stats = real(policy, mb, cfg, clip)
        return (out * float("nan") if cfg.lr > 1 else out), stats

    monkeypatch.setattr(ppo_module, "ppo_loss", loss)
    trainer, run = _trainer(tmp_path, total=3072)
    real_iteration = trainer._iteration

    def iteration(*args):
        if trainer.step == 1280:  # after the checkpoint at 1024
            request(run.path, {"algo.lr": 5.0})
        return real_iteration(*args)

    trainer._iteration = iteration
    with pytest.raises(TrainingStopped) as exc:
        trainer.fit()
    run.close()
    message = str(exc.value)
    assert "\n" not in message and "algo.lr=5.0 at step 1280" in message
    assert f"`pickaxe set {run.path} algo.lr=0.003` then `pickaxe resume {run.path}`" in message
    events = (run.path / "events.jsonl").read_text()
    assert "rolled back" not in events  # no doomed rollback loop
    assert json.loads((run.path / "status.json").read_text())["state"] == "stopped"

    capsys.readouterr()
    assert main(["set", str(run.path), "algo.lr=0.003"]) == 0  # the undo, as the message says
    resume(run.path)
    records = _metrics(run.path)
    assert records[-1]["step"] == 3072 and all(r["ppo/lr"] == 3e-3 for r in records)
    history = [json.loads(line) for line in (run.path / "overrides.jsonl").read_text().splitlines()]
    assert history == [{"step": 1024, "key": "algo.lr", "value": 0.003}]  # the bad value is never replayed
    for ckpt in (1024, 2048):  # later resumes replay the same history: the same numbers
        copy = tmp_path / f"copy-{ckpt}"
        shutil.copytree(run.path, copy)
        _only_checkpoint(copy, ckpt)
        resume(copy)
        assert _metrics(copy) == records


def test_set_refuses_a_finished_run(tmp_path: Path, capsys) -> None:
    trainer, run = _trainer(tmp_path, total=256)
    trainer.fit()
    run.close()
    assert main(["set", str(run.path), "algo.lr=1e-4"]) == 2
    assert "has finished" in capsys.readouterr().err
    assert not (run.path / "control").exists()
