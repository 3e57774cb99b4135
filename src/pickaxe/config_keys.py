"""Typed config dataclasses: each field's valid range, declared once next to the field, and the one check
that every way a value enters uses (the CLI, the Python API, ``config.json`` and ``pickaxe set``).

A field declares its range with :func:`ranged`; a config dataclass calls :func:`validate` from its
``__post_init__``. :func:`check_field` checks one value for one field, naming the key the user wrote.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pickaxe.errors import ConfigError

_MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class Range:
    """Bounds of a numeric field (None leaves that side open), or the pattern a text field must match."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str | None = None
    """A regular expression the whole text must match; ``describe`` then names ``choices``."""
    choices: str | None = None
    """How to say the valid texts, e.g. ``auto, cpu, cuda, cuda:N or mps``."""

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies within every bound (matches the pattern, for text)."""
        if self.pattern is not None:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        """``> 0 and <= 1`` style text."""
        if self.pattern is not None:
            return f"one of {self.choices or self.pattern}"
        bounds = ((self.ge, ">="), (self.gt, ">"), (self.le, "<="), (self.lt, "<"))
        return " and ".join(f"{op} {_fmt(b)}" for b, op in bounds if b is not None)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def ranged(
    default: Any = _MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    default_factory: Any = _MISSING,
    pattern: str | None = None,
    choices: str | None = None,
) -> Any:
    """A dataclass field whose numeric value (each element of a tuple; None passes) must lie in the bounds, or
    whose text must fully match ``pattern`` (``choices`` says the valid texts in error messages)."""
    meta = {"range": Range(ge, gt, le, lt, pattern, choices)}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _hints(cls: type) -> dict[str, Any]:
    try:
        return _HINTS[cls]
    except KeyError:
        _HINTS[cls] = hints = typing.get_type_hints(cls)
        return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _type_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` is not a value of ``hint`` (plain JSON-like types), or None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        problems = [_type_problem(a, value) for a in args if a is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if origin is Literal:
        return (
            None
            if value in args and type(value) in {type(a) for a in args}
            else (f"must be one of {', '.join(map(str, args))}")
        )
    if hint is bool:
        return None if type(value) is bool else "must be True or False"
    if hint is int:
        return None if type(value) is int else "must be an integer"
    if hint is float:
        if type(value) not in (int, float):
            return "must be a number"
        return None if math.isfinite(value) else "must be a finite number"
    if hint is str:
        return None if isinstance(value, str) else "must be a string"
    if origin is tuple:
        if not isinstance(value, tuple):
            return "must be a list"
        elem = args[0] if args else Any
        for v in value:
            p = _type_problem(elem, v)
            if p is not None:
                return f"must hold elements that each {p.removeprefix('must ')}"
        return None
    if dataclasses.is_dataclass(hint):
        return None if isinstance(value, hint) else f"must be a {hint.__name__}"
    return None


def check_field(cls: type, name: str, value: Any, key: str | None = None) -> None:
    """Raise ``ConfigError`` naming ``key`` (default ``Class.name``) if ``value`` is not valid for the field.

    Checks the field's type (ints are not floats' stand-ins only where the field is a float; bools are never
    numbers; floats must be finite) and its declared :class:`Range`.
    """
    key = key or f"{cls.__name__}.{name}"
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ConfigError(f"unknown config key {key}")
    problem = _type_problem(_hints(cls)[name], value)
    bounds = fields[name].metadata.get("range")
    if problem is None and bounds is not None and value is not None:
        for v in value if isinstance(value, tuple) else (value,):
            if not bounds.contains(v):
                problem = f"must be {bounds.describe()}"
                break
    if problem:
        raise ConfigError(f"{key} {problem}, got {value!r}")


def validate(cfg: Any, prefix: str | None = None) -> None:
    """Check every field of config dataclass ``cfg`` (and of nested config dataclasses).

    Errors name keys as ``prefix + field`` (default prefix ``ClassName.``), e.g. ``algo.lr must be > 0``.
    """
    prefix = f"{type(cfg).__name__}." if prefix is None else prefix
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, f"{prefix}{f.name}.")
        else:
            check_field(type(cfg), f.name, value, prefix + f.name)


def leaf_fields(cfg: Any, prefix: str = "") -> dict[str, tuple[type, str, Any]]:
    """``dotted.key -> (owner class, field name, type hint)`` for every leaf field of config ``cfg``."""
    out: dict[str, tuple[type, str, Any]] = {}
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaf_fields(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = (type(cfg), f.name, hints[f.name])
    return out


def parse_value(key: str, hint: Any, text: str) -> Any:
    """Convert command-line ``text`` to a value of type ``hint``; ``ConfigError`` names ``key`` if it cannot."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if text == "None" and type(None) in args:
            return None
        choices = [a for a in args if a is not type(None)]
        for arg in choices:
            try:
                return parse_value(key, arg, text)
            except ConfigError:
                pass
        if len(choices) == 1:  # an optional value: the one type's own message
            return parse_value(key, choices[0], text)
        kinds = [
            " or ".join(map(str, typing.get_args(a))) if typing.get_origin(a) is Literal else getattr(a, "__name__", a)
            for a in choices
        ]
        none = " or None" if type(None) in args else ""
        raise ConfigError(f"{key} takes {' or '.join(kinds)}{none}, got {text!r}")
    if origin is Literal:
        for a in args:
            if text == str(a):
                return a
        raise ConfigError(f"{key} must be one of {', '.join(map(str, args))}, got {text!r}")
    if hint in (int, float):
        try:
            return hint(text)
        except ValueError:
            raise ConfigError(f"{key} takes {hint.__name__}, got {text!r} (e.g. 3)") from None
    if hint is bool:
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"{key} takes True or False, got {text!r}")
        return text.lower() == "true"
    return text
