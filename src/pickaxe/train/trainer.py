"""The Trainer: one loop (collect, update, evaluate, log, save) for on- and off-policy algorithms."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pickaxe.algos.base import Algorithm, first_nonfinite
from pickaxe.errors import NonFiniteError, PickaxeError
from pickaxe.faults import fault_point
from pickaxe.rollout.collector import Collector
from pickaxe.runs.checkpoint import CheckpointInfo, CheckpointManager
from pickaxe.runs.monitor import SystemMonitor
from pickaxe.runs.run import Run
from pickaxe.train.config import TrainerConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.train.overrides import Override, OverrideLog
from pickaxe.utils import get_rng_state, seed_everything, set_rng_state, set_torch_threads


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


class TrainingStopped(PickaxeError):
    """Training stopped on purpose (e.g. the non-finite guard); the message says why and what to do."""


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
    """Runs ``algo`` with ``collector`` until ``total_steps`` env steps, evaluating and checkpointing.

    ``collector`` is anything with ``collect() -> Batch`` and ``metrics() -> dict``; every element of a
    collected batch counts as one env step. Evaluation uses ``evaluator`` or, given ``eval_envs``, an
    ``EnvEvaluator`` on them. With a ``run``, checkpoints go to ``run.path / "checkpoints"`` and
    ``resume()`` continues from the newest good one exactly where it left off.
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
        self.config = cfg = config or TrainerConfig()
        if evaluator is None and eval_envs is not None:
            evaluator = EnvEvaluator(eval_envs, cfg.eval_episodes, getattr(collector, "device", "cpu"))
        self.evaluator = evaluator
        self.progress = progress
        self.checkpoints = CheckpointManager(run.path, cfg.keep_last, cfg.keep_best) if run is not None else None
        self.overrides = OverrideLog(run.path) if run is not None else None
        self.step = 0
        self._next_eval = self._next_log = self._next_save = 0
        self._rollbacks = 0
        self.result = FitResult(steps=0, wall_s=0.0)
        self.monitor = SystemMonitor()
        set_torch_threads(torch_threads)

    def evaluate(self) -> dict[str, float]:
        """Run the evaluator on the current policy; metrics under ``eval/``."""
        if self.evaluator is None:
            raise RuntimeError("this Trainer has no eval_envs or evaluator")
        return self.evaluator(self.algo)

    # ------------------------------------------------------------------------------------------ loop
    def fit(self, total_steps: int | None = None) -> FitResult:
        """Train until ``total_steps`` env steps (default: the config's); returns a summary."""
        cfg = self.config
        total = cfg.total_steps if total_steps is None else total_steps
        result = self.result
        start = time.perf_counter()
        self._start_step, self._checkpoint_s = self.step, 0.0
        if self.step == 0:
            self._next_eval = cfg.eval_every if cfg.eval_every > 0 else total
            self._next_save = cfg.save_every if cfg.save_every > 0 else total
        with self._progress_bar(total) as bar:
            task = (
                bar.add_task("train", total=total, completed=self.step, eval="-", sps="-", phases="") if bar else None
            )
            while self.step < total and result.solved_step is None:
                try:
                    record = self._iteration(total, start)
                except NonFiniteError as e:
                    self._handle_nonfinite(e)
                    continue
                fault_point("iteration")
                if task is not None:
                    if "eval/return_mean" in record:
                        bar.update(task, eval=f"{record['eval/return_mean']:.1f}")
                    bar.update(
                        task, completed=self.step, sps=f"{record['time/steps_per_s']:,.0f}", phases=_phase_split(record)
                    )
        result.steps, result.wall_s = self.step, time.perf_counter() - start
        if self.run is not None:
            self.run.save_model(self.algo.networks())
            self.save_checkpoint()
            self.run.flush()
        if self.progress:
            print_summary(result, self.run)
        return result

    def _iteration(self, total: int, start: float) -> dict[str, Any]:
        """One collect + update (+ eval, log, checkpoint when due); returns the iteration's record."""
        cfg, result = self.config, self.result
        changes = self._apply(self.overrides.take(self.step)) if self.overrides is not None else {}
        self.algo.set_progress(self.step, total)
        t0 = time.perf_counter()
        batch = self.collector.collect()
        t1 = time.perf_counter()
        metrics = self.algo.update(batch)
        self._check_parameters()
        self.step += batch.numel()
        t2 = time.perf_counter()
        record = {**self.collector.metrics(), **metrics, "time/collect_s": t1 - t0, "time/update_s": t2 - t1}
        record.update({f"override/{k}": v for k, v in changes.items()})
        evaluated = self.evaluator is not None and (self.step >= self._next_eval or self.step >= total)
        if evaluated:
            while self._next_eval <= self.step:
                self._next_eval += cfg.eval_every if cfg.eval_every > 0 else total
            record.update(self.evaluate())
            record["time/eval_s"] = time.perf_counter() - t2
        elapsed = time.perf_counter() - start
        record["time/elapsed_s"] = elapsed
        record["time/steps_per_s"] = (self.step - self._start_step) / max(elapsed, 1e-9)
        if evaluated or self.step >= self._next_log or self.step >= total:
            self._next_log = self.step + cfg.log_every
            record.update(self.monitor.read())
            record["time/checkpoint_s"], self._checkpoint_s = self._checkpoint_s, 0.0
            if self.run is not None:
                self.run.log(record, self.step)
            result.history.append({"step": self.step, **record})
        metric = record.get("eval/return_mean") if evaluated else None
        if metric is not None:
            result.eval_return = metric
            result.best_eval_return = max(metric, result.best_eval_return or -float("inf"))
            if cfg.target_return is not None and metric >= cfg.target_return:
                result.solved_step, result.solved_wall_s = self.step, elapsed
        if self.run is not None and cfg.save_every > 0 and self.step >= self._next_save and self.step < total:
            while self._next_save <= self.step:
                self._next_save += cfg.save_every
            if result.solved_step is None:  # the final checkpoint follows at once otherwise
                t3 = time.perf_counter()
                self.save_checkpoint(metric)
                self._checkpoint_s += time.perf_counter() - t3
        return record

    def _apply(self, overrides: list[Override], announce: bool = True) -> dict[str, Any]:
        """Set live changes on the algorithm's or the loop's config (``algo.lr``, ``trainer.eval_every``)."""
        for o in overrides:
            section, name = o.key.split(".", 1)
            setattr(self.algo.config if section == "algo" else self.config, name, o.value)
            if announce:
                self._event(f"set {o.key}={o.value!r} at step {o.step}")
        return {o.key: o.value for o in overrides}

    def _check_parameters(self) -> None:
        for net_name, net in self.algo.networks().items():
            bad = first_nonfinite(net.named_parameters())
            if bad is not None:
                raise NonFiniteError(f"{net_name} {bad}")

    def _handle_nonfinite(self, error: NonFiniteError) -> None:
        """Roll back to the newest good checkpoint (then take a different random path) or stop."""
        cfg, step = self.config, self.step
        can_roll_back = self.checkpoints is not None and self.checkpoints.latest() is not None
        if cfg.on_nonfinite == "stop" or not can_roll_back or self._rollbacks >= cfg.max_rollbacks:
            why = (
                "trainer.on_nonfinite=stop"
                if cfg.on_nonfinite == "stop"
                else "no checkpoint to roll back to"
                if not can_roll_back
                else f"{self._rollbacks} rollbacks already (trainer.max_rollbacks)"
            )
            self._event(f"non-finite {error.what} at step {step}; stopping ({why})")
            raise TrainingStopped(
                f"non-finite {error.what} in the update after env step {step}; that optimizer step was not applied and "
                f"training stopped ({why}). Lower the learning rate or check the reward scale; "
                "`pickaxe resume RUN_DIR` continues from the last checkpoint."
            ) from error
        rollbacks = self._rollbacks + 1
        info = self.resume()
        self._rollbacks = rollbacks
        # The restored RNG would replay the same batch into the same NaN: branch to a new, still
        # reproducible, random stream.
        seed_everything(self.step * 7919 + rollbacks)
        self._event(
            f"non-finite {error.what} at step {step}; rolled back to checkpoint {info.path.name} "
            f"(rollback {rollbacks}/{cfg.max_rollbacks}), reseeded"
        )

    # ------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: algorithm, collector (env states), loop counters, RNGs."""
        r = self.result
        return {
            "trainer": {
                "step": self.step,
                "next_eval": self._next_eval,
                "next_log": self._next_log,
                "next_save": self._next_save,
                "rollbacks": self._rollbacks,
                "eval_return": r.eval_return,
                "best_eval_return": r.best_eval_return,
                "solved_step": r.solved_step,
            },
            "algo": self.algo.state_dict(),
            "collector": self.collector.state_dict(),
            "rng": get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; random generators are restored last."""
        t = state["trainer"]
        self.step = int(t["step"])
        self._next_eval, self._next_log, self._next_save = int(t["next_eval"]), int(t["next_log"]), int(t["next_save"])
        self._rollbacks = int(t["rollbacks"])
        self.result.eval_return, self.result.best_eval_return = t["eval_return"], t["best_eval_return"]
        self.result.solved_step = t["solved_step"]
        self.algo.load_state_dict(state["algo"])
        # envs whose state cannot be captured restart from a seed fixed by the step: deterministic resume
        self.collector.load_state_dict(state["collector"], reseed=self.step * 1_000_003 % 2**31)
        set_rng_state(state["rng"])

    def save_checkpoint(self, metric: float | None = None) -> Path | None:
        """Write a checkpoint of the current state (needs a Run)."""
        if self.checkpoints is None:
            return None
        support = self.collector.state_support() if hasattr(self.collector, "state_support") else "deterministic"
        return self.checkpoints.save(self.step, self.state_dict(), metric=metric, meta={"env_state": support})

    def resume(self) -> CheckpointInfo | None:
        """Continue from the newest good checkpoint of the run; returns it, or None if there is none.

        Bad checkpoints are reported and skipped. ``metrics.jsonl`` is cut back to the checkpoint's step so
        the resumed run appends no duplicated and no missing steps.
        """
        if self.checkpoints is None or self.run is None:
            raise RuntimeError("resume needs a Trainer with a Run")
        if not self.checkpoints.list():
            self.run.rewind(0)
            return None
        state, info = self.checkpoints.load()
        self.load_state_dict(state)
        if self.overrides is not None:  # changes made before the checkpoint are part of its config
            self._apply(self.overrides.before(self.step), announce=False)
        self.run.rewind(self.step)
        support = info.meta.get("env_state", "deterministic")
        how = "exact" if support == "exact" else "deterministic (env state not capturable: episodes restart)"
        self._event(f"resumed from {info.path.name} at step {self.step}; resume is {how}")
        return info

    def _event(self, message: str) -> None:
        if self.run is not None:
            self.run.event(message, step=self.step)

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
            TextColumn("[dim]{task.fields[phases]}"),
            TimeElapsedColumn(),
        )


def _phase_split(record: dict[str, Any]) -> str:
    """Where the iteration's wall time went, e.g. ``collect 31% update 66% eval 3%``."""
    phases = {k: record.get(f"time/{k}_s", 0.0) for k in ("collect", "update", "eval")}
    total = sum(phases.values()) or 1.0
    return " ".join(f"{k} {100 * v / total:.0f}%" for k, v in phases.items() if v > 0)


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
