"""Sharded learners at a real model shape: per-process peak memory and seconds per GRPO step for one learner, two
learners with ``--dist.shard fsdp`` (the frozen KL reference sharded too), two with fsdp and ``--dist.offload
optimizer``, and two with fsdp but the KL reference whole on rank 0 (``--dist.no-shard-reference``); the weight sync
from the shards as a share of the step; peak memory while checkpointing against the training peak.

Usage: ``python benchmarks/sharding.py [--shape qwen2-0.5b] [--updates 3] [--micro-batch 4] [--new-tokens N]
[--checkpointing] [--quick]``. Each configuration is one ``pickaxe train arith-grpo --model.shape SHAPE`` process
(random weights, no warm start, one torch thread per process), run one after the other so they never share the machine.
A sampler reads every process of the run (rank 0 and the learners it starts) from ``/proc`` ten times a second: resident
memory, and whether a checkpoint is being written (a ``checkpoints/.tmp-*`` folder exists). Reported per configuration:
each process's peak RSS while starting (building, sharding, up to the end of the first update), while training (after
it) and while checkpointing, the median ``time/update_s`` over the updates after the first, the CPU seconds of an update
(rank 0's ``time/update_cpu_s`` plus the other learners' from ``/proc``) per trained token (a sharded update also scores
the KL reference, which one learner's collector scores before it, so this figure charges the sharded run for it), the
CPU seconds of a whole step (every process, from one update's record to the next: rollout and update) per trained token,
each learner's training state (``mem/train_state_bytes``: weights, gradients and optimizer state, its shards when
sharded), the gather of the policy from the shards (``time/gather_s``) as a share of the update and of the step (the
rollout's ``time/collect_s`` plus the update), and the planner's prediction (``pickaxe plan``) beside the measurement.
Ratios are against the one-learner run measured in the same invocation; the last line is one JSON object with every
figure (``fsdp2``'s ``peak_train_vs_whole_ref``: each process's training peak, largest first, against
``fsdp2-whole-ref``'s). ``--quick`` (what the benchmark test runs) uses the tiny ``tiny-qwen2`` shape and 2 updates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = {
    "one": ["--dist.learners", "1"],
    "fsdp2": ["--dist.learners", "2", "--dist.shard", "fsdp"],
    "fsdp2-offload": ["--dist.learners", "2", "--dist.shard", "fsdp", "--dist.offload", "optimizer"],
    # the frozen KL reference kept whole on rank 0 (scored by its collector), as before it was sharded
    "fsdp2-whole-ref": ["--dist.learners", "2", "--dist.shard", "fsdp", "--dist.no-shard-reference"],
}


def _read(path: str) -> str:
    """A ``/proc`` file's text."""
    return Path(path).read_text()


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux ``/proc``)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            kids = [
                int(c) for t in os.listdir(f"/proc/{p}/task") for c in _read(f"/proc/{p}/task/{t}/children").split()
            ]
        except OSError:
            continue
        out += kids
        stack += kids
    return out


def _rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MB, None once it is gone."""
    try:
        for line in _read(f"/proc/{pid}/status").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) ``pid`` has used, None once it is gone."""
    try:
        fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _is_learner(pid: int) -> bool:
    """A learner process (not multiprocessing's resource tracker)."""
    try:
        cmd = _read(f"/proc/{pid}/cmdline")
    except OSError:
        return False
    return "resource_tracker" not in cmd


def run_config(name: str, args: argparse.Namespace, base: list[str], workdir: Path) -> dict[str, Any]:
    """Run one configuration as a ``pickaxe train`` process, sampling its processes' memory; its figures."""
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "pickaxe.cli", "train", *base, *CONFIGS[name], "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, dict[str, float]] = {}
    cpu: dict[int, float] = {}
    at_update: list[dict[int, float]] = []  # every process's CPU seconds when each update's record appeared
    start = time.perf_counter()
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None:
        writing = any(p.name.startswith(".tmp-") for p in (run_dir / "checkpoints").glob(".tmp-*"))
        # after the first update: the run has started, its learners have sharded, and it trains
        updates_now = metrics.read_text().count("time/update_s") if metrics.is_file() else 0
        for pid in [proc.pid, *_children(proc.pid)]:
            rss, used = _rss_mb(pid), _cpu_s(pid)
            if rss is None or used is None or not _is_learner(pid):
                continue
            cpu[pid] = used
            peak = peaks.setdefault(pid, {"start_mb": 0.0, "train_mb": 0.0, "checkpoint_mb": 0.0})
            key = "checkpoint_mb" if writing else "train_mb" if updates_now else "start_mb"
            peak[key] = max(peak[key], rss)
        if updates_now > len(at_update):
            at_update += [dict(cpu)] * (updates_now - len(at_update))
        time.sleep(0.1)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {err.strip().splitlines()[-1] if err.strip() else ''}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "time/update_s" in r]
    later = updates[1:] or updates
    update_s = statistics.median(r["time/update_s"] for r in later)
    gather_s = statistics.median(r.get("time/gather_s", 0.0) for r in later)
    step_s = statistics.median(r.get("time/collect_s", 0.0) + r["time/update_s"] for r in later)  # rollout + update
    learners = int(CONFIGS[name][1])
    ranked = sorted(peaks.values(), key=lambda p: -max(p.values()))[:learners]
    # CPU seconds of one update: rank 0's own (logged), plus what the other learners used from one update's record
    # to the next (they only update and gather; sampled ten times a second)
    followers = [pid for pid in cpu if pid != proc.pid]
    cpu_s, per_token, step_per_token = [], [], []
    for i in range(1, len(updates)):
        if i >= len(at_update):
            break
        others = sum(at_update[i].get(p, 0.0) - at_update[i - 1].get(p, 0.0) for p in followers)
        cpu_s.append(updates[i]["time/update_cpu_s"] + others)
        tokens = max(updates[i]["rollout/completion_length"] * updates[i]["grpo/sequences"], 1.0)
        per_token.append(cpu_s[-1] / tokens)
        # the whole step, every process: the rollout (generation, the collector's reference and reward scoring, or
        # the learners' when those are sharded) and the update, from one update's record to the next
        step_per_token.append(sum(at_update[i][p] - at_update[i - 1].get(p, 0.0) for p in at_update[i]) / tokens)
    return {
        "wall_s": time.perf_counter() - start,
        "update_s": update_s,
        "update_cpu_s": statistics.median(cpu_s) if cpu_s else None,
        "update_cpu_s_per_token": statistics.median(per_token) if per_token else None,
        "step_cpu_s_per_token": statistics.median(step_per_token) if step_per_token else None,
        "train_state_mb": round(updates[-1].get("mem/train_state_bytes", 0.0) / 2**20, 2),
        "gather_share": gather_s / update_s if update_s else 0.0,
        "gather_share_of_step": gather_s / step_s if step_s else 0.0,
        "peak_start_mb": [round(p["start_mb"]) for p in ranked],
        "peak_train_mb": [round(p["train_mb"]) for p in ranked],
        "peak_checkpoint_mb": [round(p["checkpoint_mb"]) for p in ranked],
        "plan": plan(base, CONFIGS[name]),
    }


