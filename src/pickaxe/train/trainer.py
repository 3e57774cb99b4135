"""The Trainer: one loop (collect, update, evaluate, log, save) for on- and off-policy algorithms."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pickaxe.algos.base import Algorithm, all_finite, first_nonfinite
from pickaxe.errors import CheckpointError, NonFiniteError, PickaxeError
from pickaxe.eval.alarms import AlarmConfig, AlarmMonitor
from pickaxe.eval.selection import SelectConfig, candidates_from_records, resolve_metric, select_best
from pickaxe.eval.stats import wilson_interval
from pickaxe.faults import fault_point
from pickaxe.rollout.collector import Collector
from pickaxe.runs.checkpoint import CheckpointInfo, CheckpointManager, no_checkpoint_error
from pickaxe.runs.model import SELECTION_FILE, final_model_step, write_json_synced
from pickaxe.runs.monitor import SystemMonitor
from pickaxe.runs.policies import list_policies, prune_policies, save_policy
from pickaxe.runs.run import Run
from pickaxe.runs.tracking import read_metrics
from pickaxe.train.config import TrainerConfig
from pickaxe.train.evaluate import evaluate_episodes, mean_ci
from pickaxe.train.overrides import Override, OverrideLog, mutable_keys
from pickaxe.utils import get_rng_state, seed_everything, set_rng_state, set_torch_threads


@dataclass
class FitResult:
    """Summary of ``Trainer.fit``."""

    steps: int
    """Env steps trained in all, earlier runs of a resumed run included."""
    wall_s: float
    """Seconds of this ``fit`` call (a resumed run: since it resumed)."""
    eval_return: float | None = None
    best_eval_return: float | None = None
    solved_step: int | None = None
    solved_wall_s: float | None = None
    """Training seconds to the target, summed over every segment of a resumed run (None: not reached, or reached
    before a resume from a checkpoint that predates this record)."""
    start_step: int = 0
    """The env step this ``fit`` call started from (0 unless resumed)."""
    history: list[dict[str, Any]] = field(default_factory=list)


class TrainingStopped(PickaxeError):
    """Training stopped on purpose (e.g. the non-finite guard); the message says why and what to do."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by SIGINT or SIGTERM after checkpointing at an iteration boundary.

    A ``KeyboardInterrupt``, so the CLI exits with a nonzero status that is not 2 (130), and a supervisor
    must not restart it. ``checkpoint`` is the folder saved; the message (already printed and recorded in
    ``events.jsonl``) names it and the ``pickaxe resume`` command; ``signum`` is the signal received.
    """

    reported = True
    """The message was already printed on stderr (the CLI need not print another line)."""

    def __init__(self, message: str, signum: int, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.signum = signum
        self.checkpoint = checkpoint


METRIC = "eval/return_mean"
"""The eval metric that decides ``best_eval_return`` and the best checkpoints (``target_return`` is a value of
``trainer.target_metric``, by default this one)."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""Signals that make ``fit`` checkpoint at the next iteration boundary and stop (a second one aborts)."""


Evaluator = Callable[[Algorithm], dict[str, float]]
"""Anything that scores an algorithm's current policy, returning metrics named ``eval/...``."""


class EnvEvaluator:
    """Deterministic-policy evaluation on separate eval envs (``eval/return_mean`` with its 95% bootstrap CI over
    episodes, ``_std``, ``length_mean``)."""

    def __init__(self, envs: gym.vector.VectorEnv, episodes: int = 10, device: str | torch.device = "cpu") -> None:
        self.envs = envs
        self.episodes = episodes
        self.device = device

    def samples(self, algo: Algorithm) -> dict[str, np.ndarray]:
        """Per-episode ``return`` and ``length`` of ``algo.policy`` with ``deterministic=True``, and ``success`` when
        the env reports it (goal envs' ``info["is_success"]``)."""
        return evaluate_episodes(algo.policy, self.envs, self.episodes, self.device)

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """Evaluate ``algo.policy`` with ``deterministic=True``; ``eval/success_rate`` (with its Wilson 95% CI) when
        the env reports success."""
        values = self.samples(algo)
        returns, lengths = values["return"], values["length"]
        low, high = mean_ci(returns)
        out = {
            "eval/return_mean": float(returns.mean()),
            "eval/return_mean_ci_low": low,
            "eval/return_mean_ci_high": high,
            "eval/return_std": float(returns.std()),
            "eval/length_mean": float(lengths.mean()),
        }
        if "success" in values:
            out.update(success_metrics(values["success"]))
        return out


