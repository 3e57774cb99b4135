"""Child processes that do not outlive their parent (torch-free: the queue worker and Ray jobs use it)."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

NOT_CRASHES = (0, 2, 130, 143, -2, -15)
"""Exit statuses of a training process that are not crashes, so nothing restarts or retries it: done (0), a user
error or deliberate stop (2), stopped by SIGINT/SIGTERM after checkpointing (130) or before it could (143, -2,
-15)."""


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child of this process: the child gets ``sig`` when this process dies, even by
    SIGKILL (Linux ``PR_SET_PDEATHSIG``), so no orphan keeps training. None where that does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def setup() -> None:
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above took effect
            os.kill(os.getpid(), sig)

    return setup
