"""Wall time and env steps to solve Pendulum-v1 (eval mean return >= -250): pickaxe's SAC and TD3 recipes
(``pendulum-sac``, ``pendulum-td3``) side by side with Stable-Baselines3's SAC at RL Baselines3 Zoo's settings, in
the same run.

Every run evaluates (10 deterministic episodes on 10 separate eval envs) every 1,000 env steps, trains at most
20,000 env steps (the zoo's budget) and stops at the first evaluation that reaches -250. Each run is a fresh Python
process (torch 1 thread), and the runs are interleaved (pickaxe SAC seed 0, pickaxe TD3 seed 0, SB3 SAC seed 0,
pickaxe SAC seed 1, ...) so load changes on a shared machine hit every library alike. Recorded per run:
``solved_wall_s`` (wall seconds from the start of training -- pickaxe's ``fit``, SB3's ``learn`` -- evaluations
included, construction excluded), ``solved_step`` and the process's CPU seconds; a seed that never reaches the
target counts as infinitely slow in the median. Reported: each pickaxe median over SB3 SAC's median (target for
SAC: <= 0.5).

Usage::

    python benchmarks/pendulum.py                 # pickaxe SAC and TD3, SB3 SAC; seeds 0..2
    python benchmarks/pendulum.py --seeds 5 --algos sac
    python benchmarks/pendulum.py --no-baseline   # pickaxe only (no SB3 needed)

SB3: ``pip install -r benchmarks/requirements-baselines.txt torch==2.13.0`` (torch stays at the pinned build).
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

TARGET_RETURN = -250.0
EVAL_EVERY = 1_000
EVAL_EPISODES = 10
MAX_STEPS = 20_000
TARGET_RATIO = 0.5
PIP = "pip install -r benchmarks/requirements-baselines.txt torch==2.13.0"

# RL Baselines3 Zoo (github.com/DLR-RM/rl-baselines3-zoo, commit c94924e5), hyperparams/sac.yml, Pendulum-v1:
#   n_timesteps: 20000, policy: 'MlpPolicy', learning_rate: !!float 1e-3
# and SB3's defaults for the rest (buffer 1e6, learning_starts 100, batch 256, tau 0.005, gamma 0.99, train_freq 1,
# gradient_steps 1, ent_coef auto, net_arch [256, 256]). SB3 trains exactly n_timesteps (learn's total_timesteps);
# pickaxe's budget (MAX_STEPS) is set to the same.
SAC_ZOO = {"n_timesteps": 20_000, "learning_rate": 1e-3}


def sb3_available() -> bool:
    """Whether Stable-Baselines3 imports."""
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return False
    return True


def run_pickaxe(algo: str, seed: int) -> dict[str, Any]:
    """One seed of pickaxe's ``pendulum-<algo>`` recipe to the target."""
    from pickaxe.recipes import get_recipe
    from pickaxe.train.build import build_trainer

    cfg = get_recipe(f"pendulum-{algo}")
    cfg.seed, cfg.device = seed, "cpu"
    t = cfg.trainer
    t.total_steps, t.eval_every, t.eval_episodes, t.target_return = MAX_STEPS, EVAL_EVERY, EVAL_EPISODES, TARGET_RETURN
    t.stop_at_target = True
    trainer = build_trainer(cfg)
    result = trainer.fit()
    trainer.close()
    return {
        "solved_step": result.solved_step,
        "solved_wall_s": result.solved_wall_s,
        "best_eval_return": result.best_eval_return,
    }


