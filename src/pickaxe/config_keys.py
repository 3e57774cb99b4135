"""Command-line values for typed config dataclasses: dotted keys, parsing text to the field's type."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from pickaxe.errors import ConfigError


def flat_fields(cfg: Any, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Every leaf config key as ``dotted.name -> (type hint, current value)``."""
    out: dict[str, tuple[Any, Any]] = {}
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flat_fields(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = (hints[f.name], value)
    return out


def parse_value(key: str, hint: Any, text: str) -> Any:
    """Convert command-line ``text`` to a value of type ``hint``; ``ConfigError`` names ``key`` if it cannot."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if text == "None" and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return parse_value(key, arg, text)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"bad value {text!r} for {key}")
    if origin is Literal:
        for a in args:
            if text == str(a):
                return a
        raise ConfigError(f"--{key} must be one of {', '.join(map(str, args))}, got {text!r}")
    if hint in (int, float):
        try:
            return hint(text)
        except ValueError:
            raise ConfigError(f"--{key} takes {hint.__name__}, got {text!r} (e.g. --{key} 3)") from None
    if hint is bool:
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"--{key} takes True or False, got {text!r}")
        return text.lower() == "true"
    return text


def check_value(key: str, hint: Any, text: str) -> None:
    """Raise ``ConfigError`` if command-line ``text`` cannot be a value of type ``hint`` for ``key``."""
    parse_value(key, hint, text)
