"""Fault injection for tests: SIGKILL this process at a named point, the way a crash or OOM-kill would.

``PICKAXE_FAULT="<point>:<n>"`` kills the process the n-th time it reaches ``point``. Points:

- ``iteration``: after each training iteration (its log record and any checkpoint written);
- every write of the checkpoint protocol, in order: ``checkpoint-tensors`` (tensor file written),
  ``checkpoint-meta`` (meta.json written), ``checkpoint-shards`` (the other learners' shard files written, when the
  state is sharded; reached by every save), ``checkpoint-manifest`` (MANIFEST.json written),
  ``checkpoint-write`` (all files synced, folder not yet renamed into place), ``checkpoint-renamed``
  (folder in place, ``latest`` not yet updated), ``latest-tmp`` (the new ``latest`` written to a temporary
  file, not yet renamed over the old one), ``checkpoint-retention`` (an old checkpoint renamed aside for
  deletion, not yet deleted).

With ``PICKAXE_FAULT_ONCE=<file>`` the fault fires only if that file does not exist yet (it is created
first), so a restarted process runs through.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

CHECKPOINT_POINTS = (
    "checkpoint-tensors",
    "checkpoint-meta",
    "checkpoint-shards",
    "checkpoint-manifest",
    "checkpoint-write",
    "checkpoint-renamed",
    "latest-tmp",
    "checkpoint-retention",
)
"""The fault points of one checkpoint save, in the order a save reaches them."""

_hits: Counter[str] = Counter()


def fault_point(point: str) -> None:
    """Kill the process here if ``PICKAXE_FAULT`` names this point and its count is reached."""
    spec = os.environ.get("PICKAXE_FAULT")
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    _hits[point] += 1
    if _hits[point] != int(count or 1):
        return
    once = os.environ.get("PICKAXE_FAULT_ONCE")
    if once:
        if Path(once).exists():
            return
        Path(once).touch()
    os.kill(os.getpid(), signal.SIGKILL)