def success_metrics(success: np.ndarray) -> dict[str, float]:
    """``eval/success_rate`` of per-episode successes (1.0 or 0.0) with its Wilson 95% CI."""
    hits, n = int(np.sum(success)), len(success)
    low, high = wilson_interval(hits, n)
    return {"eval/success_rate": hits / max(n, 1), "eval/success_rate_ci_low": low, "eval/success_rate_ci_high": high}


class Trainer:
    """Runs ``algo`` with ``collector`` until ``total_steps`` env steps, evaluating and checkpointing.

    ``collector`` is anything with ``collect() -> Batch`` and ``metrics() -> dict``; every element of a
    collected batch counts as one env step. Evaluation uses ``evaluator`` or, given ``eval_envs``, an
    ``EnvEvaluator`` on them. With a ``run``, checkpoints go to ``run.path / "checkpoints"`` and
    ``resume()`` continues from the newest good one exactly where it left off.

    After every evaluation of a run: the acting weights are kept in ``RUN/policies`` (``trainer.keep_policies``),
    ``alarms`` (an ``AlarmConfig``) watches the eval records for reward hacking (a fired alarm is ``alarm/NAME = 1``
    in the record and an event), and ``select`` (a ``SelectConfig``) picks the best evaluated step that has kept
    weights into ``RUN/selection.json``.
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
        select: SelectConfig | None = None,
        alarms: AlarmConfig | None = None,
        eval_at_start: bool = False,
    ) -> None:
        self.algo = algo
        self.eval_at_start = eval_at_start
        """Evaluate the starting weights at step 0 (a warm-started run: the weights it starts from)."""
        self.collector = collector
        self.eval_envs = eval_envs
        self.run = run
        self.config = cfg = config or TrainerConfig()
        if evaluator is None and eval_envs is not None:
            evaluator = EnvEvaluator(eval_envs, cfg.eval_episodes, getattr(collector, "device", "cpu"))
        self.evaluator = evaluator
        self.progress = progress
        self.checkpoints = CheckpointManager(run.path, cfg.keep_last, cfg.keep_best) if run is not None else None
        self.step = 0
        self.overrides = None
        if run is not None:
            self.overrides = OverrideLog(run.path, mutable_keys(algo.config), report=self._event)
        self._next_eval = self._next_log = self._next_save = 0
        self._rollbacks = 0
        self._applied: list[tuple[Override, Any]] = []  # live changes in force, with the value each replaced
        self._stop_signal: int | None = None
        self._saved: tuple[int, Path] | None = None  # (step, folder) of the newest checkpoint this process wrote
        self._eval_metric: tuple[int, float] | None = None  # (step, value) of the newest evaluation
        self.result = FitResult(steps=0, wall_s=0.0)
        self.monitor = SystemMonitor()
        self.select = select
        self.alarms = AlarmMonitor(alarms) if alarms is not None and alarms.enabled else None
        self._evals: list[dict[str, Any]] = []  # the eval metrics of every evaluated step so far, for `select`
        self._trained_s_before: float | None = 0.0  # training seconds of the run's earlier segments (resumed runs)
        self._fit_start: float | None = None
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
        self._checkpoint_s, self._fit_start, result.start_step = 0.0, start, self.step
        if self.step == 0:
            self._next_eval = cfg.eval_every if cfg.eval_every > 0 else total
            self._next_save = cfg.save_every if cfg.save_every > 0 else total
        try:
            if self.step == 0 and self.eval_at_start and self.evaluator is not None and not result.history:
                self.evaluate_start()
            self._set_status("running", phase="training", step=self.step, total_steps=total)
            with self._stop_signals(), self._progress_bar(total) as bar:
                self._loop(total, start, bar)
            result.steps, result.wall_s = self.step, time.perf_counter() - start
            if self.run is not None:
                self._set_status("running", phase="saving", step=self.step)
                self.run.save_model(self.algo.networks(), step=self.step)
                self.save_checkpoint(self._metric_now(), background=False)
                self.write_selection()
                self.finalize()
                self.run.flush()
                self._set_status("finished", step=self.step)
        except TrainingStopped as e:
            self._set_status("stopped", step=self.step, reason=str(e))
            raise
        except BaseException as e:  # interrupted (Ctrl-C, SIGTERM: TrainingInterrupted) or crashed
            if self.checkpoints is not None:
                with contextlib.suppress(Exception):  # a background checkpoint in flight is finished, not lost
                    self.checkpoints.wait()
            if self.run is not None:
                self.run.end_with(e, step=self.step)
            raise
        if self.progress:
            print_summary(result, self.run)
        return result

    def finalize(self) -> None:
        """What a finished run does after its final model and checkpoint are saved and before ``status.json``
        reads finished (nothing here; an LLM run exports its model). A failure leaves the run crashed."""

    def _loop(self, total: int, start: float, bar: Progress | None) -> None:
        """Iterations until ``total`` env steps (or the target, if it stops the run)."""
        cfg, result = self.config, self.result
        task = bar.add_task("train", total=total, completed=self.step, eval="-", sps="-", phases="") if bar else None
        while self.step < total and not (result.solved_step is not None and cfg.stop_at_target):
            if self._stop_signal is not None:
                self._interrupt(self._stop_signal, bar)
            try:
                record = self._iteration(total, start)
            except NonFiniteError as e:
                self._handle_nonfinite(e)
                continue
            fault_point("iteration")
            if bar is not None and task is not None:
                if METRIC in record:
                    bar.update(task, eval=f"{record[METRIC]:.1f}")
                bar.update(
                    task, completed=self.step, sps=f"{record['time/steps_per_s']:,.0f}", phases=_phase_split(record)
                )

    # ------------------------------------------------------------------------------- stop signals
    @contextlib.contextmanager
    def _stop_signals(self) -> Iterator[None]:
        """While training with a Run in the main thread, SIGINT/SIGTERM ask for a checkpoint and a stop.

        The first signal sets a flag the loop reads at the next iteration boundary (the state is consistent
        there); a second SIGINT (a user pressing Ctrl-C again) raises ``KeyboardInterrupt`` at once, leaving the
        last checkpoint as it was. A repeated SIGTERM does not abort: SIGTERM comes from machines (a job queue, a
        ``--max-restarts`` supervisor, Slurm at a time limit, systemd), and several of them often reach the same
        process for one stop (Slurm signals every process of the job, a queue signals the supervisor's process
        group and the supervisor forwards it), so aborting on the second would lose the checkpoint the first asked
        for; their escalation is SIGKILL. A signal ignored by the parent (``SIG_IGN``) stays ignored; the previous
        handlers come back after ``fit``.
        """
        self._stop_signal = None
        if self.run is None or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: object) -> None:
            if self._stop_signal is not None:
                if signum != signal.SIGINT:  # the same stop, delivered again: the checkpoint goes ahead
                    return
                raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: aborted at once")
            self._stop_signal = signum
            print(
                f"pickaxe: {signal.Signals(signum).name} received: checkpointing at the end of this iteration, "
                "then stopping (press Ctrl-C again to abort at once)",
                file=sys.stderr,
            )

        previous = {}
        for sig in STOP_SIGNALS:
            handler = signal.getsignal(sig)
            if handler is not signal.SIG_IGN:
                previous[sig] = signal.SIG_DFL if handler is None else handler
                signal.signal(sig, on_signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _interrupt(self, signum: int, bar: Progress | None) -> None:
        """Checkpoint the state at this iteration boundary, record it, and raise ``TrainingInterrupted``."""
        if self.checkpoints is not None:
            self.checkpoints.wait()  # a background save of this step is then complete; a failed one raises
        path = self._saved[1] if self._saved is not None and self._saved[0] == self.step else None
        if path is None:
            path = self.save_checkpoint(self._metric_now(), background=False)
        if self.run is not None:
            self.run.flush()
        if bar is not None:
            bar.stop()  # the message goes below the finished bar, not into it
        name = signal.Signals(signum).name
        run_dir = self.run.path if self.run is not None else "RUN_DIR"
        message = (
            f"interrupted ({name}) at env step {self.step}: checkpoint {path} saved; "
            f"continue with `pickaxe resume {run_dir}`"
        )
        self._event(message, signal=name)
        raise TrainingInterrupted(message, signum, path)

    def _iteration(self, total: int, start: float) -> dict[str, Any]:
        """One collect + update (+ eval, log, checkpoint when due); returns the iteration's record."""
        cfg, result = self.config, self.result
        changes = self._apply(self.overrides.take(self.step)) if self.overrides is not None else {}
        self.algo.set_progress(self.step, total)
        t0 = time.perf_counter()
        batch = self.collector.collect()
        _check_batch(batch)
        t1, c1 = time.perf_counter(), time.process_time()
        metrics = self.algo.update(batch)
        self._check_parameters()
        self.step += batch.numel()
        t2 = time.perf_counter()
        record = {**self.collector.metrics(), **metrics, "time/collect_s": t1 - t0, "time/update_s": t2 - t1,
                  "time/update_cpu_s": time.process_time() - c1}  # fmt: skip
        record.update({f"override/{k}": v for k, v in changes.items()})
        evaluated = self.evaluator is not None and (self.step >= self._next_eval or self.step >= total)
        if evaluated:
            while self._next_eval <= self.step:
                self._next_eval += cfg.eval_every if cfg.eval_every > 0 else total
            self._set_status("running", phase="evaluating", step=self.step)
            record.update(self.evaluate())
            self._set_status("running", phase="training", step=self.step)
            record.update(self.observe_alarms(record))
            record["time/eval_s"] = time.perf_counter() - t2
        elapsed = time.perf_counter() - start
        record["time/elapsed_s"] = elapsed
        record["time/steps_per_s"] = (self.step - result.start_step) / max(elapsed, 1e-9)
        if evaluated or self.step >= self._next_log or self.step >= total:
            self._next_log = self.step + cfg.log_every
            record.update(self.monitor.read())
            record["time/checkpoint_s"], self._checkpoint_s = self._checkpoint_s, 0.0
            if self.run is not None:
                self.run.log(record, self.step)
                self.run.report_progress(step=self.step)
            result.history.append({"step": self.step, **record})
        metric = record.get(METRIC) if evaluated else None
        improved = False
        if metric is not None:
            self._eval_metric = (self.step, metric)
            result.eval_return = metric
            improved = result.best_eval_return is None or metric > result.best_eval_return
            result.best_eval_return = max(metric, result.best_eval_return or -float("inf"))
        target = record.get(cfg.target_metric) if evaluated else None
        reached = target is not None and cfg.target_return is not None and target >= cfg.target_return
        if reached and result.solved_step is None:
            result.solved_step, result.solved_wall_s = self.step, self._trained_s(elapsed)
        due = cfg.save_every > 0 and self.step >= self._next_save
        if due:
            while self._next_save <= self.step:
                self._next_save += cfg.save_every
        wanted = due or (metric is not None and (cfg.save_at_eval or (improved and cfg.keep_best > 0)))
        # the last iteration and a stop at the target are followed at once by the final checkpoint
        final = self.step >= total or (result.solved_step is not None and cfg.stop_at_target)
        t3 = time.perf_counter()
        if self.run is not None and wanted and not final:
            self.save_checkpoint(metric)
        if evaluated:
            self.keep_evaluated(record)
        self._checkpoint_s += time.perf_counter() - t3
        return record

    def evaluate_start(self) -> None:
        """Evaluate the weights at step 0, before any update, logged and kept like every evaluation (a warm-started
        run's curve then starts where the run it continues ended)."""
        result, start = self.result, time.perf_counter()
        self._set_status("running", phase="evaluating", step=self.step)
        record: dict[str, Any] = dict(self.evaluate())
        record.update(self.observe_alarms(record))
        record["time/eval_s"] = time.perf_counter() - start
        if self.run is not None:
            self.run.log(record, self.step)
        result.history.append({"step": self.step, **record})
        metric = record.get(METRIC)
        if metric is not None:
            self._eval_metric = (self.step, metric)
            result.eval_return = result.best_eval_return = metric
            if self.config.target_return is not None and metric >= self.config.target_return:
                result.solved_step, result.solved_wall_s = self.step, self._trained_s(0.0)
        self.keep_evaluated(record)

    # ------------------------------------------------------------------- after an evaluation
    def observe_alarms(self, record: dict[str, Any]) -> dict[str, float]:
        """Feed an evaluation's record (at the current step) to the alarm monitor; each alarm that fires is
        reported (terminal and ``events.jsonl``) and returned as ``{"alarm/NAME": 1.0}`` for the record."""
        if self.alarms is None:
            return {}
        fired = self.alarms.observe(self.step, record)
        for alarm in fired:
            self._event(alarm.message, alarm=alarm.name, values=dict(alarm.values))
        return {f"alarm/{alarm.name}": 1.0 for alarm in fired}

    def keep_evaluated(self, record: dict[str, Any]) -> None:
        """After an evaluation at the current step was logged: keep the acting weights with the eval metrics
        (``trainer.keep_policies``) and rewrite ``selection.json``. Needs a Run (else nothing happens)."""
        if self.run is None:
            return
        evals = self._remember_evals(self.step, record)
        if self.config.keep_policies:
            save_policy(self.run.path, self.algo.networks(), self.step, evals)
        self.write_selection()

    def _remember_evals(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """Keep ``record``'s ``eval/`` and ``alarm/`` fields as the evaluation of ``step`` (replacing an older one
        of that step) for ``write_selection``; returns them."""
        evals = {k: v for k, v in record.items() if k.startswith(("eval/", "alarm/"))}
        if evals:
            self._evals = [r for r in self._evals if r["step"] != step] + [{"step": step, **evals}]
        return evals

    def write_selection(self) -> None:
        """Write ``RUN/selection.json``: the ``select`` rule's best over the evaluated steps whose weights are kept
        (a policy, a checkpoint or the final model); nothing without a Run, a ``select`` config or a candidate."""
        if self.run is None or self.select is None:
            return
        kept = {p.step for p in list_policies(self.run.path)}
        kept |= {i.step for i in self.checkpoints.list()} if self.checkpoints is not None else set()
        final_step = final_model_step(self.run.path)
        if final_step is not None:
            kept.add(final_step)
        records = [r for r in self._evals if r["step"] in kept]
        metric = resolve_metric(self.select, {k for r in records for k in r})
        if metric is None:
            return
        selection = select_best(candidates_from_records(records, metric), self.select, metric)
        if selection is None:
            return
        doc = {**asdict(selection), "mode": self.select.mode, "candidates": len(records)}
        write_json_synced(self.run.path / SELECTION_FILE, doc)

    def _metric_now(self) -> float | None:
        """The eval metric of the current step, if this step was evaluated (a checkpoint here carries it)."""
        return self._eval_metric[1] if self._eval_metric is not None and self._eval_metric[0] == self.step else None

    def _apply(self, overrides: list[Override], announce: bool = True) -> dict[str, Any]:
        """Set live changes on the algorithm's or the loop's config (``algo.lr``, ``trainer.eval_every``).

        Each change was checked against the allow-list and the field's range by the ``OverrideLog``.
        """
        for o in overrides:
            section, name = o.key.split(".", 1)
            target = self.algo.config if section == "algo" else self.config
            self._applied.append((o, getattr(target, name)))
            setattr(target, name, o.value)
            if announce:
                self._event(f"set {o.key}={o.value!r} at step {o.step}")
        return {o.key: o.value for o in overrides}

    def _check_parameters(self) -> None:
        """Refuse non-finite weights after an update: one host read for all networks, names only on failure."""
        networks = self.algo.networks()
        if all_finite(p for net in networks.values() for p in net.parameters()):
            return
        for net_name, net in networks.items():
            bad = first_nonfinite(net.named_parameters())
            if bad is not None:
                raise NonFiniteError(f"{net_name} {bad}", source="parameter")

    def _handle_nonfinite(self, error: NonFiniteError) -> None:
        """Stop (naming a recent live change and its undo, if one preceded it) or roll back to the newest good
        checkpoint and take a different random path."""
        cfg, step = self.config, self.step
        latest = self.checkpoints.latest(on_skip=self._event) if self.checkpoints is not None else None
        what = _nonfinite_what(error, step)
        run_dir = self.run.path if self.run is not None else "RUN_DIR"
        recent = [(o, old) for o, old in self._applied if latest is None or o.step >= latest.step]
        if recent:  # a rollback would bring the same change back: stop and say how to undo it
            first: dict[str, Any] = {}
            for o, old in recent:
                first.setdefault(o.key, old)
            last = {o.key: o for o, _ in recent}
            made = ", ".join(f"{k}={o.value!r} at step {o.step}" for k, o in last.items())
            undo = " ".join(f"{k}={_cli_value(v)}" for k, v in first.items())
            since = f"checkpoint at step {latest.step}" if latest is not None else "start"
            self._event(f"{what}; stopping: it follows the live change {made}")
            raise TrainingStopped(
                f"{what}, after the live change {made} (since the {since}); training stopped. Undo it with "
                f"`pickaxe set {run_dir} {undo}` then `pickaxe resume {run_dir}`"
            ) from error
        if cfg.on_nonfinite == "stop" or latest is None or self._rollbacks >= cfg.max_rollbacks:
            why = (
                "trainer.on_nonfinite=stop"
                if cfg.on_nonfinite == "stop"
                else "no checkpoint to roll back to"
                if latest is None
                else f"{self._rollbacks} rollbacks already (trainer.max_rollbacks)"
            )
            advice = (
                "check the env's rewards and observations"
                if error.source == "input"
                else "lower algo.lr (or algo.max_grad_norm) or check the reward scale"
            )
            then = (
                f"`pickaxe resume {run_dir}` continues from the last checkpoint"
                if latest is not None
                else "there is no checkpoint to resume from"
            )
            self._event(f"{what}; stopping ({why})")
            raise TrainingStopped(f"{what}; training stopped ({why}). {advice.capitalize()}; {then}") from error
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
                "solved_wall_s": r.solved_wall_s,
                "trained_s": self._trained_s(0.0 if self._fit_start is None else time.perf_counter() - self._fit_start),
            },
            "algo": self.algo.state_dict(),
            "collector": self.collector.state_dict(),
            "rng": get_rng_state(),
            **({"alarms": self.alarms.state_dict()} if self.alarms is not None else {}),
        }

    def _trained_s(self, elapsed: float) -> float | None:
        """Training seconds of the whole run: the earlier segments' and ``elapsed`` of this one (None when an earlier
        segment's are unknown)."""
        return None if self._trained_s_before is None else self._trained_s_before + elapsed

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``: algorithm and collector first (they refuse foreign state), then the loop
        counters, random generators last."""
        t = state["trainer"]
        step = int(t["step"])
        counters = (int(t["next_eval"]), int(t["next_log"]), int(t["next_save"]), int(t["rollbacks"]))
        self.algo.load_state_dict(state["algo"])
        # envs whose state cannot be captured restart from a seed fixed by the step: deterministic resume
        self.collector.load_state_dict(state["collector"], reseed=step * 1_000_003 % 2**31)
        self.step = step
        self._next_eval, self._next_log, self._next_save, self._rollbacks = counters
        self.result.eval_return, self.result.best_eval_return = t["eval_return"], t["best_eval_return"]
        self.result.solved_step = t["solved_step"]
        self.result.solved_wall_s = t.get("solved_wall_s")  # absent from checkpoints written before it was kept
        self._trained_s_before = t.get("trained_s")  # likewise: None leaves a later solved_wall_s unknown
        if self.alarms is not None and "alarms" in state:
            self.alarms.load_state_dict(state["alarms"])
        set_rng_state(state["rng"])

    def save_checkpoint(self, metric: float | None = None, background: bool | None = None) -> Path | None:
        """Write a checkpoint of the current state (needs a Run); ``metric`` ranks it for ``keep_best``. With
        ``background`` (default: ``--trainer.async-checkpoint``) it returns once the state is copied to host memory
        and is written while training goes on; returns the checkpoint's folder either way.

        Saving only reads the state: a run's numbers are the same whichever checkpoints it writes.
        """
        if self.checkpoints is None:
            return None
        support = self.collector.state_support() if hasattr(self.collector, "state_support") else "deterministic"
        meta = {"env_state": support, "algo": type(self.algo).__name__}
        background = self.config.async_checkpoint if background is None else background
        save = self.checkpoints.save_async if background else self.checkpoints.save
        path = save(self.step, self.state_dict(), metric=metric, meta=meta)
        self._saved = (self.step, path)
        return path

    def _accept(self, state: dict[str, Any], info: CheckpointInfo) -> None:
        """Load a checkpoint's state into this trainer, refusing another algorithm's (the fallback goes on)."""
        algo = info.meta.get("algo")
        if algo is not None and algo != type(self.algo).__name__:
            raise CheckpointError(
                f"checkpoint {info.path}: holds the state of a {algo} run, this run trains {type(self.algo).__name__}"
            )
        self.load_state_dict(state)

    def resume(self, allow_empty: bool = False) -> CheckpointInfo | None:
        """Continue from the newest good checkpoint of the run; returns it.

        A checkpoint is good if its files verify *and* its state loads into this trainer's algorithm and
        collector; damaged ones (each reported once, on stderr and in ``events.jsonl``) are skipped for older
        ones, and ``CheckpointError`` (a ``PickaxeError``) is raised if none is good. A run without any
        checkpoint raises ``PickaxeError``, unless ``allow_empty`` (then it starts again from step 0 and None is
        returned). ``metrics.jsonl`` is cut back to the checkpoint's step so the resumed run appends no
        duplicated and no missing steps.
        """
        if self.checkpoints is None or self.run is None:
            raise RuntimeError("resume needs a Trainer with a Run")
        if not self.checkpoints.list():
            if not allow_empty:
                raise no_checkpoint_error(self.run.path)
            self.run.rewind(0)
            prune_policies(self.run.path, 0)
            self._reload_evals()
            return None
        _, info = self.checkpoints.load(accept=self._accept, on_skip=self._event)
        self._applied, self._saved, self._eval_metric = [], None, None
        if self.overrides is not None:  # changes made before the checkpoint are part of its config
            self._apply(self.overrides.before(self.step), announce=False)
        self.run.rewind(self.step)
        prune_policies(self.run.path, self.step)  # they belong to the future this resume abandons
        self._reload_evals()
        support = info.meta.get("env_state", "deterministic")
        how = "exact" if support == "exact" else "deterministic (env state not capturable: episodes restart)"
        self._event(f"resumed from {info.path.name} at step {self.step}; resume is {how}")
        return info

    def _reload_evals(self) -> None:
        """The eval records of the run up to its (rewound) step, as ``keep_evaluated`` collected them."""
        assert self.run is not None
        self._evals = []
        for r in read_metrics(self.run.path):
            self._remember_evals(r["step"], r)

    def _event(self, message: str, **fields: Any) -> None:
        """Record ``message`` in ``events.jsonl`` and print it once on stderr (without a Run: print only)."""
        if self.run is not None:
            self.run.event(message, step=self.step, **fields)
        else:
            print(f"pickaxe: {message}", file=sys.stderr)

    def _set_status(self, state: str, **fields: Any) -> None:
        """Record the run's state (running, finished, interrupted, crashed, stopped) in its ``status.json``.

        The end states are written while an exception is on its way out: a failure to write them must not
        replace that exception.
        """
        if self.run is None:
            return
        if state in ("running", "finished"):
            self.run.set_status(state, **fields)
            return
        with contextlib.suppress(Exception):
            self.run.set_status(state, **fields)

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


def _check_batch(batch: Any) -> None:
    """Raise ``NonFiniteError`` (source ``input``) if a reward or observation of the batch is NaN/Inf."""
    keys = batch.keys() if hasattr(batch, "keys") else ()
    checked = {k: batch[k] for k in ("reward", "obs", "next_obs") if k in keys}
    checked = {k: t for k, t in checked.items() if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if all_finite(checked.values()):  # one host read for the batch
        return
    for key, t in checked.items():
        if not torch.isfinite(t).all():
            raise NonFiniteError(f"{key} in the collected batch", source="input")


def _nonfinite_what(error: NonFiniteError, step: int) -> str:
    """What was found and what it did, true to where the guard caught it."""
    if error.source == "input":
        return f"non-finite {error.what} after env step {step}; no update was made from it"
    if error.source == "parameter":
        return f"non-finite {error.what} after the update at env step {step}; that update was applied"
    return f"non-finite {error.what} in the update after env step {step}; that optimizer step was not applied"


def _cli_value(value: Any) -> str:
    """``value`` as ``pickaxe set`` parses it back (``0.003``, ``None``, ``True``)."""
    return repr(value) if isinstance(value, float) else str(value)


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
    rate = (result.steps - result.start_step) / max(result.wall_s, 1e-9)
    since = f", resumed at step {result.start_step:,}" if result.start_step else ""
    table.add_row("wall time", f"{result.wall_s:.1f} s ({rate:,.0f} steps/s{since})")
    if result.eval_return is not None:
        table.add_row("final eval return", f"{result.eval_return:.1f}")
        table.add_row("best eval return", f"{result.best_eval_return:.1f}")
    if result.solved_step is not None:
        after = "" if result.solved_wall_s is None else f" after {result.solved_wall_s:.1f} s"
        table.add_row("target reached", f"step {result.solved_step:,}{after}")
    if run is not None:
        table.add_row("run dir", str(run.path))
    Console().print(table)
