"""Live hyper-parameter changes: ``pickaxe set RUN_DIR algo.lr=1e-4`` while a run trains.

``pickaxe set`` checks the change against the run's allow-list and the field's declared range, and drops a
request file into ``RUN_DIR/control/``. The Trainer picks requests up at the next update boundary, checks them
again (a file dropped straight into ``control/`` gets no special trust: a bad one is refused with an event and
removed, never applied), stamps them with the env step, records them in ``RUN_DIR/overrides.jsonl`` (the run's
override history) and applies them.

History semantics (what makes resume exact, and an undo stick):

- ``overrides.jsonl`` holds ``{"step", "key", "value"}`` entries ordered by step; a change stamped ``s`` takes
  effect at the update boundary after env step ``s``.
- Loading the checkpoint of step ``C`` re-applies the entries stamped before ``C`` (they are part of that
  checkpoint's config); the later ones are *pending*: replayed when the resumed loop reaches their step, so a
  resumed run repeats the one that was stopped.
- A new request for a key drops every pending entry for that key: the user's latest word wins over the
  abandoned future of a run that was stopped or rolled back. So after a run stops on a bad change,
  ``pickaxe set RUN_DIR algo.lr=<old>`` then ``pickaxe resume RUN_DIR`` continues with the old value, and the
  bad one is never replayed again.
- Entries that fail the checks (a hand-edited or older history) are dropped with a report instead of failing
  every resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pickaxe.config_keys import check_field, parse_value
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.runs.status import is_finished
from pickaxe.train.config import TrainerConfig

CONTROL_DIR = "control"
HISTORY_FILE = "overrides.jsonl"
TRAINER_MUTABLE = ("eval_every", "log_every", "save_every", "save_at_eval", "target_return", "stop_at_target")


@dataclass(frozen=True)
class Override:
    """One change: ``key`` (``algo.lr``) set to ``value`` at the update boundary after env step ``step``."""

    step: int
    key: str
    value: Any


@dataclass(frozen=True)
class MutableKey:
    """An allow-listed key: the config class that owns the field, the field's name and its type hint."""

    owner: type
    name: str
    hint: Any

    def check(self, value: Any, key: str) -> None:
        """Raise ``ConfigError`` (naming ``key``) unless ``value`` passes the field's type and range checks."""
        check_field(self.owner, self.name, value, key)


def mutable_keys(algo_config: Any) -> dict[str, MutableKey]:
    """Allow-listed keys: the algorithm config's ``mutable`` fields and the loop settings.

    An algorithm config lists in its ``mutable`` class variable the fields its algorithm reads afresh at
    every update, so changing them mid-run takes effect and nothing else has to be rebuilt.
    """
    algo_type = type(algo_config)
    algo_hints = typing.get_type_hints(algo_type)
    trainer_hints = typing.get_type_hints(TrainerConfig)
    keys = {f"algo.{k}": MutableKey(algo_type, k, algo_hints[k]) for k in getattr(algo_type, "mutable", ())}
    keys.update({f"trainer.{k}": MutableKey(TrainerConfig, k, trainer_hints[k]) for k in TRAINER_MUTABLE})
    return keys


def check_change(key: Any, value: Any, allowed: dict[str, MutableKey]) -> None:
    """Raise ``ConfigError`` if ``key`` is not allow-listed or ``value`` is out of its field's range."""
    if not isinstance(key, str) or key not in allowed:
        raise ConfigError(f"{key} cannot change while a run trains; mutable keys: {', '.join(sorted(allowed))}")
    allowed[key].check(value, key)


def parse_changes(assignments: list[str], allowed: dict[str, MutableKey]) -> dict[str, Any]:
    """``["algo.lr=1e-4", ...]`` to typed, range-checked values; unknown or immutable keys are refused with the
    allow-list, out-of-range values (``lr=-1``, ``lr=nan``, ``epochs=0``) with the field's range."""
    changes: dict[str, Any] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("--").replace("-", "_")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r} (e.g. algo.lr=1e-4)")
        if key not in allowed:
            check_change(key, None, allowed)
        value = parse_value(key, allowed[key].hint, text.strip())
        check_change(key, value, allowed)
        changes[key] = value
    return changes


def request(run_dir: str | Path, changes: dict[str, Any]) -> Path:
    """Drop a request for ``changes`` into the run's control folder (atomically: write, then rename).

    A finished run is refused (``PickaxeError``): nothing would ever read the request.
    """
    if is_finished(run_dir):
        raise PickaxeError(
            f"{run_dir} has finished (model.safetensors is its final model); `pickaxe set` changes a running or "
            "resumable run: start a new one with the changed value instead"
        )
    control = Path(run_dir) / CONTROL_DIR
    control.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}.json"
    tmp = control / f".{name}.tmp"
    tmp.write_text(json.dumps(changes, allow_nan=False), encoding="utf-8")
    os.replace(tmp, control / name)
    return control / name


