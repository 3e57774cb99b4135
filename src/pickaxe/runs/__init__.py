"""Runs: the run directory, its manifest, metric tracking, checkpoints, kept policies, status and listing.

Names resolve on first use (PEP 562), so ``pickaxe.runs.status`` and ``pickaxe.runs.listing`` import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pickaxe.lazy import lazy_getattr

_LAZY = {
    "Run": "pickaxe.runs.run",
    "default_run_dir": "pickaxe.runs.run",
    "load_model": "pickaxe.runs.model",
    "list_policies": "pickaxe.runs.policies",
    "save_policy": "pickaxe.runs.policies",
}
__all__ = list(_LAZY)

if TYPE_CHECKING:
    from pickaxe.runs.model import load_model  # noqa: F401
    from pickaxe.runs.policies import list_policies, save_policy  # noqa: F401
    from pickaxe.runs.run import Run, default_run_dir  # noqa: F401


__getattr__ = lazy_getattr("pickaxe.runs", _LAZY, globals())
