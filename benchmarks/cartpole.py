"""Wall time and env steps to solve CartPole-v1 (eval mean return >= 475) with the PPO and DQN recipes.

For each algorithm (``cartpole-ppo``, ``cartpole-dqn``) and each seed, the recipe is trained with
``target_return=475``, an evaluation (10 deterministic episodes on separate eval envs) every 6,000 env steps,
and at most 100k (PPO) / 150k (DQN) env steps; training stops at the first evaluation that reaches the
target. Recorded per seed: ``solved_wall_s`` (wall seconds from the start of ``fit``, evaluations included,
env and network construction excluded) and ``solved_step`` (env steps); a seed that never reaches the target
is reported as unsolved and counts as infinitely slow in the median.

Reference figures (2-core CPU), printed for comparison: PPO target median <= 2.5 s; Stable-Baselines3 PPO
with its tuned zoo hyper-parameters 5.0 s median, 24k steps; Tianshou PPO 11.1 s, 30k steps. DQN target
median <= 25 s with every seed solved; SB3 DQN 50 s, 42k steps; Tianshou's DQN defaults solved 1 of 3 seeds
within 200k steps.

Usage::

    python benchmarks/cartpole.py                       # PPO and DQN, seeds 0..4
    python benchmarks/cartpole.py --algos ppo --seeds 3  # PPO only, seeds 0..2
    python benchmarks/cartpole.py --quick               # CI smoke run: 2 seeds each
    python benchmarks/cartpole.py --set ppo:algo.epochs=10 --set dqn:model.hidden=64,64

``--set ALGO:FIELD=VALUE`` overrides a config field on top of the recipe (value parsed as a Python literal;
a comma-separated value becomes a tuple). The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import statistics
import sys
import time
from typing import Any

import torch

from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer

TARGET_RETURN = 475.0
EVAL_EVERY = 6_000
EVAL_EPISODES = 10
MAX_STEPS = {"ppo": 100_000, "dqn": 150_000}
TARGET_MEDIAN_S = {"ppo": 2.5, "dqn": 25.0}
REFERENCES = {
    "ppo": [
        ("target (2-core CPU)", "median <= 2.5 s"),
        ("Stable-Baselines3 (zoo hyper-parameters)", "5.0 s median, 24k steps"),
        ("Tianshou", "11.1 s median, 30k steps"),
    ],
    "dqn": [
        ("target (2-core CPU)", "median <= 25 s, every seed solved"),
        ("Stable-Baselines3 (zoo hyper-parameters)", "50 s median, 42k steps"),
        ("Tianshou (defaults)", "solved 1 of 3 seeds within 200k steps"),
    ],
}


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


def run_seed(algo: str, seed: int, overrides: list[tuple[str, Any]], device: str) -> dict[str, Any]:
    """Train one seed to the target; returns its solved step / seconds (None when unsolved)."""
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
    cpu_s = time.process_time() - cpu0
    trainer.collector.envs.close()
    if trainer.eval_envs is not None:
        trainer.eval_envs.close()
    return {
        "seed": seed,
        "solved_step": result.solved_step,
        "solved_wall_s": result.solved_wall_s,
        "steps": result.steps,
        "wall_s": result.wall_s,
        "cpu_s": cpu_s,
        "best_eval_return": result.best_eval_return,
    }


def median_or_inf(values: list[float | None]) -> float:
    """Median where unsolved (None) counts as infinitely slow."""
    return statistics.median([math.inf if v is None else v for v in values])


def fmt(value: float | None, spec: str) -> str:
    return "unsolved" if value is None or math.isinf(value) else format(value, spec)


def print_table(algo: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed table, median and references; returns the summary figures of this algorithm."""
    solved = sum(r["solved_step"] is not None for r in rows)
    med_s = median_or_inf([r["solved_wall_s"] for r in rows])
    med_steps = median_or_inf([r["solved_step"] for r in rows])
    print(f"\n{algo.upper()} (cartpole-{algo}): env steps and wall seconds to eval return >= {TARGET_RETURN:g}")
    print(f"{'seed':>6} {'steps':>9} {'wall s':>9} {'cpu s':>8} {'best eval':>10}")
    for r in rows:
        print(
            f"{r['seed']:>6} {fmt(r['solved_step'], ',d'):>9} {fmt(r['solved_wall_s'], '.2f'):>9} "
            f"{r['cpu_s']:>8.2f} {r['best_eval_return'] or float('nan'):>10.1f}"
        )
    print(f"{'median':>6} {fmt(med_steps, ',.0f'):>9} {fmt(med_s, '.2f'):>9}   solved {solved}/{len(rows)}")
    ok = med_s <= TARGET_MEDIAN_S[algo] and (algo != "dqn" or solved == len(rows))
    print(f"  -> target {'met' if ok else 'NOT met'} (median <= {TARGET_MEDIAN_S[algo]:g} s"
          f"{', every seed solved' if algo == 'dqn' else ''})")
    print("  reference figures:")
    for name, figure in REFERENCES[algo]:
        print(f"    {name:<42} {figure}")

    def num(x: float) -> float | None:
        return None if math.isinf(x) else round(x, 3)

    return {
        f"{algo}_median_s": num(med_s),
        f"{algo}_median_steps": num(med_steps),
        f"{algo}_solved": f"{solved}/{len(rows)}",
        f"{algo}_seconds": [None if r["solved_wall_s"] is None else round(r["solved_wall_s"], 3) for r in rows],
        f"{algo}_steps": [r["solved_step"] for r in rows],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--algos", default="ppo,dqn", help="comma-separated subset of ppo,dqn")
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 2 seeds")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; the targets are CPU figures)")
    parser.add_argument("--set", action="append", default=[], metavar="ALGO:FIELD=VALUE",
                        help="override a config field of one algorithm's recipe (repeatable)")
    args = parser.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for algo in algos:
        if algo not in MAX_STEPS:
            parser.error(f"unknown algo {algo!r}; choose from {', '.join(MAX_STEPS)}")
    overrides: dict[str, list[tuple[str, Any]]] = {a: [] for a in MAX_STEPS}
    for item in args.set:
        try:
            algo, rest = item.split(":", 1)
            field, value = rest.split("=", 1)
        except ValueError:
            parser.error(f"--set expects ALGO:FIELD=VALUE, got {item!r}")
        if algo not in overrides:
            parser.error(f"--set: unknown algo {algo!r}")
        overrides[algo].append((field, parse_value(value)))
    seeds = list(range(2 if args.quick else args.seeds))
    torch.set_num_threads(1)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"CartPole-v1 time-to-solve: seeds {seeds}, target {TARGET_RETURN:g}, eval every {EVAL_EVERY:,} steps "
          f"({EVAL_EPISODES} episodes); {os.cpu_count()} CPUs, load average {load:.2f}, torch "
          f"{torch.__version__} ({torch.get_num_threads()} thread)")
    for algo in algos:
        if overrides[algo]:
            print(f"{algo} overrides: " + ", ".join(f"{f}={v!r}" for f, v in overrides[algo]))

    summary: dict[str, Any] = {}
    for algo in algos:
        rows = []
        for seed in seeds:
            row = run_seed(algo, seed, overrides[algo], args.device)
            rows.append(row)
            print(f"  {algo} seed {seed}: steps {fmt(row['solved_step'], ',d')}, "
                  f"{fmt(row['solved_wall_s'], '.2f')} s", file=sys.stderr, flush=True)
        summary.update(print_table(algo, rows))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
