"""``settle_for_training``: the objects alive after building the models leave the garbage collector's full passes,
and on Linux glibc the blocks of a training step are reused instead of being mapped afresh (no page faults)."""

import json
import subprocess
import sys
import textwrap

import pytest

from pickaxe.train.runtime import tune_allocator

CHILD = textwrap.dedent(
    """
    import ctypes, ctypes.util, gc, json, resource, sys
    import torch
    from pickaxe.train.runtime import settle_for_training

    def faults_of_steps() -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):  # a "step": 10 activations of 4 MiB alive together, freed at its end
            kept = [torch.empty(1 << 20).fill_(1.0) for _ in range(10)]
            del kept
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    # glibc's starting thresholds, fixed (its dynamic threshold otherwise depends on what the process freed before)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallopt(-3, 128 << 10), libc.mallopt(-1, 128 << 10)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    faults_of_steps()
    plain = faults_of_steps()
    model = torch.nn.Linear(4, 4)
    first = settle_for_training()
    again = settle_for_training()
    faults_of_steps()
    settled = faults_of_steps()
    print(json.dumps({
        "frozen": first.frozen_objects, "count": gc.get_freeze_count(), "again": again.frozen_objects,
        "left": len(gc.get_objects()), "tuned": first.allocator_tuned, "plain": plain, "settled": settled,
    }))
    """
)


def _child() -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settle_freezes_live_objects_once_and_stops_per_step_page_faults() -> None:
    r = _child()
    assert r["frozen"] > 10_000 and r["frozen"] == r["count"]  # torch's objects, frozen by the first call only
    assert r["again"] == 0
    assert r["left"] < r["frozen"] // 10  # what a full collection still walks
    if not tune_allocator():
        pytest.skip("no glibc: the allocator is left as it is")
    assert r["tuned"]
    assert r["plain"] >= 20 * 5000  # each 4 MiB block mapped afresh: ~10k faults per step
    assert r["settled"] < r["plain"] // 20  # reused from the heap