def run_sb3_sac(seed: int) -> dict[str, Any]:
    """One seed of SB3's SAC at the zoo's Pendulum-v1 settings to the target."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
    from stable_baselines3.common.env_util import make_vec_env

    result: dict[str, Any] = {"solved_step": None, "solved_wall_s": None, "best_eval_return": None}
    start = [0.0]

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            reward = float(self.parent.last_mean_reward)
            best = result["best_eval_return"]
            result["best_eval_return"] = reward if best is None else max(best, reward)
            if reward >= TARGET_RETURN:
                result["solved_step"] = int(self.num_timesteps)
                result["solved_wall_s"] = time.perf_counter() - start[0]
                return False
            return True

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    eval_env = make_vec_env("Pendulum-v1", n_envs=EVAL_EPISODES, seed=1000 + seed)
    model = SAC("MlpPolicy", env, learning_rate=SAC_ZOO["learning_rate"], seed=seed, device="cpu", verbose=0)
    callback = EvalCallback(
        eval_env,
        callback_after_eval=Stop(),
        n_eval_episodes=EVAL_EPISODES,
        eval_freq=EVAL_EVERY,
        deterministic=True,
        verbose=0,
        warn=False,
    )
    start[0] = time.perf_counter()
    model.learn(total_timesteps=SAC_ZOO["n_timesteps"], callback=callback)
    return result


def run_child(spec: str) -> None:
    """``--one LIB:ALGO:SEED``: one run in this (fresh) process; prints its JSON line."""
    import torch

    torch.set_num_threads(1)
    lib, algo, seed = spec.split(":")
    cpu0 = time.process_time()
    row = run_pickaxe(algo, int(seed)) if lib == "pickaxe" else run_sb3_sac(int(seed))
    row.update(lib=lib, algo=algo, seed=int(seed), cpu_s=time.process_time() - cpu0)
    print(json.dumps(row))


def spawn(lib: str, algo: str, seed: int) -> dict[str, Any]:
    """One run in a fresh interpreter; its JSON line."""
    cmd = [sys.executable, __file__, "--one", f"{lib}:{algo}:{seed}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_or_inf(values: list[float | None]) -> float:
    """Median where unsolved (None) counts as infinitely slow."""
    return statistics.median([math.inf if v is None else v for v in values])


def fmt(value: float | None, spec: str) -> str:
    """``value`` formatted, or ``unsolved``."""
    return "unsolved" if value is None or math.isinf(value) else format(value, spec)


def num(x: float) -> float | None:
    """Rounded for JSON; None for infinity."""
    return None if math.isinf(x) else round(x, 3)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run every (library, algorithm, seed) interleaved, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--algos", default="sac,td3", help="pickaxe algorithms: comma-separated subset of sac,td3")
    parser.add_argument("--no-baseline", action="store_true", help="pickaxe only (Stable-Baselines3 not needed)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # LIB:ALGO:SEED, run by the parent in a fresh process
    args = parser.parse_args(argv)
    if args.one:
        run_child(args.one)
        return
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for algo in algos:
        if algo not in ("sac", "td3"):
            parser.error(f"unknown algo {algo!r}; choose from sac, td3")
    runs = [("pickaxe", a) for a in algos]
    if not args.no_baseline:
        if not sb3_available():
            print(
                f"pendulum.py: error: Stable-Baselines3 is not installed; fix: {PIP} (or --no-baseline)",
                file=sys.stderr,
            )
            raise SystemExit(2)
        runs.append(("sb3", "sac"))
    load = os.getloadavg()[0]
    print(
        f"Pendulum-v1 time-to-solve (eval >= {TARGET_RETURN:g}, every {EVAL_EVERY:,} steps, {EVAL_EPISODES} "
        f"episodes, at most {MAX_STEPS:,} steps); fresh process per run, interleaved; {os.cpu_count()} CPUs, load "
        f"average {load:.2f}, torch 1 thread"
    )
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {r: [] for r in runs}
    for seed in range(args.seeds):
        for lib, algo in runs:
            row = spawn(lib, algo, seed)
            rows[(lib, algo)].append(row)
            print(
                f"  {lib} {algo} seed {seed}: steps {fmt(row['solved_step'], ',d')}, "
                f"{fmt(row['solved_wall_s'], '.2f')} s",
                file=sys.stderr,
                flush=True,
            )
    print(f"\n{'run':>12} {'seed':>5} {'steps':>9} {'wall s':>9} {'cpu s':>8} {'best eval':>10}")
    summary: dict[str, Any] = {}
    medians: dict[tuple[str, str], float] = {}
    for (lib, algo), lib_rows in rows.items():
        name = f"{lib} {algo}"
        for r in lib_rows:
            best = r["best_eval_return"]
            print(
                f"{name:>12} {r['seed']:>5} {fmt(r['solved_step'], ',d'):>9} {fmt(r['solved_wall_s'], '.2f'):>9} "
                f"{r['cpu_s']:>8.2f} {best if best is not None else float('nan'):>10.1f}"
            )
        med_s = median_or_inf([r["solved_wall_s"] for r in lib_rows])
        med_steps = median_or_inf([r["solved_step"] for r in lib_rows])
        medians[(lib, algo)] = med_s
        solved = sum(r["solved_step"] is not None for r in lib_rows)
        steps_s, wall_s = fmt(med_steps, ",.0f"), fmt(med_s, ".2f")
        print(f"{name:>12} {'median':>5} {steps_s:>9} {wall_s:>9}   solved {solved}/{len(lib_rows)}")
        key = f"{lib}_{algo}"
        summary.update({
            f"{key}_median_s": num(med_s),
            f"{key}_median_steps": num(med_steps),
            f"{key}_solved": f"{solved}/{len(lib_rows)}",
            f"{key}_seconds": [None if r["solved_wall_s"] is None else round(r["solved_wall_s"], 3) for r in lib_rows],
            f"{key}_steps": [r["solved_step"] for r in lib_rows],
            f"{key}_cpu_s": [round(r["cpu_s"], 2) for r in lib_rows],
        })  # fmt: skip
    base = medians.get(("sb3", "sac"))
    if base is not None and math.isfinite(base):
        for algo in algos:
            ratio = medians[("pickaxe", algo)] / base
            verdict = (
                f"; target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}" if algo == "sac" else ""
            )
            print(f"  pickaxe {algo} / SB3 SAC = {fmt(ratio, '.3f')} (medians){verdict}")
            summary[f"{algo}_ratio_to_sb3_sac"] = num(ratio)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
