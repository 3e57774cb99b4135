"""Test helper: a classic run cut short and resumed, against the same run uninterrupted (the in-process form of
tests/test_resume.py's check, for an algorithm's own test file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def assert_classic_resume_is_exact(cfg: Any, tmp_path: Path, cut: int) -> list[dict]:
    """Train ``cfg`` to the end in ``tmp_path/full``; train it in ``tmp_path/cut`` up to env step ``cut`` (a multiple
    of ``eval_every``: the checkpoint there), close it as a stopped process would and ``resume`` it in a fresh
    Trainer; assert both runs end with the same weights bit for bit and the same deterministic records. Returns the
    records."""
    from safetensors.torch import load_file

    from pickaxe.runs.run import Run, read_metrics
    from pickaxe.train.build import build_trainer, resume, train

    train(cfg, run_dir=tmp_path / "full")
    run = Run(tmp_path / "cut", config=cfg.to_dict(), seed=cfg.seed)
    trainer = build_trainer(cfg, run)
    trainer.fit(total_steps=cut)
    trainer.close()
    run.close()
    resume(tmp_path / "cut")
    full, stopped = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("full", "cut"))
    assert full.keys() == stopped.keys() and all(torch.equal(full[k], stopped[k]) for k in full)
    records = read_metrics(tmp_path / "full", deterministic=True)
    assert records == read_metrics(tmp_path / "cut", deterministic=True)
    return records


def assert_killed_run_resumes_exactly(recipe: str, args: list[str], tmp_path: Path, fault: str) -> tuple[Path, Path]:
    """``pickaxe train RECIPE ARGS`` to the end in ``tmp_path/a``; the same in ``tmp_path/b`` as a process SIGKILLed
    at ``fault`` (``PICKAXE_FAULT``, e.g. ``iteration:10``), then ``pickaxe resume``d; assert both end with the same
    weights bit for bit and the same deterministic records, and the resume recorded itself as exact. Returns the
    two run folders (uninterrupted, resumed)."""
    import os
    import signal
    import subprocess
    import sys

    from safetensors.torch import load_file

    from pickaxe.cli import main
    from pickaxe.runs.run import read_metrics

    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", recipe, *args, "--run-dir", str(a), "--no-progress"]) == 0
    cmd = [sys.executable, "-m", "pickaxe.cli", "train", recipe, *args, "--run-dir", str(b), "--no-progress"]
    proc = subprocess.run(cmd, env={**os.environ, "PICKAXE_FAULT": fault}, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert main(["resume", str(b), "--no-progress"]) == 0
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    assert read_metrics(a, deterministic=True) == read_metrics(b, deterministic=True)
    assert "resume is exact" in (b / "events.jsonl").read_text()
    return a, b
