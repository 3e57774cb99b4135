"""A live change made from the Run page's API on a real training run: applied at a logged step, recorded, and
replayed exactly by a resume from a checkpoint before it (the page's twin of ``tests/test_live_set.py``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pickaxe.runs.tracking import read_metrics
from pickaxe.ui.app import create_app

ARGS = ["--trainer.total-steps", "16384", "--save-every", "2048", "--trainer.keep-last", "20", "--no-progress"]
ARGS += ["--trainer.stop-at-target", "False"]  # the change must land before the end


@pytest.mark.slow
def test_a_change_from_the_page_is_applied_to_a_training_run_and_replayed_on_resume(tmp_path: Path) -> None:
    from pickaxe.train.build import resume

    runs = tmp_path / "runs"
    a = runs / "a"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", *ARGS, "--run-dir", str(a)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # well into training
            path = a / "metrics.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= 20:
                break
            time.sleep(0.05)
        client = TestClient(create_app(runs, queue_db=tmp_path / "q.db"))
        r = client.post("/api/run/set", json={"run": "a", "changes": {"algo.lr": "1e-4"}})
        assert r.status_code == 200, r.text
        assert proc.wait(timeout=180) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    records = read_metrics(a, deterministic=True)
    (changed,) = [r for r in records if "override/algo.lr" in r]
    step = changed["step"]
    assert changed["override/algo.lr"] == 1e-4 and all(r["ppo/lr"] == 1e-4 for r in records if r["step"] >= step)
    history = [json.loads(line) for line in (a / "overrides.jsonl").read_text().splitlines()]
    assert history == [{"step": step - 256, "key": "algo.lr", "value": 1e-4}]
    info = client.get("/api/run", params={"run": "a"}).json()
    assert info["overrides"] == history and info["status"]["state"] == "finished"
    before = max(s for s in range(2048, 16384, 2048) if s < step - 256)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    keep = f"step-{before:012d}"
    for ckpt in (b / "checkpoints").glob("step-*"):
        if ckpt.name != keep:
            shutil.rmtree(ckpt)
    (b / "checkpoints" / "latest").write_text(keep)
    resume(b)
    assert read_metrics(b, deterministic=True) == records
