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

Memory (``--rss-gb``, default 1.0; 0 skips it): a fresh subprocess per writer holds a state of that many GB of
float32 tensors (a model-like mix: one embedding-sized tensor, many 4 MiB layers, and the two AdamW moments of each)
and reports its peak RSS while saving against its RSS before (``rss_<writer>_save_peak_ratio``: the target is
<= 1.1, since training peaks at about the RSS it holds when it checkpoints), then drops the state and loads it,
reporting the peak above the state-free RSS in units of the state's size (``rss_<writer>_load_peak_over_state``:
1.0 is the state once). Peaks are the kernel's (VmHWM, reset through ``/proc/self/clear_refs``); the anonymous part
(RssAnon: memory the process allocated, not mapped file pages the kernel can drop) is sampled every millisecond.
Writers: ``ours`` (``CheckpointManager``: streamed writes, tensor-by-tensor loads) and ``save_file`` (what it did
before: ``flatten_state`` + ``safetensors.torch.save_file`` + a digest, ``load_file``).

Usage: ``python benchmarks/checkpoint.py [--repeats N] [--rss-gb GB] [--no-speed]``; the last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
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


# ------------------------------------------------------------------------------------------------ memory
def status_kb() -> dict[str, int]:
    """This process's memory figures from /proc/self/status, in kB (VmRSS, VmHWM, RssAnon, RssFile)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


class Peak:
    """The peak RSS (kernel-tracked, reset on entry) and the sampled peak anonymous RSS within a ``with`` block."""

    def __enter__(self) -> Peak:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.before = status_kb()
        self.anon = self.before["RssAnon"]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self) -> None:
        while not self.done.wait(0.001):
            self.anon = max(self.anon, status_kb()["RssAnon"])

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.after = status_kb()
        self.peak = self.after["VmHWM"]
        self.anon = max(self.anon, self.after["RssAnon"])


def model_like_state(gb: float, device: str = "cpu") -> dict[str, Any]:
    """~``gb`` GB of float32 on ``device``: weights (one embedding of a quarter of them, the rest 1024x1024 layers)
    and the two AdamW moments of each, every page touched."""
    params = int(gb * 1e9 / 4 / 3)
    embed_rows = params // 4 // 1024
    layers = (params - embed_rows * 1024) // (1024 * 1024)
    shapes = {"embed": (embed_rows, 1024), **{f"layers.{i}.weight": (1024, 1024) for i in range(layers)}}
    weights = {k: torch.full(s, 0.5, device=device) for k, s in shapes.items()}
    moments = {
        i: {
            "step": torch.tensor(10.0),
            "exp_avg": torch.full(s, 1e-3, device=device),
            "exp_avg_sq": torch.full(s, 1e-6, device=device),
        }
        for i, s in enumerate(shapes.values())
    }
    return {"algo": {"policy": weights, "optimizer": {"state": moments}}, "trainer": {"step": 10}}


def rss_child(writer: str, gb: float, folder: Path, device: str) -> dict[str, float]:
    """In a fresh process: peak host RSS of saving a ~``gb`` GB state on ``device`` with ``writer``, and of loading
    it (to the host, every page read)."""
    torch.set_num_threads(1)
    torch.empty(1, device=device)  # the accelerator's context is part of the RSS before
    held = {"state": model_like_state(gb, device)}  # dropped before loading
    mb = nbytes(held) / 1e6
    if writer == "ours":
        mgr = CheckpointManager(folder, keep_last=1, keep_best=0)
        save, load = (lambda: mgr.save(1, held["state"])), (lambda: mgr.load()[0])
    else:
        from safetensors.torch import load_file, save_file

        from pickaxe.digests import file_digest
        from pickaxe.runs.state import flatten_state

        def save() -> None:
            tensors, _ = flatten_state(held["state"])
            save_file(tensors, folder / "tensors.safetensors")
            fsync_path(folder / "tensors.safetensors")
            file_digest(folder / "tensors.safetensors")

        def load() -> Any:
            return load_file(folder / "tensors.safetensors")

    folder.mkdir(parents=True, exist_ok=True)
    gc.collect()
    t0 = time.perf_counter()
    with Peak() as saving:
        save()
    save_s = time.perf_counter() - t0
    held.clear()
    gc.collect()
    t0 = time.perf_counter()
    with Peak() as loading:
        loaded = load()
        touch(loaded)  # safetensors maps the file: its pages count once they are read
    load_s = time.perf_counter() - t0
    assert abs(nbytes(loaded) / 1e6 - mb) < 1, "the loaded state is the saved one"
    base, anon_base = loading.before["VmRSS"] / 1e3, loading.before["RssAnon"] / 1e3
    return {
        "state_mb": mb,
        "save_rss_before_mb": saving.before["VmRSS"] / 1e3,
        "save_rss_peak_mb": saving.peak / 1e3,
        "save_peak_ratio": saving.peak / saving.before["VmRSS"],
        "save_anon_peak_ratio": saving.anon / saving.before["RssAnon"],
        "save_extra_mb": (saving.peak - saving.before["VmRSS"]) / 1e3,
        "save_s": save_s,
        "load_rss_base_mb": base,
        "load_rss_peak_mb": loading.peak / 1e3,
        "load_peak_over_state": (loading.peak / 1e3 - base) / mb,
        "load_anon_peak_over_state": (loading.anon / 1e3 - anon_base) / mb,
        "load_s": load_s,
    }


def fsync_path(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def bench_rss(gb: float, root: Path, device: str) -> dict[str, float]:
    """Run :func:`rss_child` for each writer in its own subprocess; its figures as ``rss_<writer>_<figure>``."""
    out: dict[str, float] = {}
    for writer in ("ours", "save_file"):
        cmd = [sys.executable, __file__, "--rss-child", writer, "--rss-gb", str(gb), "--dir", str(root / writer)]
        cmd += ["--rss-device", device]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
        out.update({f"rss_{writer}_{k}": v for k, v in figures.items()})
        shutil.rmtree(root / writer, ignore_errors=True)
    return out


def print_rss(results: dict[str, Any]) -> None:
    state = f"a {results['rss_ours_state_mb']:.0f} MB state on {results['rss_device']}"
    print(f"memory: {state}; peak RSS saving / RSS before (target <= 1.1), and the MB it added,")
    print("loading: peak above the state-free RSS in states (1.0 = the state once); anon = allocated memory only")
    head = ("writer", "before MB", "save peak MB", "save ratio", "anon ratio", "added MB", "save s", "load peak")
    head += ("anon", "load s")
    print(" ".join(f"{h:>12}" for h in head))
    for w in ("ours", "save_file"):
        r = {k.removeprefix(f"rss_{w}_"): v for k, v in results.items() if k.startswith(f"rss_{w}_")}
        row = (r["save_rss_before_mb"], r["save_rss_peak_mb"], r["save_peak_ratio"], r["save_anon_peak_ratio"])
        row += (r["save_extra_mb"], r["save_s"], r["load_peak_over_state"], r["load_anon_peak_over_state"], r["load_s"])
        print(f"{w:>12} " + " ".join(f"{v:12.2f}" for v in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rss-gb", type=float, default=1.0, help="state size of the memory benchmark (0: skip it)")
    parser.add_argument("--rss-device", default="cpu", help="where the memory benchmark's state lives (cpu, cuda)")
    parser.add_argument("--no-speed", action="store_true", help="only the memory benchmark")
    parser.add_argument("--rss-child", choices=("ours", "save_file"), help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args.rss_gb, args.dir, args.rss_device)))
        return
    torch.set_num_threads(1)
    results: dict[str, Any] = {"repeats": args.repeats, "rss_gb": args.rss_gb, "rss_device": args.rss_device}
    with tempfile.TemporaryDirectory(prefix="pickaxe-ckpt-bench-") as tmp:
        if args.rss_gb > 0:
            results.update(bench_rss(args.rss_gb, Path(tmp), args.rss_device))
            print_rss(results)
        if args.no_speed:
            print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in results.items()}))
            return
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
