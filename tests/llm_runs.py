"""Test helper: an LLM run cut short and resumed, against the same run uninterrupted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def assert_resume_is_exact(cfg: Any, tmp_path: Path, cut: int) -> list[dict]:
    """Train ``cfg`` to the end in ``tmp_path/full``; train it in ``tmp_path/cut`` up to env step ``cut`` (a
    checkpoint there), close it as a stopped process would, ``resume`` it; assert both runs end with the same
    weights bit for bit and the same deterministic records. Returns the records."""
    from safetensors.torch import load_file

    from pickaxe.runs.run import Run, read_metrics
    from pickaxe.train.build import resume, train
    from pickaxe.train.llm_runs import build_llm_run

    train(cfg, run_dir=tmp_path / "full")
    run = Run(tmp_path / "cut", config=cfg.to_dict(), seed=cfg.seed)
    trainer = build_llm_run(cfg, run)
    trainer.fit(total_steps=cut)
    trainer.close()
    run.close()
    resume(tmp_path / "cut")
    full, stopped = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("full", "cut"))
    assert all(torch.equal(full[k], stopped[k]) for k in full)
    records = read_metrics(tmp_path / "full", deterministic=True)
    assert records == read_metrics(tmp_path / "cut", deterministic=True)
    return records
