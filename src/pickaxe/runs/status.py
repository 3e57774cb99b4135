"""``RUN_DIR/status.json``: what a run is doing now (running, finished, interrupted, crashed, stopped).

The training process writes its state with its pid, host and process start time; a reader that finds
"running" checks the process is still alive (the same pid *and* the same start time, so a reused pid is not
mistaken for the run) and reports a dead one as "crashed". A status written on another host cannot be
checked and is trusted. The run writes it from its first moment, before any model is loaded, with its
``phase`` (:data:`PHASES`), and its ``wall_s``: seconds since the run started, earlier segments of a resumed run
included. Torch-free: ``pickaxe runs`` imports this without loading torch.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil

STATUS_FILE = "status.json"
STATES = ("running", "finished", "interrupted", "crashed", "stopped")
"""running: training now; finished: reached its budget or target; interrupted: Ctrl-C / SIGTERM;
crashed: an error or a dead process; stopped: ended on purpose (e.g. a non-finite value with on_nonfinite=stop)."""

PHASES = ("loading", "warm_start", "evaluating", "training", "saving", "exporting")
"""What a running run is doing: loading (config, model, data), warm_start (an LLM run's SFT warm start),
evaluating (an evaluation, e.g. an LLM run's before training, or best-of-n's sampling), training, saving (the final
model and checkpoint) and exporting (an LLM run's ``RUN_DIR/export``)."""

_CREATE_TIME_TOLERANCE_S = 1.0


def _process_identity() -> dict[str, Any]:
    """pid, hostname and process start time of this process."""
    pid = os.getpid()
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        created = None
    return {"pid": pid, "hostname": socket.gethostname(), "process_create_time": created}


def write_status(run_dir: str | Path, state: str, **fields: Any) -> Path:
    """Atomically replace ``RUN_DIR/status.json`` with ``state``, this process's identity, the time and ``fields``.

    ``fields`` are any JSON values (e.g. ``step=1000, total_steps=50000``). Raises ``ValueError`` for an unknown
    state and ``OSError`` when the file cannot be written.
    """
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}; use one of {', '.join(STATES)}")
    path = Path(run_dir) / STATUS_FILE
    record = {**fields, "state": state, **_process_identity(), "time": time.time()}
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    """The content of ``RUN_DIR/status.json``, or None when it is missing, unreadable or not a JSON object."""
    try:
        record = json.loads((Path(run_dir) / STATUS_FILE).read_bytes())
    except (OSError, ValueError):  # ValueError covers bad JSON and bad UTF-8
        return None
    return record if isinstance(record, dict) and isinstance(record.get("state"), str) else None


def process_alive(pid: Any, create_time: Any = None, hostname: Any = None) -> bool:
    """Whether the process that wrote a status is still running.

    A status from another host is assumed alive (it cannot be checked). A pid that exists but started at another
    time than ``create_time`` is a reused pid: the writer is gone. Zombies count as gone.
    """
    if hostname is not None and hostname != socket.gethostname():
        return True
    if type(pid) is not int or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if isinstance(create_time, int | float) and abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # e.g. AccessDenied: the pid exists
        return True
    return True


def run_state(run_dir: str | Path) -> str:
    """The run's state: ``status.json``'s, with a "running" whose process is gone reported as "crashed".

    A run without a (readable) ``status.json`` is "running" while the process its ``events.jsonl`` says started it
    is alive (the moment between the run folder's creation and its first status), else, e.g. one written by an
    older pickaxe, "finished" when it has ``model.safetensors`` and "crashed" otherwise.
    """
    status = read_status(run_dir)
    if status is None:
        if (Path(run_dir) / "model.safetensors").is_file():
            return "finished"
        return "running" if starter_alive(run_dir) else "crashed"
    state = status["state"]
    if state not in STATES:
        return "crashed"
    if state == "running" and not process_alive(
        status.get("pid"), status.get("process_create_time"), status.get("hostname")
    ):
        return "crashed"
    return state


def starter_alive(run_dir: str | Path) -> bool:
    """Whether the process of the last ``started`` event in ``RUN_DIR/events.jsonl`` (its pid and host) is alive."""
    started = None
    try:
        with open(Path(run_dir) / "events.jsonl", "rb") as f:
            for line in f:
                if b'"started"' not in line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("message") == "started":
                    started = event
    except OSError:
        return False
    return started is not None and process_alive(started.get("pid"), None, started.get("hostname"))


def status_wall_s(status: dict[str, Any] | None, state: str | None = None) -> float | None:
    """Seconds the run has taken so far, all its segments (loading and warm start included): the status's
    ``wall_s`` plus, for a run still ``running`` (``state``, as :func:`run_state` gives it), the time since that
    status was written. None for a status without ``wall_s`` (written by an older pickaxe)."""
    if status is None or not _is_number(status.get("wall_s")):
        return None
    wall = float(status["wall_s"])
    if state == "running" and _is_number(status.get("time")):
        wall += max(0.0, time.time() - float(status["time"]))
    return wall


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_finished(run_dir: str | Path) -> bool:
    """Whether the run reached its end (``run_state`` is "finished")."""
    return run_state(run_dir) == "finished"
