"""Reward functions for prompt environments: ``fn(prompt, completion, metadata) -> float``.

``metadata`` is the example's metadata with its reference answer under ``"answer"``. A ``PromptEnv`` sums several
functions with weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

RewardFn = Callable[[str, str, dict[str, Any]], float]
"""``(prompt, completion, metadata) -> reward``."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_match(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """1 when the completion, stripped of surrounding whitespace, equals the reference answer; else 0."""
    return float(completion.strip() == str(metadata["answer"]).strip())


def numeric_match(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """1 when the first number in the completion equals the reference answer as a number; else 0."""
    found = _NUMBER.search(completion)
    if found is None:
        return 0.0
    try:
        return float(abs(float(found.group()) - float(metadata["answer"])) < 1e-9)
    except ValueError:
        return 0.0


def format_reward(pattern: str) -> RewardFn:
    """A reward of 1 when the whole stripped completion matches regex ``pattern`` (a format check)."""
    compiled = re.compile(pattern)

    def reward(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        return float(compiled.fullmatch(completion.strip()) is not None)

    reward.__name__ = f"format[{pattern}]"
    return reward


def length_penalty(max_chars: int) -> RewardFn:
    """``-1`` per ``max_chars`` characters beyond ``max_chars`` (0 within the budget): weight it to taste."""

    def reward(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        return -max(0, len(completion) - max_chars) / max_chars

    reward.__name__ = f"length_penalty[{max_chars}]"
    return reward


REWARDS: dict[str, RewardFn] = {"exact": exact_match, "numeric": numeric_match}
"""Rewards a config can name (``--data.reward exact``)."""


def reward_name(fn: RewardFn) -> str:
    """A short name for metrics (``rollout/reward/<name>``)."""
    return getattr(fn, "__name__", type(fn).__name__)
