"""The Trainer: one loop (collect, update, evaluate, log, save) for on- and off-policy algorithms."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pickaxe.algos.base import Algorithm
from pickaxe.rollout.collector import Collector
from pickaxe.runs.run import Run
from pickaxe.train.evaluate import evaluate
from pickaxe.utils import set_torch_threads


@dataclass
class TrainerConfig:
    """Loop settings shared by every recipe."""

    total_steps: int = 100_000
    """Env steps to train for."""
    eval_every: int = 10_000
    """Env steps between evaluations (0: only at the end)."""
    eval_episodes: int = 10
    target_return: float | None = None
    """Stop as soon as the eval mean return reaches this."""
    log_every: int = 0
    """Env steps between log records (0: every update). Evaluations are always logged."""


@dataclass
class FitResult:
    """Summary of ``Trainer.fit``."""

    steps: int
    wall_s: float
    eval_return: float | None = None
    best_eval_return: float | None = None
    solved_step: int | None = None
    solved_wall_s: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Runs ``algo`` with ``collector`` until ``total_steps`` env steps, evaluating on ``eval_envs``."""

    def __init__(
        self,
        algo: Algorithm,
        collector: Collector,
        eval_envs: gym.vector.VectorEnv | None = None,
        run: Run | None = None,
        config: TrainerConfig | None = None,
        progress: bool = False,
        torch_threads: int = 1,
    ) -> None:
        self.algo = algo
        self.collector = collector
        self.eval_envs = eval_envs
        self.run = run
        self.config = config or TrainerConfig()
        self.progress = progress
        self.step = 0
        set_torch_threads(torch_threads)

    def evaluate(self) -> dict[str, float]:
        """Evaluate the deterministic policy; metrics under ``eval/``."""
        assert self.eval_envs is not None
        returns, lengths = evaluate(self.algo.policy, self.eval_envs, self.config.eval_episodes, self.collector.device)
        return {
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length_mean": float(lengths.mean()),
        }

    def fit(self, total_steps: int | None = None) -> FitResult:
        """Train; returns a summary. ``total_steps`` overrides the config's."""
        cfg = self.config
        total = cfg.total_steps if total_steps is None else total_steps
        result = FitResult(steps=0, wall_s=0.0)
        start = time.perf_counter()
        next_eval = cfg.eval_every if cfg.eval_every > 0 else total
        next_log = 0
        with self._progress_bar(total) as bar:
            task = bar.add_task("train", total=total, eval="-", sps="-") if bar else None
            while self.step < total:
                self.algo.set_progress(self.step, total)
                t0 = time.perf_counter()
                batch = self.collector.collect()
                t1 = time.perf_counter()
                self.step += batch.numel()
                metrics = self.algo.update(batch)
                t2 = time.perf_counter()
                record = {**self.collector.metrics(), **metrics}
                record["time/collect_s"], record["time/update_s"] = t1 - t0, t2 - t1
                evaluated = False
                if self.eval_envs is not None and (self.step >= next_eval or self.step >= total):
                    while next_eval <= self.step:
                        next_eval += cfg.eval_every if cfg.eval_every > 0 else total
                    record.update(self.evaluate())
                    record["time/eval_s"] = time.perf_counter() - t2
                    evaluated = True
                elapsed = time.perf_counter() - start
                record["time/elapsed_s"] = elapsed
                record["time/steps_per_s"] = self.step / max(elapsed, 1e-9)
                if evaluated or self.step >= next_log or self.step >= total:
                    next_log = self.step + cfg.log_every
                    if self.run is not None:
                        self.run.log(record, self.step)
                    result.history.append({"step": self.step, **record})
                if evaluated:
                    ret = record["eval/return_mean"]
                    result.eval_return = ret
                    result.best_eval_return = max(ret, result.best_eval_return or -float("inf"))
                    if task is not None:
                        bar.update(task, eval=f"{ret:.1f}")
                    if cfg.target_return is not None and ret >= cfg.target_return:
                        result.solved_step, result.solved_wall_s = self.step, elapsed
                        if bar:
                            bar.update(task, completed=self.step)
                        break
                if bar:
                    bar.update(task, completed=self.step, sps=f"{record['time/steps_per_s']:,.0f}")
        result.steps, result.wall_s = self.step, time.perf_counter() - start
        if self.run is not None:
            self.run.save_model(self.algo.networks())
            self.run.flush()
        if self.progress:
            print_summary(result, self.run)
        return result

    def _progress_bar(self, total: int) -> Progress | _NoBar:
        if not self.progress:
            return _NoBar()
        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[cyan]{task.fields[sps]} steps/s"),
            TextColumn("eval return [green]{task.fields[eval]}"),
            TimeElapsedColumn(),
        )


class _NoBar:
    """Stand-in for a rich Progress when the bar is off."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def print_summary(result: FitResult, run: Run | None) -> None:
    """A short table at the end of training."""
    table = Table(title="pickaxe: training finished", show_header=False)
    table.add_row("env steps", f"{result.steps:,}")
    table.add_row("wall time", f"{result.wall_s:.1f} s ({result.steps / max(result.wall_s, 1e-9):,.0f} steps/s)")
    if result.eval_return is not None:
        table.add_row("final eval return", f"{result.eval_return:.1f}")
        table.add_row("best eval return", f"{result.best_eval_return:.1f}")
    if result.solved_step is not None:
        table.add_row("target reached", f"step {result.solved_step:,} after {result.solved_wall_s:.1f} s")
    if run is not None:
        table.add_row("run dir", str(run.path))
    Console().print(table)
