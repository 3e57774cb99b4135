"""Python objects a run uses but ``config.json`` cannot hold (a reward function, a tool), passed by name from Python.

``pickaxe.train(..., rewards={...}, tools=[...])`` records each object as ``NAME=MODULE:QUALNAME``
(:func:`object_record`) in the run's config and builds the run inside :func:`supplied`, where :func:`resolve` finds
each record's object by name. A resume in another process passes them again, or an object whose module is importable
(not a script's ``__main__``, not defined inside a function) is imported by that path; otherwise :func:`resolve`
raises one ``MissingObjectError`` line naming the object and the fix. Torch-free.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pickaxe.errors import ConfigError

_SUPPLIED: ContextVar[dict[tuple[str, str], Any] | None] = ContextVar("pickaxe_supplied", default=None)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
"""What a supplied object's name may be (it is written into specs such as ``exact+0.5*NAME``)."""


class MissingObjectError(ConfigError):
    """A run names a Python object (a reward, a tool) that was not passed again and cannot be imported."""


def object_record(name: str, obj: Any, kind: str) -> str:
    """``NAME=MODULE:QUALNAME`` of ``obj`` (a function, or the class of an instance), as a run's config records it."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ConfigError(f"{kind} name {name!r}: use letters, digits, '_', '.' or '-', starting with a letter or '_'")
    owner = obj if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj) else type(obj)
    module = getattr(owner, "__module__", None) or "__main__"
    return f"{name}={module}:{getattr(owner, '__qualname__', type(obj).__name__)}"


def record_names(records: Sequence[str]) -> list[str]:
    """The names of ``NAME=MODULE:QUALNAME`` records."""
    return [record.partition("=")[0] for record in records]


def check_records(records: Sequence[str], key: str) -> None:
    """Every record reads ``NAME=MODULE:QUALNAME`` (a ``ConfigError`` naming config ``key`` otherwise)."""
    for record in records:
        name, eq, path = record.partition("=")
        if not (NAME.fullmatch(name) and eq and ":" in path):
            raise ConfigError(f"{key}: {record!r} is not NAME=MODULE:QUALNAME")


@contextmanager
def supplied(kind: str, objects: Mapping[str, Any]) -> Iterator[None]:
    """Within the block, :func:`resolve` finds ``objects`` (name -> object) for records of ``kind``."""
    current = _SUPPLIED.get() or {}
    token = _SUPPLIED.set({**current, **{(kind, name): obj for name, obj in objects.items()}})
    try:
        yield
    finally:
        _SUPPLIED.reset(token)


def resolve(kind: str, records: Sequence[str], load: Callable[[str], Any], how: str) -> dict[str, Any]:
    """Each record's object: the one passed in a :func:`supplied` block, else ``load("MODULE:QUALNAME")`` when that
    path is importable (not ``__main__``, not ``<locals>`` or a lambda); else one :class:`MissingObjectError` line
    (``how``: the keyword that passes it, e.g. ``rewards``)."""
    passed = _SUPPLIED.get() or {}
    out: dict[str, Any] = {}
    for record in records:
        name, _, path = record.partition("=")
        module, _, qualname = path.partition(":")
        if (kind, name) in passed:
            out[name] = passed[(kind, name)]
            continue
        why = "which config.json cannot hold"
        if module and module != "__main__" and qualname and "<" not in qualname:
            try:
                out[name] = load(path)
                continue
            except (ConfigError, ImportError, AttributeError) as e:
                why = f"and importing it failed ({str(e).rstrip('.')})"
        raise MissingObjectError(
            f"this run's {kind} {name!r} is the Python object {path} passed to pickaxe.train, {why}; pass it "
            f"again: pickaxe.resume(RUN_DIR, {how}={{{name!r}: {qualname.split('.')[-1]}}}) (or define it in an "
            "importable module)"
        )
    return out
