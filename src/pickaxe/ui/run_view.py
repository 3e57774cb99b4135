"""The Run page's API: one run's every logged metric, live while it trains, its events, config and status, and its
live changes (the ``pickaxe set`` of the page).

- ``GET /api/run?run=ID``: config, status, the keys ``pickaxe set`` may change (with their current value and
  range) and the override history (``overrides.jsonl``);
- ``GET /api/run/poll?run=ID&offset=N&file=F&events=M``: what is new since the last poll: the ``metrics.jsonl``
  records after byte ``offset`` (whole lines only; ``reset`` true, and every record again, when the file was
  rewritten by a resume's rewind), the ``events.jsonl`` entries after the ``M``-th, and the status;
- ``POST /api/run/set`` ``{"run", "changes": {"algo.lr": "1e-4"}}``: the values are parsed, range-checked and
  written to ``RUN/control/`` by the very functions ``pickaxe set`` calls (``parse_changes`` and ``request`` of
  :mod:`pickaxe.train.overrides`), so the run applies, records and replays them as it does the CLI's. The app's
  protections against cross-site requests (JSON content type only, loopback ``Host``) apply as to every POST.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.runs.listing import live_status
from pickaxe.runs.status import read_status
from pickaxe.ui.body import json_body
from pickaxe.ui.runs import clean, resolve_run, run_id

__all__ = ["MAX_POLL_BYTES", "read_events", "read_new_metrics", "router"]

router = APIRouter()
"""Routes of the Run page's API; ``create_app`` includes them."""

MAX_POLL_BYTES = 4_000_000
"""Most bytes of ``metrics.jsonl`` one poll returns; the page polls again at once while ``more`` is true."""
MAX_BODY_BYTES = 16_384


def read_new_metrics(path: Path, offset: int, file_id: str | None) -> dict[str, Any]:
    """The whole JSON-object lines of ``path`` after byte ``offset`` (at most :data:`MAX_POLL_BYTES`): ``records``,
    the next ``offset``, the file's ``file`` id (its inode) and ``reset`` (the file was replaced or cut since
    ``file_id``/``offset``: the records start again from the top). A missing file has no records yet."""
    try:
        st = os.stat(path)
    except OSError:
        return {"records": [], "offset": 0, "file": None, "reset": offset > 0, "more": False}
    ident = str(st.st_ino)
    reset = offset > st.st_size or (file_id not in (None, "") and file_id != ident)
    start = 0 if reset else offset
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(MAX_POLL_BYTES)
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
    records = []
    for line in data[:end].splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a torn line left by a kill
            continue
        if isinstance(record, dict):
            records.append(record)
    new_offset = start + end
    return {
        "records": records,
        "offset": new_offset,
        "file": ident,
        "reset": reset,
        "more": new_offset < st.st_size and end > 0,
    }


