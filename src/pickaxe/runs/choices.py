"""Which weights of an LLM run can be loaded, read from its folder without importing torch (the playground lists
them at once, before any model loads; :mod:`pickaxe.train.generate` loads them)."""

from __future__ import annotations

from pathlib import Path

from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.model import MODEL_FILE
from pickaxe.runs.policies import list_policies

__all__ = ["NO_POLICY_ALGOS", "available_checkpoints"]

NO_POLICY_ALGOS = ("rm", "bon")
"""LLM run algorithms without a policy of their own: a reward model; best-of-n (it samples its start policy)."""


def available_checkpoints(run_dir: str | Path) -> list[str | int]:
    """The weights of an LLM run that :func:`pickaxe.train.generate.load_run_policy` can load, oldest first: the env
    steps of the kept policies (``RUN/policies/``) and checkpoints, then ``"final"`` when the run has its final
    model."""
    run_dir = Path(run_dir)
    steps = {info.step for info in CheckpointManager(run_dir).list()}
    steps |= {info.step for info in list_policies(run_dir)}
    out: list[str | int] = sorted(steps)
    if (run_dir / MODEL_FILE).is_file():
        out.append("final")
    return out
