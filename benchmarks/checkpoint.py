"""Checkpoint save/load speed: pickaxe's CheckpointManager against plain torch.save / torch.load.

Two states: (a) PPO-CartPole-sized: actor 4-64-64-2 and critic 4-64-64-1 MLPs, their Adam state after one
step, and python / numpy / torch RNG states; (b) ~100 MB: an MLP with ~8.4M float32 parameters plus its Adam
state (exp_avg, exp_avg_sq), about 3 x 33.6 MB.

Ours: ``CheckpointManager.save`` (safetensors + json, sha256 manifest, fsync of every file and folder,
atomic rename, ``latest`` pointer, retention deleting the previous checkpoint) and ``CheckpointManager.load``
(sha256 verification of every file, then safetensors + json). Baseline: ``torch.save`` of the same state
object to a file in the same temp dir, *without* fsync, and ``torch.load(weights_only=False)``. Loads are
timed until every loaded tensor page is resident (one byte per 4 KiB page is read), because safetensors
maps the file lazily while torch.load reads it. Page cache is warm for both. Median over ``--repeats``;
ours and torch take turns so that other processes slow both alike. Besides wall seconds, the CPU seconds
of the process (all threads) are compared: on a busy machine they are the steadier figure.

Usage: ``python benchmarks/checkpoint.py [--repeats N]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pickaxe.runs.checkpoint import CheckpointManager


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def trained_state(model: nn.Module, in_dim: int) -> dict[str, Any]:
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    model(torch.randn(8, in_dim)).pow(2).mean().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def ppo_state() -> dict[str, Any]:
    torch.manual_seed(0)
    policy, value = mlp(4, 64, 64, 2), mlp(4, 64, 64, 1)
    ac = nn.ModuleDict({"policy": policy, "value": value})
    opt = torch.optim.Adam(ac.parameters(), lr=3e-4)
    x = torch.randn(8, 4)
    (policy(x).pow(2).mean() + value(x).pow(2).mean()).backward()
    opt.step()
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    return {"model": ac.state_dict(), "optim": opt.state_dict(), "global_step": 2048, "rng": rng}


def big_state() -> dict[str, Any]:
    torch.manual_seed(0)
    return trained_state(mlp(1024, 2048, 2048, 1024), 1024)


def nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def touch(obj: Any) -> int:
    """Read one byte per 4 KiB page of every tensor so lazily mapped data counts as loaded."""
    if isinstance(obj, torch.Tensor):
        return int(obj.reshape(-1).view(torch.uint8)[::4096].sum()) if obj.numel() else 0
    if isinstance(obj, dict):
        return sum(touch(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(touch(v) for v in obj)
    return 0


def torch_save_fsync(state: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def medians(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median wall seconds (``<op>_s``) and CPU seconds of this process, all threads (``<op>_cpu_s``).

    The functions take turns so that load from other processes hits them alike.
    """
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times.setdefault(f"{key}_s", []).append(time.perf_counter() - t0)
            times.setdefault(f"{key}_cpu_s", []).append(time.process_time() - c0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench(name: str, state: dict[str, Any], root: Path, repeats: int) -> dict[str, float]:
    mgr = CheckpointManager(root / f"{name}-run", keep_last=1, keep_best=0)
    pt = root / f"{name}.pt"
    step = iter(range(1, 10**6))
    mgr.save(0, state)  # warm-up (imports, first directory creation)
    torch.save(state, pt)
    out = medians(
        {
            "save": lambda: mgr.save(next(step), state),
            "save_torch": lambda: torch.save(state, pt),
            "save_torch_fsync": lambda: torch_save_fsync(state, pt),
        },
        repeats,
    )
    loads = {
        "load": lambda: touch(mgr.load()[0]),
        "load_torch": lambda: touch(torch.load(pt, weights_only=False)),
    }
    out.update(medians(loads, repeats))
    for op in ("save", "load"):
        out[f"{op}_ratio"] = out[f"{op}_s"] / out[f"{op}_torch_s"]
        out[f"{op}_cpu_ratio"] = out[f"{op}_cpu_s"] / out[f"{op}_torch_cpu_s"]
    out["mb"] = nbytes(state) / 1e6
    return {f"{name}_{k}": v for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, Any] = {"repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="pickaxe-ckpt-bench-") as tmp:
        for name, make in (("ppo", ppo_state), ("big", big_state)):
            results.update(bench(name, make(), Path(tmp), args.repeats))

    print(f"checkpoint benchmark, median of {args.repeats}; warm page cache; loads touch every page")
    print("ours: fsync + sha256 manifest; torch: torch.save without fsync (torch+fsync: with, for reference)")
    head = ("state", "MB", "op", "ours s", "torch s", "ours/torch", "CPU ours/torch", "torch+fsync s")
    widths = (6, 7, 5, 9, 9, 11, 15, 14)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for name in ("ppo", "big"):
        for op in ("save", "load"):
            r = {k: results[f"{name}_{op}_{k}"] for k in ("s", "torch_s", "ratio", "cpu_ratio")}
            fs = f"{results[f'{name}_save_torch_fsync_s']:14.4f}" if op == "save" else ""
            row = f"{name:>6} {results[f'{name}_mb']:7.2f} {op:>5} {r['s']:9.4f} {r['torch_s']:9.4f}"
            print(f"{row} {r['ratio']:11.2f} {r['cpu_ratio']:15.2f} {fs}")
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in results.items()}))


if __name__ == "__main__":
    main()
