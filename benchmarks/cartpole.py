"""Wall time and env steps to solve CartPole-v1 (eval mean return >= 475): pickaxe's PPO and DQN recipes side
by side with Stable-Baselines3's (RL Baselines3 Zoo settings, ``benchmarks/baselines.py``) in the same run.

For each algorithm (``cartpole-ppo``, ``cartpole-dqn``) and each seed, every library trains with an evaluation
(10 deterministic episodes on 10 separate eval envs) every 6,000 env steps, stopping at the first evaluation that
reaches 475: pickaxe for at most 100k (PPO) / 150k (DQN) env steps, SB3 for exactly the zoo's budget (100k PPO,
50k DQN), since its schedules are fractions of that budget (``baselines.py``); an SB3 seed still short of the target
there is reported as not solved within the zoo budget. Each run is a fresh Python process (torch 1 thread),
and the runs are interleaved (pickaxe seed 0, SB3 seed 0, pickaxe seed 1, ...) so load changes on a shared
machine hit both alike. Recorded per run: ``solved_wall_s`` (wall seconds from the start of training --
pickaxe's ``fit``, SB3's ``learn`` -- evaluations included, env and network construction excluded) and
``solved_step``; a seed that never reaches the target counts as infinitely slow in the median. The ratio
reported is pickaxe's median over SB3's median (targets: PPO <= 0.35, DQN <= 0.2).

Usage::

    python benchmarks/cartpole.py                          # PPO (5 seeds) and DQN (3 seeds), pickaxe and SB3
    python benchmarks/cartpole.py --algos ppo --seeds 3    # PPO only, seeds 0..2
    python benchmarks/cartpole.py --no-baseline            # pickaxe only (no SB3 needed)
    python benchmarks/cartpole.py --quick                  # CI smoke run: 2 seeds each, pickaxe only
    python benchmarks/cartpole.py --set ppo:algo.epochs=10 --set dqn:model.hidden=64,64

``--set ALGO:FIELD=VALUE`` overrides a config field on top of the recipe (value parsed as a Python literal;
a comma-separated value becomes a tuple). SB3: ``pip install -r benchmarks/requirements-baselines.txt``. The last
line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_RETURN = 475.0
EVAL_EVERY = 6_000
EVAL_EPISODES = 10
MAX_STEPS = {"ppo": 100_000, "dqn": 150_000}
DEFAULT_SEEDS = {"ppo": 5, "dqn": 3}
TARGET_RATIO = {"ppo": 0.35, "dqn": 0.2}
LIBS = ("pickaxe", "sb3")


def parse_value(text: str) -> Any:
    """A Python literal; ``64,64`` -> ``(64, 64)``; anything unparsable stays a string."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return tuple(value) if isinstance(value, list) else value


def apply_override(cfg: Any, field: str, value: Any) -> None:
    """Set a dotted field (``algo.lr``, ``model.hidden``) on a config, refusing unknown names."""
    obj = cfg
    *parents, name = field.split(".")
    for part in parents:
        obj = getattr(obj, part)
    if not hasattr(obj, name):
        raise SystemExit(f"unknown config field {field!r}")
    setattr(obj, name, value)


def run_pickaxe(algo: str, seed: int, overrides: list[tuple[str, Any]], device: str) -> dict[str, Any]:
    """Train one seed of the pickaxe recipe to the target; its solved step / seconds (None when unsolved)."""
    from pickaxe.recipes import get_recipe
    from pickaxe.train.build import build_trainer

    cfg = get_recipe(f"cartpole-{algo}")
    cfg.seed = seed
    cfg.device = device
    cfg.trainer.total_steps = MAX_STEPS[algo]
    cfg.trainer.eval_every = EVAL_EVERY
    cfg.trainer.eval_episodes = EVAL_EPISODES
    cfg.trainer.target_return = TARGET_RETURN
    for field, value in overrides:
        apply_override(cfg, field, value)
    trainer = build_trainer(cfg)
    cpu0 = time.process_time()
    result = trainer.fit()
    cpu = time.process_time() - cpu0  # fit returns right after the evaluation that reached the target
    trainer.collector.envs.close()
    if trainer.eval_envs is not None:
        trainer.eval_envs.close()
    return {
        "solved_step": result.solved_step,
        "solved_wall_s": result.solved_wall_s,
        "solved_cpu_s": None if result.solved_step is None else cpu,
        "steps": result.steps,
        "wall_s": result.wall_s,
        "best_eval_return": result.best_eval_return,
    }


