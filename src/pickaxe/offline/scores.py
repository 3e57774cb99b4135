"""D4RL-style normalised scores: ``100 * (score - random) / (expert - random)``, with the random and expert
references a generated dataset stores in its metadata (Minari's ``ref_min_score`` and ``ref_max_score``). Torch-free."""

from __future__ import annotations

from typing import Any

import numpy as np


def normalized_score(returns: Any, random: float, expert: float) -> np.ndarray:
    """``100 * (returns - random) / (expert - random)`` elementwise: 0 is the random policy, 100 the expert.
    ``ValueError`` when the references are equal (no scale)."""
    if expert == random:
        raise ValueError(f"the expert and random references are equal ({expert}); no normalised score")
    return 100.0 * (np.asarray(returns, dtype=np.float64) - random) / (expert - random)


def references(metadata: dict[str, Any]) -> tuple[float, float] | None:
    """``(random, expert)`` references of a dataset's metadata, None when it records none (or equal ones)."""
    low, high = metadata.get("ref_min_score"), metadata.get("ref_max_score")
    if not isinstance(low, int | float) or not isinstance(high, int | float) or low == high:
        return None
    return float(low), float(high)
