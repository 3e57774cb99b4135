"""Scale-out benchmarks: what Ray costs, env steps/s with Ray env workers, generated tokens/s with engine workers,
and pipelined (one-step-stale) GRPO against synchronous GRPO in wall time to the same held-out accuracy.

Usage: ``python benchmarks/dist.py [ray envs tokens async ...] [--quick] [options]``; no part given runs all of
them. Torch runs with one thread in every process; the load average is printed first; the last line is one JSON
object with every figure. Ratios are taken between configurations measured in the same run, interleaved.

1. ``ray``: in a fresh process each time (``--repeats``), seconds to start a local Ray (``ensure_ray``), to start one
   actor, and the median round trip of an empty task and of an empty actor call (200 each).
2. ``envs``: env steps/s of one ``Collector.collect()`` of ``--env-steps`` steps over ``--envs`` envs with the same
   64x64 policy, the envs in the learner's process (``sync``) against ``RayVectorEnv`` with 1 and 2 env workers; for
   ``CartPole-v1`` (a microsecond step) and ``SlowCartPole-v1`` (``benchmarks/slow_env.py``: CartPole that burns
   ``--slow-ms`` of CPU per step, standing in for a simulator). Repeats interleaved; medians and min-max.
3. ``tokens``: generated tokens/s of the ``arith-grpo`` engine (tiny Qwen2-style model, 32 prompts x 8 completions,
   5 new tokens) in the learner's process (``HFEngine``) against 1 and 2 Ray engine workers (``EngineGroup``, a
   batch's prompts split among them), the weights already published. Interleaved repeats; medians.
4. ``async``: the ``arith-grpo`` recipe from one saved warm start (SFT run once, exported, loaded by every run),
   synchronous (``--dist.placement colocated``, the default) against ``--dist.placement separate --dist.mode
   pipelined --dist.max-staleness 1`` (generation of batch k+1 overlaps the update on batch k), ``--seeds`` seeds
   each, interleaved, each a ``pickaxe train`` process (``--quick``: a 100-update warm start, 1 seed, 6
   updates). Reported: the held-out greedy accuracy every
   ``--eval-every`` updates, the training wall time (collect + update, evaluations excluded) to the first
   evaluation at or above ``--target`` accuracy, and their ratio; per update the weight-sync seconds as a share of
   the step (pipelined).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict[str, float], digits: int = 2) -> str:
    """``median [min-max]``."""
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


# ------------------------------------------------------------------------------------------------------------ ray
RAY_CHILD = """
import json, time
t = time.perf_counter()
from pickaxe.dist.runtime import ensure_ray
ray = ensure_ray(None, num_cpus=2)
init = time.perf_counter() - t

@ray.remote
def nop():
    return None

@ray.remote
class Actor:
    def nop(self):
        return None

t = time.perf_counter()
actor = Actor.remote()
ray.get(actor.nop.remote())
start = time.perf_counter() - t
ray.get(nop.remote())
tasks, calls = [], []
for _ in range(200):
    t = time.perf_counter(); ray.get(nop.remote()); tasks.append(time.perf_counter() - t)
for _ in range(200):
    t = time.perf_counter(); ray.get(actor.nop.remote()); calls.append(time.perf_counter() - t)
tasks.sort(); calls.sort()
print(json.dumps({"init_s": init, "actor_start_s": start, "task_ms": 1e3 * tasks[100], "call_ms": 1e3 * calls[100]}))
ray.shutdown()
"""


def part_ray(repeats: int) -> dict[str, Any]:
    """Ray's start-up and per-call costs, each repeat in a fresh process."""
    rows = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", RAY_CHILD], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {k: spread([r[k] for r in rows]) for k in rows[0]}
    print(f"\n[ray] {repeats} fresh processes, median [min-max]")
    print(f"  start a local Ray     {fmt(result['init_s'])} s")
    print(f"  start one actor       {fmt(result['actor_start_s'])} s")
    print(f"  empty task round trip {fmt(result['task_ms'])} ms")
    print(f"  empty actor call      {fmt(result['call_ms'])} ms")
    return result


