"""The ``Recipe`` record: a name, one line of description and a config factory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recipe:
    """A recipe: its name, one line of description and a factory for its config."""

    name: str
    description: str
    make: Callable[[], Any]
    """Returns a complete config: a ``TrainConfig`` (classic RL) or an ``LLMTrainConfig``."""