def plan(base: list[str], flags: list[str]) -> Any:
    """The device peak (MB) ``pickaxe plan`` predicts for each kind of rank with the same flags (None if it fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "plan", *base, *flags, "--json"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return None
    try:
        planned = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return {r["ranks"]: round(r["device_peak"] / 2**20) for r in planned["ranks"]}


def main() -> None:
    """Parse the options, run every configuration, print a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2-0.5b")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch (16 per update)")
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=0,
        help="completion tokens per sequence (0: the recipe's); more tokens per "
        "micro-batch pass spread each pass's fixed all-gather and reduce-scatter over more trained tokens",
    )
    parser.add_argument(
        "--checkpointing",
        action="store_true",
        help="--algo.gradient-checkpointing true in every configuration (activations of one layer at a time: "
        "what lets long sequences fit)",
    )
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--quick", action="store_true", help="the tiny-qwen2 shape, 2 updates")
    args = parser.parse_args()
    if args.quick:
        args.shape, args.updates = "tiny-qwen2", 2
    prompts, group = 4, 4
    base = [
        "arith-grpo", "--model.shape", args.shape, "--warm-start.updates", "0", "--collector.prompts", str(prompts),
        "--collector.group-size", str(group), "--algo.micro-batch-size", str(args.micro_batch), "--eval.prompts", "4",
        "--eval.samples", "0", "--trainer.total-steps", str(args.updates * prompts * group),
        "--trainer.eval-every", str(10**9), "--device", "cpu", "--seed", "0", "--no-progress",
    ]  # fmt: skip
    if args.new_tokens:
        base += ["--engine.max-new-tokens", str(args.new_tokens)]
    if args.checkpointing:
        base += ["--algo.gradient-checkpointing", "true"]
    print(f"load average {os.getloadavg()[0]:.2f}; shape {args.shape}; {args.updates} updates each", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pickaxe-sharding-") as tmp:
        for name in args.configs:
            results[name] = run_config(name, args, base, Path(tmp))
            r = results[name]
            print(
                f"{name:>14}: update {r['update_s']:.2f} s ({r['update_cpu_s'] or 0:.1f} CPU-s), step "
                f"{1000 * (r['step_cpu_s_per_token'] or 0):.1f} CPU-ms per token, training state "
                f"{r['train_state_mb']} MB per learner, peak MB per process starting {r['peak_start_mb']}, "
                f"training {r['peak_train_mb']}, "
                f"checkpointing {r['peak_checkpoint_mb']}, gather {100 * r['gather_share']:.1f}% of the update "
                f"({100 * r['gather_share_of_step']:.1f}% of the step)",
                flush=True,
            )
    one = results.get("one")
    ratios: dict[str, Any] = {}
    if one is not None:
        for name, r in results.items():
            if name == "one":
                continue
            ratios[name] = {
                "peak_train_per_rank_vs_one": max(r["peak_train_mb"]) / max(one["peak_train_mb"]),
                "train_state_per_rank_vs_one": r["train_state_mb"] / (one["train_state_mb"] or 1),
                "cpu_s_per_token_vs_one": (r["update_cpu_s_per_token"] or 0.0) / (one["update_cpu_s_per_token"] or 1),
                "step_cpu_s_per_token_vs_one": (r["step_cpu_s_per_token"] or 0.0) / (one["step_cpu_s_per_token"] or 1),
            }
    whole_ref = results.get("fsdp2-whole-ref")
    if whole_ref is not None and "fsdp2" in results:  # the frozen reference sharded vs whole on rank 0
        ratios.setdefault("fsdp2", {})["peak_train_vs_whole_ref"] = [
            a / (b or 1) for a, b in zip(results["fsdp2"]["peak_train_mb"], whole_ref["peak_train_mb"], strict=False)
        ]
    for name, r in results.items():
        train_peak = max(r["peak_train_mb"]) or 1
        ratios.setdefault(name, {})["checkpoint_peak_vs_train_peak"] = max(r["peak_checkpoint_mb"]) / train_peak
    head = {"shape": args.shape, "updates": args.updates, "new_tokens": args.new_tokens}
    head |= {"micro_batch": args.micro_batch, "checkpointing": args.checkpointing}
    print(json.dumps({**head, "results": results, "ratios": ratios}))


if __name__ == "__main__":
    main()
