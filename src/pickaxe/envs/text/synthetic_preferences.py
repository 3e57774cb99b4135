"""Synthetic preference data with a known answer, for testing reward models and DPO.

* :func:`sorting_preferences`: ``sort 4821=``; chosen is the sorted digits, rejected a shuffled (unsorted)
  permutation of them. The hidden gold scorer is :func:`sortedness`; a reward model that learns it ranks unseen
  pairs correctly.
* :func:`sort_quality`: the gold scorer of the RLHF recipes (``synthetic-*``), over any completion of a ``sort``
  prompt: sortedness times how well the completion's digits match the prompt's, so neither an unsorted answer nor
  a sorted string of the wrong digits scores well. Preferences labelled by it over the model's own samples train
  a proxy reward model; the gold score stays hidden from training and is only logged.

Prompts follow the task's stable hash split (``pickaxe.envs.text.tasks``), so ``split="heldout"`` pairs never share
a prompt with ``split="train"`` ones.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, Literal

import numpy as np

from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.envs.text.tasks import SortDigits

__all__ = ["GOLD_SCORES", "sort_quality", "sortedness", "sorting_preferences"]


def sortedness(prompt: str, completion: str, metadata: dict[str, Any] | None = None) -> float:
    """The gold score of a digit string: the fraction of adjacent digit pairs in non-decreasing order (1.0 for
    a sorted string or one of fewer than two characters)."""
    s = completion.strip()
    if len(s) < 2:
        return 1.0
    return sum(a <= b for a, b in itertools.pairwise(s)) / (len(s) - 1)


def prompt_digits(prompt: str) -> str:
    """The digit string of a ``sort <digits>=`` prompt (empty when the prompt has no such part)."""
    body = prompt.strip().removesuffix("=").split()
    return body[-1] if len(body) >= 2 and body[-1].isdigit() else ""


def sort_quality(prompt: str, completion: str, metadata: dict[str, Any] | None = None) -> float:
    """Gold score in [0, 1] of ``completion`` for a ``sort <digits>=`` prompt: :func:`sortedness` of the completion
    times the F1 of its characters against the prompt's digits as multisets (1.0 only for the sorted answer; 0 for
    an empty completion). Reads the digits from ``metadata["digits"]`` or else the prompt."""
    digits = str((metadata or {}).get("digits") or prompt_digits(prompt))
    s = completion.strip()
    if not s or not digits:
        return 0.0
    overlap = sum((Counter(s) & Counter(digits)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(s), overlap / len(digits)
    return sortedness("", s) * 2 * precision * recall / (precision + recall)


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


GOLD_SCORES = {"sort-quality": sort_quality}
"""Gold scores a run config can name in ``--data.gold`` (besides the built-in rewards and import paths)."""
