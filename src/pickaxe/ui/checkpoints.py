"""The Checkpoints page's API: a run's checkpoint evaluation (``RUN/eval/checkpoints.json``, written by
``pickaxe eval RUN --checkpoints ...``), its training-time eval curves with their CIs, the alarms (from the
evaluation, ``alarm/*`` keys in ``metrics.jsonl`` and ``events.jsonl``) and the selected best checkpoint.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from pickaxe.eval.stats import finite_number
from pickaxe.runs.tracking import read_metrics
from pickaxe.ui.runs import clean, resolve_run, run_id

__all__ = ["read_alarms", "router", "training_curves"]

router = APIRouter()
"""Routes of the Checkpoints page's API; ``create_app`` includes them."""

_SKIP = {"eval/phase_before", "eval/prompts", "eval/episodes"}


def _read_json(path: Path) -> tuple[Any, str | None]:
    """``(content, None)``, ``(None, None)`` when the file is missing, ``(None, error line)`` when unreadable."""
    try:
        return json.loads(path.read_bytes()), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path} is unreadable ({e}); run the command that writes it again"


def training_curves(records: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Each eval metric of the training records -> ``{"step", "mean", "low", "high"}`` (``low``/``high`` from
    ``M_ci_low``/``M_ci_high``, None where not logged); a step logged twice keeps its last record."""
    by_metric: dict[str, dict[int, tuple[float, float | None, float | None]]] = {}
    for r in records:
        step = r.get("step")
        if type(step) is not int:
            continue
        for k, v in r.items():
            if not k.startswith("eval/") or k.endswith(("_ci_low", "_ci_high")) or k in _SKIP:
                continue
            value = finite_number(v)
            if value is None:
                continue
            low, high = finite_number(r.get(f"{k}_ci_low")), finite_number(r.get(f"{k}_ci_high"))
            by_metric.setdefault(k, {})[step] = (value, low, high)
    out = {}
    for k in sorted(by_metric):
        steps = sorted(by_metric[k])
        points = [by_metric[k][s] for s in steps]
        out[k] = {
            "step": steps,
            "mean": [p[0] for p in points],
            "low": [p[1] for p in points],
            "high": [p[2] for p in points],
        }
    return out


def read_alarms(run_dir: Path, records: list[dict[str, Any]], evaluated: list[Any] | None) -> list[dict[str, Any]]:
    """Every alarm of the run, once per (name, step): from the checkpoint evaluation, ``alarm/NAME`` keys of the
    metrics records and ``events.jsonl`` events with an ``alarm`` field; each with its ``sources``."""
    found: dict[tuple[str, int], dict[str, Any]] = {}

    def add(name: Any, step: Any, message: Any, source: str, values: Any = None) -> None:
        if not isinstance(name, str) or type(step) is not int:
            return
        alarm = found.setdefault(
            (name, step), {"name": name, "step": step, "message": None, "values": None, "sources": []}
        )
        if isinstance(message, str) and not alarm["message"]:
            alarm["message"] = message
        if isinstance(values, dict) and alarm["values"] is None:
            alarm["values"] = values
        if source not in alarm["sources"]:
            alarm["sources"].append(source)

    for a in evaluated or []:
        if isinstance(a, dict):
            add(a.get("name"), a.get("step"), a.get("message"), "eval", a.get("values"))
    for r in records:
        for k, v in r.items():
            if k.startswith("alarm/") and finite_number(v):
                add(k.removeprefix("alarm/"), r.get("step"), None, "metrics")
    try:
        with open(run_dir / "events.jsonl", "rb") as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("alarm"):
                    add(event.get("alarm"), event.get("step"), event.get("message"), "events", event.get("values"))
    except OSError:
        pass
    return sorted(found.values(), key=lambda a: (a["step"], a["name"]))


@router.get("/api/checkpoints")
def checkpoints(request: Request, run: str) -> dict[str, Any]:
    """The run's checkpoint evaluation (None, with the command that makes it, when there is none yet), its
    training eval curves, alarms and ``selection.json``."""
    run_dir = resolve_run(request, run)
    root: Path = request.app.state.runs_dir
    evaluation, eval_error = _read_json(run_dir / "eval" / "checkpoints.json")
    if evaluation is not None and not (isinstance(evaluation, dict) and isinstance(evaluation.get("rows"), list)):
        file = run_dir / "eval" / "checkpoints.json"
        evaluation, eval_error = None, f"{file} has no 'rows' list; run pickaxe eval again"
    selection, selection_error = _read_json(run_dir / "selection.json")
    if selection is not None and not isinstance(selection, dict):
        selection, selection_error = None, f"{run_dir / 'selection.json'} is not a JSON object"
    try:
        records = read_metrics(run_dir)
    except OSError:
        records = []
    config, _ = _read_json(run_dir / "config.json")
    kind = config.get("kind") if isinstance(config, dict) else None
    hint = f"pickaxe eval {shlex.quote(str(run_dir))} --checkpoints all" if evaluation is None else None
    return clean(
        {
            "run": run_id(root, run_dir),
            "path": str(run_dir),
            "kind": "llm" if kind == "llm" else "classic",
            "evaluation": evaluation,
            "errors": [e for e in (eval_error, selection_error) if e],
            "command": hint,
            "training": training_curves(records),
            "alarms": read_alarms(run_dir, records, evaluation.get("alarms") if evaluation else None),
            "selection": selection,
        }
    )
