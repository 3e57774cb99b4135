"""Runs: the run directory, its manifest, metric tracking and checkpoints."""

from pickaxe.runs.run import Run, default_run_dir, load_model

__all__ = ["Run", "default_run_dir", "load_model"]
