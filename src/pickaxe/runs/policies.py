"""Policy retention: the weights a run needs to act, kept at every evaluation, so every evaluated step stays
selectable after ``keep_last`` has pruned the full training states.

Layout, ``RUN_DIR/policies/step-<12-digit step>/``:

- ``model.safetensors``: the acting networks' weights (keys ``<network>.<param>``, as in the final model); no
  optimizer, buffer or critic state;
- ``model.json``: its size and sha256, the env step and the eval metrics logged at that step.

A policy is written into ``policies/.tmp-step-<N>-<random>/`` with both files and the folder fsynced, then renamed
into place, so a folder named ``step-*`` is always complete. Loading verifies size and sha256 first. Retention never
prunes policies; a resumed run removes the ones newer than its checkpoint (they belong to the abandoned future), so
its ``policies/`` ends equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pickaxe.errors import PickaxeError
from pickaxe.runs.checkpoint import _fsync_dir
from pickaxe.runs.weights import (
    MODEL_DIGEST_FILE,
    MODEL_FILE,
    load_flat_weights,
    verify_weights,
    write_json_synced,
    write_weights,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

POLICIES_DIR = "policies"
_STEP_RE = re.compile(r"step-(\d{12})")
_TMP = ".tmp-"
NOT_ACTING = ("critic", "q_target", "actor_target")
"""Networks an algorithm trains but does not act with (critics, target networks): not kept."""


@dataclass(frozen=True)
class PolicyInfo:
    """A kept policy: its env step, folder, the weights' sha256 and size (None when ``model.json`` is unreadable:
    loading it will say why) and the eval metrics of its step."""

    step: int
    path: Path
    sha256: str | None
    size: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)


def acting_networks(networks: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """The networks needed to act (``networks`` without :data:`NOT_ACTING`)."""
    return {name: net for name, net in networks.items() if name not in NOT_ACTING}


def policy_dir(run_dir: str | Path, step: int) -> Path:
    """``RUN_DIR/policies/step-<12 digits>``."""
    return Path(run_dir) / POLICIES_DIR / f"step-{step:012d}"


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def save_policy(run_dir: str | Path, networks: dict[str, nn.Module], step: int, metrics: dict[str, Any]) -> Path:
    """Keep the acting networks' weights of env step ``step`` with their digest and the step's ``eval/`` metrics
    (non-finite ones as null); atomic (see the module docstring). A policy of the same step is replaced.
    Returns its folder."""
    root = Path(run_dir) / POLICIES_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = policy_dir(run_dir, step)
    tmp = root / f"{_TMP}{final.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        digest = write_weights(tmp / MODEL_FILE, acting_networks(networks))  # streamed, hashed, fsynced
        kept = {k: _finite(v) for k, v in sorted(metrics.items()) if k.startswith("eval/")}
        record = {"file": MODEL_FILE, **digest, "step": int(step), "metrics": kept}
        write_json_synced(tmp / MODEL_DIGEST_FILE, record)
        _fsync_dir(tmp)
        if final.exists():  # a rename cannot replace a non-empty folder: move the old one aside first
            _remove(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _remove(folder: Path) -> None:
    """Delete a policy folder, renamed first so a half-deleted one is never listed."""
    trash = folder.with_name(f"{_TMP}del-{folder.name}-{secrets.token_hex(4)}")
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / MODEL_DIGEST_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or type(record.get("size")) is not int or not isinstance(record.get("sha256"), str):
        return None
    return record


def list_policies(run_dir: str | Path) -> list[PolicyInfo]:
    """The run's kept policies sorted by step (digests not verified; :func:`load_policy` verifies)."""
    root = Path(run_dir) / POLICIES_DIR
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_RE.fullmatch(p.name)
        if not (m and p.is_dir()):
            continue
        record = _read_record(p) or {}
        metrics = record.get("metrics")
        out.append(
            PolicyInfo(
                int(m.group(1)),
                p,
                record.get("sha256"),
                record.get("size"),
                metrics if isinstance(metrics, dict) else {},
            )
        )
    return sorted(out, key=lambda i: i.step)


def prune_policies(run_dir: str | Path, after: int) -> list[int]:
    """Remove the kept policies of steps after ``after`` (what a run resumed at step ``after`` will redo) and any
    interrupted write; returns the removed steps."""
    root = Path(run_dir) / POLICIES_DIR
    if not root.is_dir():
        return []
    for p in root.glob(f"{_TMP}*"):
        shutil.rmtree(p, ignore_errors=True)
    removed = []
    for info in list_policies(run_dir):
        if info.step > after:
            _remove(info.path)
            removed.append(info.step)
    return removed


def load_policy_tensors(run_dir: str | Path, step: int, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The verified weights of the policy kept at ``step``; a missing, truncated or corrupted one is a one-line
    ``PickaxeError`` naming the file and the fix."""
    folder = policy_dir(run_dir, step)
    path = folder / MODEL_FILE
    fix = f"evaluate another step, or delete {folder}"
    if not path.is_file():
        raise PickaxeError(f"{run_dir} kept no policy at env step {step} ({path} is missing); {fix}")
    record = _read_record(folder)
    if record is None:
        raise PickaxeError(f"{folder / MODEL_DIGEST_FILE} is missing, unreadable or malformed; {fix}")
    verify_weights(path, record, fix)
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise PickaxeError(f"{path} is not a valid safetensors file ({' '.join(str(e).split())}); {fix}") from None


def load_policy(
    run_dir: str | Path, networks: dict[str, nn.Module], step: int, device: str | torch.device = "cpu"
) -> None:
    """Load the policy kept at ``step`` into ``networks`` (acting networks only: a critic or target network keeps its
    weights), verified first."""
    tensors = load_policy_tensors(run_dir, step, device)
    load_flat_weights(acting_networks(networks), tensors, policy_dir(run_dir, step) / MODEL_FILE)
