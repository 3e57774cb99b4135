"""Rewards named by import path in tests/test_rewards.py (``reward_fns:length_score``): pytest puts tests/ on
``sys.path``, as a user's own package would be."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

NOT_A_REWARD = 3


def length_score(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """The completion's length in characters."""
    return float(len(completion))


def make_reward() -> float:
    """A factory (takes no sample): naming it in a spec is an error."""
    return 0.0


class Shouting:
    """A batched reward, instantiated by the spec with no arguments: the fraction of upper-case letters. Counts
    its ``batch`` calls."""

    def __init__(self) -> None:
        self.calls = 0

    def batch(
        self, prompts: Sequence[str], completions: Sequence[str], metadatas: Sequence[dict[str, Any]]
    ) -> list[float]:
        """One score per completion."""
        self.calls += 1
        return [sum(ch.isupper() for ch in c) / max(len(c), 1) for c in completions]


class NeedsArgs:
    """A class the spec cannot instantiate (a required argument)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale


class FailsAt:
    """A per-sample reward (1.0) that fails on its ``at``-th call (0-based): raises, or returns NaN with
    ``nan=True``. Records the prompt and completion it failed on."""

    def __init__(self, at: int | None = 2, nan: bool = False) -> None:
        self.at, self.nan, self.calls = at, nan, 0
        self.failed_on: tuple[str, str] | None = None
        self.__name__ = "fails_at"

    def __call__(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        call, self.calls = self.calls, self.calls + 1
        if self.at is None or call == self.at:
            self.failed_on = (prompt, completion)
            if self.nan:
                return math.nan
            raise ValueError("reward exploded")
        return float(len(completion) % 3)


class BatchNanAt:
    """A batched reward returning ``len(completion) % 3`` but NaN (or inf) at index ``at`` of every batch."""

    def __init__(self, at: int = 2, value: float = math.nan) -> None:
        self.at, self.value, self.calls = at, value, 0
        self.failed_on: tuple[str, str] | None = None
        self.__name__ = "batch_nan"

    def batch(
        self, prompts: Sequence[str], completions: Sequence[str], metadatas: Sequence[dict[str, Any]]
    ) -> list[float]:
        """``len % 3`` per completion, ``value`` at index ``at``."""
        self.calls += 1
        out = [float(len(c) % 3) for c in completions]
        if self.at < len(out):
            out[self.at] = self.value
            self.failed_on = (prompts[self.at], completions[self.at])
        return out
