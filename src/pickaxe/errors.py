"""User-facing errors: the CLI prints these as one line, without a traceback."""

from __future__ import annotations

from typing import Literal


class PickaxeError(Exception):
    """A problem with the user's input (config, recipe, env id, run directory); the message names the fix."""


class ConfigError(PickaxeError, ValueError):
    """An unknown config key or a value of the wrong type."""


class CheckpointError(PickaxeError):
    """A checkpoint is missing, damaged or unreadable; the one-line message names the file and the fix."""


NonFiniteSource = Literal["update", "parameter", "input"]


class NonFiniteError(RuntimeError):
    """A NaN or Inf found by a guard; ``what`` names the tensor, ``source`` where it was found.

    ``source``: ``"update"`` a loss or gradient (raised before that optimizer step is applied),
    ``"parameter"`` a weight after an update (the update was applied), ``"input"`` the collected batch
    (reward or observation: nothing was learned from it).
    """

    def __init__(self, what: str, source: NonFiniteSource = "update") -> None:
        super().__init__(what)
        self.what = what
        self.source = source


def error_line(error: BaseException) -> str:
    """``error`` in one line, to hand to another process: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
