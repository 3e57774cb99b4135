"""``Run``: one directory holding a run's config, manifest, metrics, events, status and model.

The folder's safety checks live in :mod:`pickaxe.runs.folder`, the verified model file in :mod:`pickaxe.runs.model`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.runs.folder import check_new_run_dir, disk_error, make_dirs, move_aside, unique_path
from pickaxe.runs.manifest import build_manifest, to_jsonable
from pickaxe.runs.model import save_model
from pickaxe.runs.status import PHASES, read_status, status_wall_s, write_status
from pickaxe.runs.tracking import (
    TRACKERS,
    JsonlLogger,
    PrometheusSink,
    TensorBoardLogger,
    check_port,
    check_tracker,
    read_metrics,  # noqa: F401 - where callers have always found it
)

STATUS_EVERY_S = 2.0
"""The most often :meth:`Run.report_progress` rewrites ``status.json`` (phase changes and end states are written at
once)."""
_KEPT_STATUS_FIELDS = ("phase", "step", "total_steps")
"""Status fields a run keeps from one ``set_status`` to the next (the others, e.g. ``reason``, are one write's)."""


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    """``runs/<name>-<timestamp>``, made unique if that folder exists."""
    return unique_path(Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


class Run:
    """A run directory: ``config.json``, ``manifest.json``, ``metrics.jsonl``, ``events.jsonl``, TensorBoard
    events, ``checkpoints/``, ``status.json`` and the final ``model.safetensors`` (+ ``model.json``, its digest).

    Every log record carries ``step`` (env steps so far); wall-clock fields are namespaced ``time/``.
    A new ``Run`` refuses a folder that already holds a run unless ``overwrite=True``, which moves the old run
    aside to ``<folder>.old-<timestamp>`` (nothing is deleted). Every check (trackers, Prometheus port, the
    folder can be created and written) runs before anything is written; if creating the run fails midway, what
    it created is removed again. ``Run.open`` reattaches to an existing directory (for resuming) without
    rewriting its config.
    """

    def __init__(
        self,
        path: str | Path,
        config: Any = None,
        seed: int | None = None,
        tensorboard: bool = True,
        track: tuple[str, ...] = (),
        prometheus_port: int | None = None,
        overwrite: bool = False,
    ) -> None:
        for name in track:
            check_tracker(name)
        if prometheus_port is not None:
            check_port(prometheus_port)
        self.path = Path(path)
        had_run = check_new_run_dir(self.path, overwrite)
        self._tensorboard = tensorboard
        self._sinks: list[Any] = []
        self._extra_sinks: list[Any] = []
        self._moved_to: Path | None = None
        self._created: list[Path] | None = None  # None: nothing to undo
        self._preexisting: set[str] = set()
        self._start_status_clock(0.0)
        try:
            if had_run:
                self._moved_to = move_aside(self.path)
            self._preexisting = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
            self._created = make_dirs(self.path)
            config_json = to_jsonable(config)
            if config is not None:
                self._write_json("config.json", config_json)
            self._write_json("manifest.json", build_manifest(config, seed))
            self.event("started", echo=False, step=0, pid=os.getpid(), hostname=socket.gethostname())
            self._open_sinks(purge_step=None)
            self._extra_sinks = _extra_sinks(self.path, config_json, track, prometheus_port)
            if self._moved_to is not None:
                self.event(f"moved the run that was in {self.path} to {self._moved_to}", moved_to=str(self._moved_to))
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Undo the creation of this run: close it and remove what it wrote (the folder too if it made it), and put
        back a run that ``overwrite`` moved aside. For a run that failed before training started, never after."""
        self.close()
        created, moved_to = getattr(self, "_created", None), getattr(self, "_moved_to", None)
        if created:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in created[1:]:  # parents this run made, innermost first; kept if anyone else wrote there
                try:
                    parent.rmdir()
                except OSError:
                    break
        elif created is not None:
            for p in self.path.iterdir():
                if p.name not in self._preexisting:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
        if moved_to is not None and moved_to.is_dir() and not self.path.exists():
            with contextlib.suppress(OSError):
                os.replace(moved_to, self.path)
        self._created = None
        self._moved_to = None

    @classmethod
    def open(
        cls, path: str | Path, tensorboard: bool = True, track: tuple[str, ...] = (), prometheus_port: int | None = None
    ) -> Run:
        """Reattach to an existing run directory; call ``rewind(step)`` before logging."""
        run = cls.__new__(cls)
        run.path = Path(path)
        if not (run.path / "config.json").is_file():
            raise PickaxeError(f"{run.path} is not a run directory: config.json is missing")
        run._tensorboard = tensorboard
        run._sinks = []
        run._extra_sinks = _extra_sinks(run.path, None, track, prometheus_port) if track or prometheus_port else []
        run._start_status_clock(status_wall_s(read_status(run.path)))  # the earlier segments' seconds, if known
        return run

    def _start_status_clock(self, wall_before: float | None) -> None:
        """Start this segment's clock for ``status.json``'s ``wall_s`` (``wall_before``: the earlier segments'
        seconds; None when unknown, then no ``wall_s`` is written)."""
        self._started = time.time()
        self._wall_before = wall_before
        self._status: dict[str, Any] = {}
        self._status_written = -math.inf

    def config(self) -> dict[str, Any]:
        """The run's ``config.json``."""
        path = self.path / "config.json"
        try:
            data = json.loads(path.read_bytes())
        except OSError as e:
            raise PickaxeError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise PickaxeError(
                f"{path} is not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}); "
                "restore it from a copy or delete the run"
            ) from None
        except ValueError as e:  # json.JSONDecodeError
            raise PickaxeError(f"{path} is not valid JSON ({e}); restore it from a copy or delete the run") from None
        if not isinstance(data, dict):
            raise PickaxeError(f"{path} must hold a JSON object, got {type(data).__name__}; restore it from a copy")
        return data

    def _open_sinks(self, purge_step: int | None) -> None:
        self._sinks = [JsonlLogger(self.path / "metrics.jsonl")]
        if self._tensorboard:
            self._sinks.append(TensorBoardLogger(self.path / "tensorboard", purge_step=purge_step))

    def rewind(self, step: int) -> None:
        """Drop every metric logged after ``step`` (and a torn last line), then reopen the sinks.

        A resumed run calls this with its checkpoint's step, so ``metrics.jsonl`` ends up with each
        step exactly once. The file is rewritten atomically.
        """
        self._close_sinks()
        path = self.path / "metrics.jsonl"
        kept: list[str] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a write torn by a kill
                if record.get("step", 0) <= step:
                    kept.append(line)
        tmp = path.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
        self._open_sinks(purge_step=step + 1)

    def event(self, message: str, echo: bool = True, **fields: Any) -> None:
        """Append a lifecycle event (started, resume, restart, rollback) to ``events.jsonl``; ``echo`` also prints
        it on stderr."""
        record = {"time": time.time(), "message": message, **fields}
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if echo:
            print(f"pickaxe: {message}", file=sys.stderr)

    def set_status(self, state: str, **fields: Any) -> None:
        """Record the run's state in ``status.json`` (see :mod:`pickaxe.runs.status`), e.g.
        ``run.set_status("running", phase="training", step=1000)``; states: running, finished, interrupted,
        crashed, stopped. ``phase``, ``step`` and ``total_steps`` are kept for the next writes; every write adds
        ``started`` (this segment's start, epoch seconds) and ``wall_s`` (seconds since the run started, earlier
        segments included). A finished run has no phase."""
        self._status.update({k: fields.pop(k) for k in _KEPT_STATUS_FIELDS if k in fields})
        record = {**self._status, **fields, "started": self._started}
        if self._wall_before is not None:
            record["wall_s"] = self._wall_before + max(0.0, time.time() - self._started)
        if state == "finished":
            record.pop("phase", None)
        write_status(self.path, state, **record)
        self._status_written = time.monotonic()

    def end_with(self, error: BaseException, **fields: Any) -> None:
        """Record in ``status.json`` how ``error`` ends the run: interrupted for a ``KeyboardInterrupt`` (Ctrl-C,
        SIGTERM), else crashed with the error as ``reason`` (a full or unwritable disk as its one-line message).
        Never raises: the error on its way out must not be replaced by a failure to record it."""
        if isinstance(error, KeyboardInterrupt):
            state = "interrupted"
        else:
            disk = disk_error(error, self.path)
            state = "crashed"
            if disk is not None or isinstance(error, PickaxeError):
                fields["reason"] = str(disk or error)
            else:
                fields["reason"] = f"{type(error).__name__}: {error}"
        with contextlib.suppress(Exception):
            self.set_status(state, **fields)

    def set_phase(self, phase: str, **fields: Any) -> None:
        """The run is running and now in ``phase`` (one of :data:`pickaxe.runs.status.PHASES`; another is a
        ``ValueError``)."""
        if phase not in PHASES:
            raise ValueError(f"unknown run phase {phase!r}; use one of {', '.join(PHASES)}")
        self.set_status("running", phase=phase, **fields)

    def report_progress(self, **fields: Any) -> None:
        """While running: record progress (``step=``, the env step; ``warm_start_update=``) in ``status.json``, at
        most every :data:`STATUS_EVERY_S` seconds (one small atomic write; what ``pickaxe runs`` and the web app
        show)."""
        if time.monotonic() - self._status_written >= STATUS_EVERY_S:
            self.set_status("running", **fields)

    def set_config(self, config: Any) -> None:
        """Replace ``config.json`` (atomically) with ``config``: what a resume that changes how the run is laid out
        (``pickaxe resume --learners``) records, so later resumes and readers see the run's current settings."""
        self._write_json("config.json", to_jsonable(config))

    def _write_json(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path / name)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` at env step ``step`` in every sink."""
        record = {"step": int(step), **metrics}
        for sink in (*self._sinks, *self._extra_sinks):
            sink.log(record)

    def save_model(self, networks: dict[str, nn.Module], step: int | None = None) -> Path:
        """Write the networks' weights to ``model.safetensors`` with their digest in ``model.json`` (see
        :func:`pickaxe.runs.model.save_model`)."""
        return save_model(self.path, networks, step)

    def flush(self) -> None:
        """Push buffered metrics (TensorBoard events) to disk."""
        for sink in (*self._sinks, *self._extra_sinks):
            sink.flush()

    def _close_sinks(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def close(self) -> None:
        """Flush and close every sink."""
        self._close_sinks()
        for sink in self._extra_sinks:
            sink.close()
        self._extra_sinks = []

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _extra_sinks(path: Path, config: Any, track: tuple[str, ...], prometheus_port: int | None) -> list[Any]:
    """Optional sinks: W&B / MLflow trackers and a Prometheus endpoint."""
    sinks: list[Any] = []
    for name in track:
        check_tracker(name)
        sinks.append(TRACKERS[name](path, config))
    if prometheus_port is not None:
        sinks.append(PrometheusSink(prometheus_port, path.name))
    return sinks


# --------------------------------------------------------------------------------------- run folder checks