def read_events(run_dir: Path, skip: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The ``events.jsonl`` entries after the first ``skip`` lines and the line count so far (torn lines count but
    are not returned)."""
    out: list[dict[str, Any]] = []
    count = 0
    try:
        with open(run_dir / "events.jsonl", "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    break  # still being written
                count += 1
                if count <= skip:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    out.append(event)
    except OSError:
        pass
    return out, count


def _status(run_dir: Path) -> dict[str, Any]:
    status = read_status(run_dir) or {}
    state, phase, wall_s = live_status(run_dir, status)
    return {
        "state": state,
        "phase": phase,
        "step": status.get("step") if type(status.get("step")) is int else None,
        "total_steps": status.get("total_steps") if type(status.get("total_steps")) is int else None,
        "wall_s": wall_s,
        "reason": status.get("reason") if isinstance(status.get("reason"), str) else None,
        "written": status.get("time"),
        "has_status": bool(status),
    }


def _mutable(run_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The keys ``pickaxe set`` accepts for this run (key, current value, type, range) or why none can be listed."""
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.overrides import HISTORY_FILE, mutable_keys

    try:
        cfg = load_run_config(run_dir)
        allowed = mutable_keys(cfg.algo)
    except (PickaxeError, ValueError, TypeError) as e:
        return [], str(e)
    current: dict[str, Any] = {}
    for key in allowed:
        section, _, name = key.partition(".")
        current[key] = getattr(getattr(cfg, section, None), name, None)
    try:
        for line in (run_dir / HISTORY_FILE).read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                current[entry["key"]] = entry["value"]
            except (ValueError, KeyError, TypeError):
                continue
    except OSError:
        pass
    out = []
    for key, mk in sorted(allowed.items()):
        field = {f.name: f for f in dataclasses.fields(mk.owner)}.get(mk.name)
        rng = field.metadata.get("range") if field is not None else None
        hint = mk.hint if isinstance(mk.hint, type) else None
        out.append(
            {
                "key": key,
                "value": current.get(key),
                "type": hint.__name__ if hint is not None else str(mk.hint).replace("typing.", ""),
                "range": rng.describe() if rng is not None else "",
            }
        )
    return out, None


def _history(run_dir: Path) -> list[dict[str, Any]]:
    from pickaxe.train.overrides import HISTORY_FILE

    out = []
    try:
        lines = (run_dir / HISTORY_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _pending(run_dir: Path) -> int:
    """Requests written to ``control/`` that the run has not picked up yet."""
    try:
        return sum(1 for p in (run_dir / "control").iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except OSError:
        return 0


def _read_config(run_dir: Path) -> Any:
    try:
        return json.loads((run_dir / "config.json").read_bytes())
    except (OSError, ValueError):
        return None


@router.get("/api/run")
def run_info(request: Request, run: str) -> dict[str, Any]:
    """The run's config, status, mutable keys with their current values, override history and pending requests."""
    run_dir = resolve_run(request, run)
    keys, why = _mutable(run_dir)
    return clean(
        {
            "run": run_id(request.app.state.runs_dir, run_dir),
            "path": str(run_dir),
            "config": _read_config(run_dir),
            "status": _status(run_dir),
            "mutable": keys,
            "mutable_error": why,
            "overrides": _history(run_dir),
            "pending": _pending(run_dir),
        }
    )


@router.get("/api/run/poll")
def run_poll(
    request: Request,
    run: str,
    offset: int = Query(0, ge=0),
    file: str | None = None,
    events: int = Query(0, ge=0),
) -> dict[str, Any]:
    """What changed since the page's last poll: new metrics records, new events, the status."""
    run_dir = resolve_run(request, run)
    metrics = read_new_metrics(run_dir / "metrics.jsonl", offset, file)
    new_events, count = read_events(run_dir, 0 if metrics["reset"] else events)
    return clean(
        {
            **metrics,
            "events": new_events,
            "events_count": count,
            "events_reset": count < events,
            "status": _status(run_dir),
            "pending": _pending(run_dir),
        }
    )


def _set(request: Request, run: Any, changes: Any) -> dict[str, Any]:
    if not isinstance(run, str):
        raise HTTPException(422, "run must be a run id from /api/runs")
    run_dir = resolve_run(request, run)
    if not isinstance(changes, dict) or not changes:
        raise HTTPException(422, 'changes must be an object of KEY: VALUE, e.g. {"algo.lr": "1e-4"}')
    words = []
    for key, value in changes.items():
        if isinstance(value, bool):
            value = str(value)
        elif value is None or isinstance(value, dict | list):
            raise HTTPException(422, f"{key}: give the value as text or a number, e.g. 1e-4")
        words.append(f"{key}={value}")
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.overrides import mutable_keys, parse_changes
    from pickaxe.train.overrides import request as write_request

    try:
        cfg = load_run_config(run_dir)
        parsed = parse_changes(words, mutable_keys(cfg.algo))
    except ConfigError as e:
        raise HTTPException(422, str(e)) from None
    except PickaxeError as e:
        raise HTTPException(409, str(e)) from None
    try:
        path = write_request(run_dir, parsed)
    except PickaxeError as e:  # a finished run
        raise HTTPException(409, str(e)) from None
    except OSError as e:
        raise HTTPException(409, f"cannot write to {run_dir / 'control'}: {e.strerror or e}") from None
    said = ", ".join(f"{k}={v!r}" for k, v in parsed.items())
    return clean(
        {
            "changes": parsed,
            "request": path.name,
            "message": f"{said} queued for {run}; the run applies it at its next update boundary",
        }
    )


@router.post("/api/run/set")
async def run_set(request: Request) -> dict[str, Any]:
    """``pickaxe set RUN KEY=VALUE ...`` from the page: same parsing, checks and request file as the CLI."""
    body = await json_body(request, ("run", "changes"), MAX_BODY_BYTES)
    return await run_in_threadpool(_set, request, body["run"], body["changes"])