# ----------------------------------------------------------------------------------------------------------- envs
def part_envs(args: argparse.Namespace) -> dict[str, Any]:
    """Collector steps/s: envs in process vs 1 and 2 Ray env workers, for a cheap and a slow env."""
    import torch

    from pickaxe.dist.env_workers import RayVectorEnv
    from pickaxe.dist.runtime import ensure_ray
    from pickaxe.envs import make
    from pickaxe.models import ActorCritic
    from pickaxe.rollout import Collector

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    sys.path.insert(0, str(HERE))
    ensure_ray(None, num_cpus=max(4, os.cpu_count() or 1))  # 3 worker actors alive at once (logical CPUs)
    result: dict[str, Any] = {}
    for env_id, kwargs in (("CartPole-v1", {}), ("slow_env:SlowCartPole-v1", {"ms": args.slow_ms})):
        name = env_id.split(":")[-1]
        steps = args.env_steps if name == "CartPole-v1" else max(args.envs, args.env_steps // 16)
        envs = {
            "sync": make(env_id, args.envs, 0, "sync", **kwargs),
            "ray-1": RayVectorEnv(env_id, args.envs, 0, 1, env_kwargs=kwargs),
            "ray-2": RayVectorEnv(env_id, args.envs, 0, 2, env_kwargs=kwargs),
        }
        torch.manual_seed(0)
        policy = ActorCritic.for_env(envs["sync"], hidden=(64, 64))
        collectors = {k: Collector(e, policy, steps=steps) for k, e in envs.items()}
        for c in collectors.values():
            c.collect()  # warm-up: first resets, actor imports
        rates: dict[str, list[float]] = {k: [] for k in collectors}
        for _ in range(args.repeats):
            for k, c in collectors.items():
                t = time.perf_counter()
                c.collect()
                rates[k].append(steps / (time.perf_counter() - t))
        for e in envs.values():
            e.close()
        row = {k: spread(v) for k, v in rates.items()}
        row["ray-2_over_ray-1"] = spread([a / b for a, b in zip(rates["ray-2"], rates["ray-1"], strict=True)])
        row["ray-2_over_sync"] = spread([a / b for a, b in zip(rates["ray-2"], rates["sync"], strict=True)])
        result[name] = row
        print(f"\n[envs] {name}: {args.envs} envs, {steps} steps per collect, {args.repeats} interleaved repeats")
        for k in collectors:
            print(f"  {k:<6} {fmt(row[k], 0)} steps/s")
        print(
            f"  2 workers / 1 worker {fmt(row['ray-2_over_ray-1'])}; "
            f"2 workers / in process {fmt(row['ray-2_over_sync'])}"
        )
    return result


# --------------------------------------------------------------------------------------------------------- tokens
def part_tokens(args: argparse.Namespace) -> dict[str, Any]:
    """Generated tokens/s: the engine in this process against 1 and 2 Ray engine workers."""
    import torch

    from pickaxe.dist.engine_worker import HFEngineFactory
    from pickaxe.dist.llm_engines import EngineGroup
    from pickaxe.dist.runtime import ensure_ray
    from pickaxe.recipes import get_recipe
    from pickaxe.rollout.engines import HFEngine, SamplingParams
    from pickaxe.rollout.text_collector import encode_prompts
    from pickaxe.train.llm import build_env, build_model

    cfg = get_recipe("arith-grpo")
    device = torch.device("cpu")
    model, tok = build_model(cfg, device, 0)
    env = build_env(cfg, 1, 2, tok)
    prompts = encode_prompts(tok, env.sample(cfg.collector.prompts))
    sampling = SamplingParams(cfg.engine.max_new_tokens, 1.0, n=cfg.collector.group_size)
    ensure_ray(None, num_cpus=max(4, os.cpu_count() or 1))  # 3 workers alive at once (logical CPUs)
    engines: dict[str, Any] = {"in process": HFEngine(model, tok.eos_token_id, tok.pad_token_id, 512, seed=0)}
    factory = HFEngineFactory(tok.eos_token_id, tok.pad_token_id, 512)
    for w in (1, 2):
        group = EngineGroup(model, factory, workers=w, seed=0)
        group.publish(model, 0)
        engines[f"ray-{w}"] = group
    for e in engines.values():
        e.generate(prompts, sampling)  # warm-up (and the workers' first weight load)
    rates: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(args.repeats):
        for k, e in engines.items():
            t = time.perf_counter()
            out = e.generate(prompts, sampling)
            rates[k].append(sum(len(c.token_ids) for c in out) / (time.perf_counter() - t))
    for e in engines.values():
        if hasattr(e, "close"):
            e.close()
    result: dict[str, Any] = {k: spread(v) for k, v in rates.items()}
    result["ray-2_over_ray-1"] = spread([a / b for a, b in zip(rates["ray-2"], rates["ray-1"], strict=True)])
    result["ray-2_over_in_process"] = spread([a / b for a, b in zip(rates["ray-2"], rates["in process"], strict=True)])
    n = len(prompts) * sampling.n
    print(
        f"\n[tokens] arith-grpo engine, {n} completions of <= {sampling.max_new_tokens} tokens, {args.repeats} repeats"
    )
    for k in engines:
        print(f"  {k:<10} {fmt(result[k], 0)} tokens/s")
    print(
        f"  2 workers / 1 worker {fmt(result['ray-2_over_ray-1'])}; "
        f"2 workers / in process {fmt(result['ray-2_over_in_process'])}"
    )
    return result


# ---------------------------------------------------------------------------------------------------------- async
PIPELINED = ["--dist.placement", "separate", "--dist.mode", "pipelined", "--dist.max-staleness", "1"]


def _pickaxe(*argv: str) -> list[str]:
    return [sys.executable, "-m", "pickaxe.cli", *argv]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    from pickaxe.runs.tracking import read_metrics

    return read_metrics(run_dir)


def _curve(run_dir: Path) -> dict[str, Any]:
    """Held-out accuracy by update, training seconds (collect + update) before each update, and weight-sync
    shares of the step."""
    recs = [r for r in _records(run_dir) if "time/update_s" in r or "eval/return_mean" in r]
    train_s, acc, sync_share = 0.0, [], []
    for r in recs:
        if "time/update_s" in r:
            step = r["time/collect_s"] + r["time/update_s"]
            train_s += step
            if "time/weight_sync_s" in r:
                sync_share.append(r["time/weight_sync_s"] / step)
        if "eval/return_mean" in r:
            acc.append((r["step"], train_s, r["eval/return_mean"]))
    return {"evals": acc, "train_s": train_s, "sync_share": statistics.median(sync_share) if sync_share else None}


def part_async(args: argparse.Namespace) -> dict[str, Any]:
    """Synchronous against pipelined GRPO from one warm start: training seconds to a held-out accuracy."""
    import tempfile

    batch = 256  # arith-grpo: 32 prompts x 8 completions per update
    common = [
        "--warm-start.updates", "0", "--trainer.total-steps", str(batch * args.updates),
        "--trainer.eval-every", str(batch * args.eval_every), "--eval.samples", "0", "--trainer.keep-best", "0",
        "--trainer.save-at-eval", "False", "--no-progress",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pickaxe-dist-") as tmp:
        warm = Path(tmp) / "warm"
        t = time.perf_counter()
        subprocess.run(
            _pickaxe("train", "arith-grpo", "--trainer.total-steps", str(batch), "--trainer.eval-every", "0",
                     "--eval.before", "False", "--eval.prompts", "16", "--eval.samples", "0", "--run-dir", str(warm),
                     "--no-progress", *(["--warm-start.updates", "100"] if args.quick else [])),
            check=True, capture_output=True,
        )  # fmt: skip
        print(f"\n[async] warm start (SFT to the recipe's NLL, then 1 GRPO update): {time.perf_counter() - t:.0f} s")
        runs: dict[str, list[dict[str, Any]]] = {"sync": [], "pipelined": []}
        for seed in range(args.seeds):
            for mode in runs:
                run_dir = Path(tmp) / f"{mode}-{seed}"
                extra = PIPELINED if mode == "pipelined" else []
                cmd = _pickaxe("train", "arith-grpo", "--model.path", str(warm / "export"), "--seed", str(seed),
                               *common, *extra, "--run-dir", str(run_dir))  # fmt: skip
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                curve = _curve(run_dir)
                curve["wall_s"] = time.perf_counter() - t
                runs[mode].append(curve)
                accs = " ".join(f"{a:.2f}" for _, _, a in curve["evals"])
                print(f"  seed {seed} {mode:<9} train {curve['train_s']:6.1f} s  accuracy by eval: {accs}", flush=True)
    finals = [c["evals"][-1][2] for cs in runs.values() for c in cs]
    target = args.target or min(finals)
    out: dict[str, Any] = {"target": target, "updates": args.updates}
    to_target: dict[str, list[float]] = {}
    for mode, curves in runs.items():
        to_target[mode] = [next(s for _, s, a in c["evals"] if a >= target) for c in curves]
        out[mode] = {
            "seconds_to_target": to_target[mode],
            "train_s": [c["train_s"] for c in curves],
            "final_accuracy": [c["evals"][-1][2] for c in curves],
            "start_accuracy": [c["evals"][0][2] for c in curves],
        }
    out["speedup_to_target"] = spread([a / b for a, b in zip(to_target["sync"], to_target["pipelined"], strict=True)])
    out["speedup_per_update"] = spread(
        [a["train_s"] / b["train_s"] for a, b in zip(runs["sync"], runs["pipelined"], strict=True)]
    )
    shares = [c["sync_share"] for c in runs["pipelined"] if c["sync_share"] is not None]
    out["weight_sync_share"] = spread(shares) if shares else None
    print(f"  target accuracy {target:.3f} (the lowest final accuracy of all runs unless --target)")
    print(f"  sync / pipelined training seconds to the target: {fmt(out['speedup_to_target'])} (> 1: pipelined faster)")
    print(f"  sync / pipelined seconds per update:            {fmt(out['speedup_per_update'])}")
    if shares:
        print(f"  weight sync / step (pipelined):                 {fmt(out['weight_sync_share'], 4)}")
    return out


# ----------------------------------------------------------------------------------------------------------- main
ALL = ("ray", "envs", "tokens", "async")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` shrinks every part (a smoke run)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", help=f"any of {', '.join(ALL)} (default: all)")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (smoke run)")
    p.add_argument("--repeats", type=int, default=5, help="ray, envs, tokens: interleaved repeats")
    p.add_argument("--envs", type=int, default=8, help="envs: envs per vector env")
    p.add_argument("--env-steps", type=int, default=4096, help="envs: steps per collect (CartPole; slow env: /16)")
    p.add_argument("--slow-ms", type=float, default=1.0, help="envs: CPU milliseconds per SlowCartPole step")
    p.add_argument("--seeds", type=int, default=3, help="async: seeds per mode")
    p.add_argument("--updates", type=int, default=60, help="async: GRPO updates per run")
    p.add_argument("--eval-every", type=int, default=5, help="async: updates between evaluations")
    p.add_argument("--target", type=float, default=0.0, help="async: accuracy target (0: the lowest final of all runs)")
    args = p.parse_args(argv)
    unknown = [x for x in args.parts if x not in ALL]
    if unknown:
        p.error(f"unknown part {unknown[0]!r}; choose from {', '.join(ALL)}")
    args.parts = args.parts or list(ALL)
    if args.quick:
        args.repeats, args.env_steps, args.seeds, args.updates = 2, 512, 1, 6
        args.eval_every = 3
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the chosen parts; print each, then one JSON line."""
    import torch

    torch.set_num_threads(1)
    args = parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; parts: {' '.join(args.parts)}")
    out: dict[str, Any] = {}
    if "ray" in args.parts:
        out["ray"] = part_ray(args.repeats)
    if "envs" in args.parts:
        out["envs"] = part_envs(args)
    if "tokens" in args.parts:
        out["tokens"] = part_tokens(args)
    if "async" in args.parts:
        out["async"] = part_async(args)
    out["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
