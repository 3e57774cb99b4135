"""Synthetic preference data with a known answer, for testing reward models and DPO.

* :func:`sorting_preferences`: ``sort 4821=``; chosen is the sorted digits, rejected a shuffled (unsorted)
  permutation of them. The hidden gold scorer is :func:`sortedness`; a reward model that learns it ranks unseen
  pairs correctly.

Prompts follow the task's stable hash split (``pickaxe.envs.text.tasks``), so ``split="heldout"`` pairs never share
a prompt with ``split="train"`` ones.
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

import numpy as np

from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.envs.text.tasks import SortDigits

__all__ = ["sortedness", "sorting_preferences"]


def sortedness(prompt: str, completion: str, metadata: dict[str, Any] | None = None) -> float:
    """The gold score of a digit string: the fraction of adjacent digit pairs in non-decreasing order (1.0 for
    a sorted string or one of fewer than two characters)."""
    s = completion.strip()
    if len(s) < 2:
        return 1.0
    return sum(a <= b for a, b in itertools.pairwise(s)) / (len(s) - 1)


def sorting_preferences(
    n: int,
    seed: int = 0,
    split: Literal["train", "heldout"] = "train",
    min_len: int = 3,
    max_len: int = 5,
    heldout_fraction: float = 0.2,
) -> list[PreferencePair]:
    """``n`` pairs ``sort <digits>=``: chosen the sorted digits, rejected a random unsorted permutation of the same
    digits (so only the order differs). Seeded by ``seed``; ``group`` numbers the pairs."""
    task = SortDigits(min_len, max_len, heldout_fraction)
    rng = np.random.default_rng(seed)
    pairs: list[PreferencePair] = []
    while len(pairs) < n:
        ex = task.sample(rng, split)
        digits = ex.metadata["digits"]
        if len(set(digits)) < 2:  # every permutation is sorted
            continue
        while True:
            rejected = "".join(rng.permutation(list(digits)))
            if sortedness("", rejected) < 1.0:
                break
        pairs.append(PreferencePair(ex.prompt, str(ex.answer), rejected, group=len(pairs), row=len(pairs)))
    return pairs
