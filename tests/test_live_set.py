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
        ("algo.lr=fast", "--algo.lr takes float, got 'fast'"),
        ("algo.lr", "expected KEY=VALUE"),
    ],
)
def test_set_refuses_bad_changes(tmp_path: Path, capsys, assignment: str, message: str) -> None:
    from pickaxe.recipes import get_recipe
    from pickaxe.runs.run import Run

    cfg = get_recipe("cartpole-ppo")
    Run(tmp_path / "r", config=cfg.to_dict(), tensorboard=False).close()
    assert main(["set", str(tmp_path / "r"), assignment]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / "control").exists() or not list((tmp_path / "r" / "control").iterdir())