def run_sb3(algo: str, seed: int) -> dict[str, Any]:
    """Train one seed of SB3's zoo settings to the target (``benchmarks/baselines.py``)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import baselines

    run = baselines.sb3_ppo_cartpole if algo == "ppo" else baselines.sb3_dqn_cartpole
    return run(seed, EVAL_EVERY, EVAL_EPISODES, TARGET_RETURN)  # the zoo's own budget, never pickaxe's


def run_child(spec: str, overrides: list[str], device: str) -> None:
    """``--one LIB:ALGO:SEED``: one run in this (fresh) process; prints its JSON line."""
    import torch

    torch.set_num_threads(1)
    lib, algo, seed = spec.split(":")
    cpu0 = time.process_time()
    if lib == "pickaxe":
        row = run_pickaxe(algo, int(seed), parse_overrides(overrides)[algo], device)
    else:
        row = run_sb3(algo, int(seed))
    row.update(lib=lib, algo=algo, seed=int(seed), cpu_s=time.process_time() - cpu0)
    print(json.dumps(row))


def parse_overrides(items: list[str]) -> dict[str, list[tuple[str, Any]]]:
    """``ALGO:FIELD=VALUE`` items -> per-algorithm ``(field, value)`` lists."""
    overrides: dict[str, list[tuple[str, Any]]] = {a: [] for a in MAX_STEPS}
    for item in items:
        try:
            algo, rest = item.split(":", 1)
            field, value = rest.split("=", 1)
        except ValueError:
            raise SystemExit(f"--set expects ALGO:FIELD=VALUE, got {item!r}") from None
        if algo not in overrides:
            raise SystemExit(f"--set: unknown algo {algo!r}")
        overrides[algo].append((field, parse_value(value)))
    return overrides


def spawn(lib: str, algo: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run in a fresh interpreter; its JSON line."""
    cmd = [sys.executable, __file__, "--one", f"{lib}:{algo}:{seed}", "--device", args.device]
    for item in args.set:
        cmd += ["--set", item]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_or_inf(values: list[float | None]) -> float:
    """Median where unsolved (None) counts as infinitely slow."""
    return statistics.median([math.inf if v is None else v for v in values])


def fmt(value: float | None, spec: str) -> str:
    return "unsolved" if value is None or math.isinf(value) else format(value, spec)


def num(x: float) -> float | None:
    return None if math.isinf(x) else round(x, 3)


