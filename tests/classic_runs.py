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
