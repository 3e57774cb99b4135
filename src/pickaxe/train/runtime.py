"""Process settings for a long training loop, applied once the models are built (``settle_for_training``).

* Garbage collection: torch and transformers leave ~420k long-lived Python objects after import and model
  construction (~340k for a classic run). Every full (generation-2) collection walks all of them (~0.3 s on a CPU
  core), triggered every few dozen steps of an LLM run by the autograd bookkeeping of each step, and once or twice
  in a 5-second CartPole run (~6% of it). ``gc.freeze()`` moves the objects alive at that point to
  the permanent generation, so collections only walk what the loop itself allocates. Objects alive then are never
  collected as cyclic garbage afterwards (reference counting still frees them), which suits a process that trains
  one run.
* Allocator (Linux glibc only, a no-op elsewhere): glibc serves blocks above a dynamic threshold with ``mmap`` and
  returns them to the OS on free, and trims the heap top above 128 KiB, so torch's CPU tensors of a step are mapped
  and unmapped again every step (thousands of minor page faults per update). ``mallopt`` fixes the mmap threshold
  at ``mmap_threshold`` and the trim threshold at ``trim_threshold``, so freed blocks are reused by the next step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from dataclasses import dataclass

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers (malloc.h)."""

MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from the heap (glibc's largest allowed fixed threshold on 64-bit systems)."""
TRIM_THRESHOLD = 256 << 20
"""Free memory at the heap top kept for reuse instead of being returned to the OS."""


@dataclass(frozen=True)
class RuntimeSettings:
    """What :func:`settle_for_training` did: objects moved to the permanent generation (0 when an earlier call had
    already frozen them) and whether glibc's allocator thresholds were set."""

    frozen_objects: int
    allocator_tuned: bool


def settle_for_training(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD, freeze: bool = True
) -> RuntimeSettings:
    """Freeze the objects alive now out of the garbage collector's full passes (once per process: later calls
    leave the frozen set as it is) and, on Linux with glibc, fix the allocator's mmap and trim thresholds. Call it
    after building the models and before the training loop."""
    frozen = freeze_long_lived() if freeze else 0
    return RuntimeSettings(frozen, tune_allocator(mmap_threshold, trim_threshold))


def freeze_long_lived() -> int:
    """Move the objects alive now to the garbage collector's permanent generation, after one collection (garbage
    must not be frozen with them), once per process; the number frozen, 0 when an earlier call had frozen them.
    Before ``os.fork`` too (as Python's gc docs advise): a child's collections then neither walk nor copy them."""
    if gc.get_freeze_count():
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def tune_allocator(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``; True when both were set, False where there is no
    glibc (macOS, Windows, musl) or it refused a value."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``gnu_get_libc_version`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