def print_table(algo: str, rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per-seed table of every library, medians and the ratio; returns this algorithm's summary figures."""
    print(f"\n{algo.upper()} CartPole-v1: env steps and wall seconds to eval return >= {TARGET_RETURN:g}")
    print(f"{'library':>8} {'seed':>5} {'steps':>9} {'wall s':>9} {'cpu s':>8} {'process cpu s':>14} {'best eval':>10}")
    summary: dict[str, Any] = {}
    medians, cpu_medians = {}, {}
    for lib, lib_rows in rows.items():
        for r in lib_rows:
            print(
                f"{lib:>8} {r['seed']:>5} {fmt(r['solved_step'], ',d'):>9} {fmt(r['solved_wall_s'], '.2f'):>9} "
                f"{fmt(r['solved_cpu_s'], '.2f'):>8} {r['cpu_s']:>14.2f} {r['best_eval_return'] or float('nan'):>10.1f}"
            )
        solved = sum(r["solved_step"] is not None for r in lib_rows)
        med_s = median_or_inf([r["solved_wall_s"] for r in lib_rows])
        med_cpu = median_or_inf([r["solved_cpu_s"] for r in lib_rows])
        cpu_medians[lib] = med_cpu
        med_steps = median_or_inf([r["solved_step"] for r in lib_rows])
        medians[lib] = med_s
        steps_s, wall_s, cpu_s = fmt(med_steps, ",.0f"), fmt(med_s, ".2f"), fmt(med_cpu, ".2f")
        within = f" within the zoo budget ({lib_rows[0]['budget']:,})" if "budget" in lib_rows[0] else ""
        print(f"{lib:>8} {'median':>5} {steps_s:>9} {wall_s:>9} {cpu_s:>8}   solved {solved}/{len(lib_rows)}{within}")
        key = f"{algo}_{lib}"
        summary.update({
            f"{key}_median_s": num(med_s),
            f"{key}_median_cpu_s": num(med_cpu),
            f"{key}_median_steps": num(med_steps),
            f"{key}_solved": f"{solved}/{len(lib_rows)}",
            f"{key}_seconds": [None if r["solved_wall_s"] is None else round(r["solved_wall_s"], 3) for r in lib_rows],
            f"{key}_steps": [r["solved_step"] for r in lib_rows],
        })  # fmt: skip
    if "sb3" in medians and math.isfinite(medians["sb3"]):
        ratio = medians["pickaxe"] / medians["sb3"]
        ok = ratio <= TARGET_RATIO[algo]
        print(
            f"  pickaxe / SB3 = {fmt(ratio, '.3f')} ({fmt(medians['pickaxe'], '.2f')} s / "
            f"{medians['sb3']:.2f} s medians); target <= {TARGET_RATIO[algo]}: {'met' if ok else 'NOT met'}"
        )
        summary[f"{algo}_ratio_to_sb3"] = num(ratio)
        cpu_ratio = cpu_medians["pickaxe"] / cpu_medians["sb3"]
        print(f"  CPU seconds to the target (less load-sensitive): pickaxe / SB3 = {fmt(cpu_ratio, '.3f')}")
        summary[f"{algo}_cpu_ratio_to_sb3"] = num(cpu_ratio)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: PPO 5, DQN 3)")
    parser.add_argument("--algos", default="ppo,dqn", help="comma-separated subset of ppo,dqn")
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 2 seeds, pickaxe only")
    parser.add_argument("--no-baseline", action="store_true", help="pickaxe only (Stable-Baselines3 not needed)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; the targets are CPU figures)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ALGO:FIELD=VALUE",
        help="override a config field of one algorithm's pickaxe recipe (repeatable)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # LIB:ALGO:SEED, run by the parent in a fresh process
    args = parser.parse_args(argv)
    if args.one:
        run_child(args.one, args.set, args.device)
        return
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for algo in algos:
        if algo not in MAX_STEPS:
            parser.error(f"unknown algo {algo!r}; choose from {', '.join(MAX_STEPS)}")
    overrides = parse_overrides(args.set)
    libs = ["pickaxe"] if args.quick or args.no_baseline else list(LIBS)
    if "sb3" in libs:
        sys.path.insert(0, str(Path(__file__).parent))
        import baselines

        if not baselines.available():
            parser.error(baselines.SB3_MISSING + " (or --no-baseline)")

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"CartPole-v1 time-to-solve, {' vs '.join(libs)}: target {TARGET_RETURN:g}, eval every {EVAL_EVERY:,} "
        f"steps ({EVAL_EPISODES} episodes); fresh process per run, interleaved; {os.cpu_count()} CPUs, "
        f"load average {load:.2f}, torch 1 thread"
    )
    for algo in algos:
        if overrides[algo]:
            print(f"{algo} overrides: " + ", ".join(f"{f}={v!r}" for f, v in overrides[algo]))

    summary: dict[str, Any] = {}
    for algo in algos:
        n = 2 if args.quick else args.seeds or DEFAULT_SEEDS[algo]
        rows: dict[str, list[dict[str, Any]]] = {lib: [] for lib in libs}
        for seed in range(n):
            for lib in libs:
                row = spawn(lib, algo, seed, args)
                rows[lib].append(row)
                print(
                    f"  {algo} {lib} seed {seed}: steps {fmt(row['solved_step'], ',d')}, "
                    f"{fmt(row['solved_wall_s'], '.2f')} s",
                    file=sys.stderr,
                    flush=True,
                )
        summary.update(print_table(algo, rows))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
