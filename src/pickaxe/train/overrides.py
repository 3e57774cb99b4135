"""Live hyper-parameter changes: ``pickaxe set RUN_DIR algo.lr=1e-4`` while a run trains.

``pickaxe set`` validates the change against the run's allow-list and drops a request file into
``RUN_DIR/control/``. The Trainer picks requests up at the next update boundary, stamps them with the
env step, appends them to ``RUN_DIR/overrides.jsonl`` (the run's override history) and applies them.
The history is what makes resume exact: changes stamped before a checkpoint's step are re-applied when
the checkpoint is loaded, later ones are replayed when the resumed loop reaches their step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pickaxe.config_keys import parse_value
from pickaxe.errors import ConfigError
from pickaxe.train.config import TrainerConfig

CONTROL_DIR = "control"
HISTORY_FILE = "overrides.jsonl"
TRAINER_MUTABLE = ("eval_every", "log_every", "save_every", "target_return")


@dataclass(frozen=True)
class Override:
    """One change: ``key`` (``algo.lr``) set to ``value`` at the update boundary after env step ``step``."""

    step: int
    key: str
    value: Any


def mutable_keys(algo_config: Any) -> dict[str, Any]:
    """Allow-listed keys with their type hints: the algorithm config's ``mutable`` fields and loop settings.

    An algorithm config lists in its ``mutable`` class variable the fields its algorithm reads afresh at
    every update, so changing them mid-run takes effect and nothing else has to be rebuilt.
    """
    algo_hints = typing.get_type_hints(type(algo_config))
    trainer_hints = typing.get_type_hints(TrainerConfig)
    keys = {f"algo.{k}": algo_hints[k] for k in getattr(type(algo_config), "mutable", ())}
    keys.update({f"trainer.{k}": trainer_hints[k] for k in TRAINER_MUTABLE})
    return keys


def parse_changes(assignments: list[str], allowed: dict[str, Any]) -> dict[str, Any]:
    """``["algo.lr=1e-4", ...]`` to typed values; unknown or immutable keys are refused with the allow-list."""
    changes: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r} (e.g. algo.lr=1e-4)")
        if key not in allowed:
            raise ConfigError(f"{key} cannot change while a run trains; mutable keys: {', '.join(sorted(allowed))}")
        changes[key] = parse_value(key, allowed[key], text.strip())
    return changes


def request(run_dir: str | Path, changes: dict[str, Any]) -> Path:
    """Drop a request for ``changes`` into the run's control folder (atomically: write, then rename)."""
    control = Path(run_dir) / CONTROL_DIR
    control.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}.json"
    tmp = control / f".{name}.tmp"
    tmp.write_text(json.dumps(changes), encoding="utf-8")
    os.replace(tmp, control / name)
    return control / name


class OverrideLog:
    """The Trainer's side: consumes requests, keeps the history, and says what is due at each step."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.history: list[Override] = []
        path = self.run_dir / HISTORY_FILE
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # torn by a kill before the change took effect
                self.history.append(Override(int(entry["step"]), entry["key"], entry["value"]))
        self._replayed = 0

    def before(self, step: int) -> list[Override]:
        """History entries applied before the checkpoint at ``step`` (re-applied on load)."""
        done = [o for o in self.history if o.step < step]
        self._replayed = len(done)
        return done

    def take(self, step: int) -> list[Override]:
        """Changes to apply now: replayed history stamped ``step`` plus new requests, which are recorded."""
        due = []
        while self._replayed < len(self.history) and self.history[self._replayed].step <= step:
            due.append(self.history[self._replayed])
            self._replayed += 1
        control = self.run_dir / CONTROL_DIR
        if control.is_dir():
            for path in sorted(p for p in control.iterdir() if p.suffix == ".json" and not p.name.startswith(".")):
                try:
                    changes = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError):
                    continue  # half-written by a foreign tool: leave it, read it next time
                new = [Override(step, k, v) for k, v in changes.items()]
                with open(self.run_dir / HISTORY_FILE, "a", encoding="utf-8") as f:
                    for o in new:
                        f.write(json.dumps(dataclasses.asdict(o)) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                path.unlink()
                self.history.extend(new)
                self._replayed = len(self.history)
                due.extend(new)
        return due
