"""Runs: the run directory, its manifest, metric tracking, checkpoints, status and listing.

Names resolve on first use (PEP 562), so ``pickaxe.runs.status`` and ``pickaxe.runs.listing`` import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {"Run": "pickaxe.runs.run", "default_run_dir": "pickaxe.runs.run", "load_model": "pickaxe.runs.run"}
__all__ = list(_LAZY)

if TYPE_CHECKING:
    from pickaxe.runs.run import Run, default_run_dir, load_model  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pickaxe.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
