"""The Trainer: one loop (collect, update, evaluate, log, save) for on- and off-policy algorithms."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch
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


Evaluator = Callable[[Algorithm], dict[str, float]]
"""Anything that scores an algorithm's current policy, returning metrics named ``eval/...``."""


class EnvEvaluator:
    """Deterministic-policy evaluation on separate eval envs (``eval/return_mean``, ``_std``, ``length_mean``)."""

    def __init__(self, envs: gym.vector.VectorEnv, episodes: int = 10, device: str | torch.device = "cpu") -> None:
        self.envs = envs
        self.episodes = episodes
        self.device = device

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo.policy`` with ``deterministic=True``."""
        returns, lengths = evaluate(algo.policy, self.envs, self.episodes, self.device)
        return {
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length_mean": float(lengths.mean()),
        }


class Trainer:
    """Runs ``algo`` with ``collector`` until ``total_steps`` env steps, evaluating periodically.

    ``collector`` is anything with ``collect() -> Batch`` and ``metrics() -> dict``; every element of a
    collected batch counts as one env step. Evaluation uses ``evaluator`` or, given ``eval_envs``, an
    ``EnvEvaluator`` on them.
    """

    def __init__(
        self,
        algo: Algorithm,
        collector: Collector,
        eval_envs: gym.vector.VectorEnv | None = None,
        run: Run | None = None,
        config: TrainerConfig | None = None,
        progress: bool = False,
        torch_threads: int = 1,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.algo = algo
        self.collector = collector
        self.eval_envs = eval_envs
        self.run = run
        self.config = config or TrainerConfig()
        if evaluator is None and eval_envs is not None:
            evaluator = EnvEvaluator(eval_envs, self.config.eval_episodes, getattr(collector, "device", "cpu"))
        self.evaluator = evaluator
        self.progress = progress
        self.step = 0
        set_torch_threads(torch_threads)

    def evaluate(self) -> dict[str, float]:
        """Run the evaluator on the current policy; metrics under ``eval/``."""
        if self.evaluator is None:
            raise RuntimeError("this Trainer has no eval_envs or evaluator")
        return self.evaluator(self.algo)

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
                if self.evaluator is not None and (self.step >= next_eval or self.step >= total):
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
                if evaluated and "eval/return_mean" in record:
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

    def close(self) -> None:
        """Close the collector's and evaluator's environments (if they have any)."""
        for owner in (self.collector, self.evaluator):
            envs = getattr(owner, "envs", None)
            if envs is not None and hasattr(envs, "close"):
                envs.close()

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