def _entry(line: str) -> Override | None:
    try:
        entry = json.loads(line)
        return Override(int(entry["step"]), entry["key"], entry["value"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return None  # torn by a kill before the change took effect, or not an entry at all


class OverrideLog:
    """The Trainer's side: consumes requests, keeps the history, and says what is due at each step.

    ``allowed`` (from :func:`mutable_keys`) is what requests and history entries are checked against;
    ``report(message)`` receives one line for each refused request or dropped history entry.
    """

    def __init__(
        self,
        run_dir: str | Path,
        allowed: dict[str, MutableKey] | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.allowed = allowed
        self.report = report or (lambda message: None)
        self.history: list[Override] = []
        path = self.run_dir / HISTORY_FILE
        dropped = False
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                o = _entry(line)
                problem = "not a history entry" if o is None else self._problem(o.key, o.value)
                if o is None or problem is not None:
                    dropped = True
                    if o is not None:  # torn last lines are expected after a kill: not worth a report
                        where = f"{o.key}={o.value!r} at step {o.step}"
                        self.report(f"dropped live change {where} from {HISTORY_FILE}: {problem}")
                    continue
                self.history.append(o)
        if dropped:
            self._rewrite()
        self._replayed = 0

    def _problem(self, key: Any, value: Any) -> str | None:
        """Why the change ``key=value`` cannot be applied, or None."""
        if not isinstance(key, str) or key.partition(".")[0] not in ("algo", "trainer") or "." not in key:
            return f"{key!r} is not a config key such as algo.lr"
        if self.allowed is None:
            return None
        try:
            check_change(key, value, self.allowed)
        except ConfigError as e:
            return str(e)
        return None

    def _rewrite(self) -> None:
        path = self.run_dir / HISTORY_FILE
        tmp = path.with_name(f".{HISTORY_FILE}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(dataclasses.asdict(o)) + "\n" for o in self.history)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def before(self, step: int) -> list[Override]:
        """History entries applied before the checkpoint at ``step`` (re-applied on load)."""
        done = [o for o in self.history if o.step < step]
        self._replayed = len(done)
        return done

    def take(self, step: int) -> list[Override]:
        """Changes to apply now: replayed history stamped ``<= step`` plus new requests, which are recorded.

        New requests are checked (a refused one is reported and removed) and drop the pending entries of their
        keys (see the module docstring).
        """
        new, consumed = self._requests(step)
        keys = {o.key for o in new}
        applied, pending = self.history[: self._replayed], self.history[self._replayed :]
        superseded = [o for o in pending if o.key in keys]
        pending = [o for o in pending if o.key not in keys]
        due = [o for o in pending if o.step <= step]
        pending = pending[len(due) :]
        self.history = [*applied, *due, *new, *pending]
        self._replayed = len(applied) + len(due) + len(new)
        if superseded:
            self._rewrite()
        elif new:
            with open(self.run_dir / HISTORY_FILE, "a", encoding="utf-8") as f:
                for o in new:
                    f.write(json.dumps(dataclasses.asdict(o)) + "\n")
                f.flush()
                os.fsync(f.fileno())
        for path in consumed:
            path.unlink(missing_ok=True)  # after the history holds the change: a kill in between loses nothing
        return [*due, *new]

    def _requests(self, step: int) -> tuple[list[Override], list[Path]]:
        """Accepted changes from the request files in ``control/`` (oldest first), stamped ``step``, and the
        files they came from (removed once the history holds them)."""
        consumed: list[Path] = []
        control = self.run_dir / CONTROL_DIR
        if not control.is_dir():
            return [], consumed
        new: list[Override] = []
        for path in sorted(p for p in control.iterdir() if p.suffix == ".json" and not p.name.startswith(".")):
            try:
                changes = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue  # half-written by a foreign tool: leave it, read it next time
            if not isinstance(changes, dict) or not changes:
                problems = ["it is not a JSON object of KEY: VALUE changes"]
            else:
                problems = [p for k, v in changes.items() if (p := self._problem(k, v)) is not None]
            if problems:
                why = problems[0]
                self.report(f"refused live change request {path.name} at step {step}: {why}; removed, nothing changed")
                path.unlink(missing_ok=True)
                continue
            new.extend(Override(step, k, v) for k, v in changes.items())
            consumed.append(path)
        return new, consumed
