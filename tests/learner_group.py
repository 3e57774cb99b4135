"""Running a test's work on a group of data-parallel learners (gloo on localhost, forked from the test process so
they inherit the imported torch and transformers: spawning re-imports them, ~40 s here instead of ~4 s)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from pickaxe.dist import data_parallel

Work = Callable[[Any, Path], dict[str, Any]]
"""What each learner computes: ``work(cases, out)`` -> its results (saved with ``torch.save``)."""


def _learner(rank: int, port: int, world: int, work: Work, cases: Any, out: str) -> None:
    # whatever the test process left for its garbage collector stays uncollected here: a process group an earlier
    # test destroyed but whose wrapper still waits in a cycle would, collected in this fork, join the threads of
    # this learner's own group (same addresses) and hang
    gc.freeze()
    torch.set_num_threads(1)
    data_parallel.init(rank, world, port=port)
    try:
        torch.save(work(cases, Path(out)), Path(out) / f"rank{rank}.pt")
    finally:
        data_parallel.shutdown()


def on_learners(work: Work, cases: Any, out: Path, world: int = 2) -> list[dict[str, Any]]:
    """Each learner's ``work(cases, out)`` results, ``world`` learners in one process group, in rank order."""
    gc.collect()  # collected in the test process, where their threads are
    port = data_parallel.free_port()
    mp.start_processes(
        _learner, args=(port, world, work, cases, str(out)), nprocs=world, join=True, start_method="fork"
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def same_metrics(got: dict[str, float], want: dict[str, float], rel: float = 1e-5) -> None:
    """A sharded learner's update metrics equal the single process's within ``rel`` (``sync/``, ``time/`` and
    ``mem/`` are its own)."""
    import pytest

    own = ("sync/", "time/", "mem/")
    got, want = ({k: v for k, v in m.items() if not k.startswith(own)} for m in (got, want))
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=rel, abs=1e-6), f"{key}: {got[key]} against {value}"


def close_weights(got: torch.Tensor, want: torch.Tensor, step: float, atol: float = 1e-5) -> None:
    """Weights trained by several learners equal the single process's up to the gradients' summation order.

    Adam divides each element's gradient by that element's own running magnitude, so where a gradient is near zero,
    the rounding of its sum (which the learners' shares and the CPU's kernels decide) moves the element's step by a
    visible fraction of ``step`` (the learning rate): seen 5e-5 of a 1e-3 step on one element of a 64x32 matrix, on
    an AMD EPYC where another CPU kept every element within 1e-5. A real fault (a learner's share lost or counted
    twice, a shard in the wrong place) moves most elements by about ``step``. Asserted: every element within a tenth
    of ``step``, and all but 0.1% of them within ``atol``."""
    diff = (got - want).abs()
    assert diff.max() <= 0.1 * step, f"an element {float(diff.max()):.3g} off: over a tenth of an Adam step"
    outside = int((diff > atol).sum())
    assert outside <= 0.001 * diff.numel(), f"{outside} of {diff.numel()} elements more than {atol:g} off"
