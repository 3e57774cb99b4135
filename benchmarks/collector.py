"""Collection speed: pickaxe's ``Collector`` against Stable-Baselines3's PPO rollout collection (measured live, in
the same run) and against the bare loops doing the same arithmetic (the floor).

Loops over 8 CartPole-v1 envs, one torch thread, a 64x64 tanh actor and critic for every policy loop (pickaxe's
``ActorCritic.for_env``; SB3's default ``MlpPolicy`` has the same two networks):

* ``pickaxe vector``: ``Collector(make("CartPole-v1", n=8, vectorization="vector"), policy).collect(S)`` (the
  numpy-vectorised CartPole of ``pickaxe.envs.vector``; what ``cartpole-ppo`` uses through ``auto``);
* ``pickaxe sync``: the same with gymnasium's ``SyncVectorEnv`` (``vectorization="sync"``);
* ``bare vector`` / ``bare sync``: the floor of each: obs -> ``torch.from_numpy`` -> the policy's act for one
  rollout (``policy.frozen_act()``, the actor's and critic's hidden layers stacked, as the collector uses) ->
  ``.numpy()`` -> ``envs.step``, keeping nothing;
* ``SB3``: ``PPO.collect_rollouts`` into its rollout buffer (``benchmarks/baselines.py``), as ``learn`` runs it;
* ``random sync``: gymnasium's sync vector env stepped with random actions, no policy.

Each repeat times one collection of ``--steps`` env steps (all envs together) of every loop, the loops
interleaved within the repeat so load changes on a shared machine hit all alike; medians are reported. Targets:
pickaxe / SB3 >= 3; pickaxe's overhead over the bare loop on the same envs <= 25% (ours / bare >= 0.8).

Usage: ``python benchmarks/collector.py [--steps 4096] [--repeats 9] [--no-baseline]``; the last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from pickaxe.envs import make
from pickaxe.envs.vector import NumpyCartPole
from pickaxe.models import ActorCritic
from pickaxe.rollout import Collector

NUM_ENVS = 8


def ours(collector: Collector, steps: int) -> Callable[[], float]:
    """Steps/s of one ``collect``."""

    def run() -> float:
        start = time.perf_counter()
        collector.collect(steps)
        return steps / (time.perf_counter() - start)

    return run


def bare(envs: gym.vector.VectorEnv, policy: ActorCritic, steps: int) -> Callable[[], float]:
    """Steps/s of the minimal policy loop on ``envs``."""
    state = {"obs": envs.reset(seed=0)[0]}

    def run() -> float:
        obs = state["obs"]
        start = time.perf_counter()
        with torch.no_grad():
            act = policy.frozen_act()
            for _ in range(steps // NUM_ENVS):
                action, _ = act(torch.from_numpy(obs))
                obs, _, _, _, _ = envs.step(action.numpy())
        elapsed = time.perf_counter() - start
        state["obs"] = obs
        return steps / elapsed

    return run


def random_actions(envs: gym.vector.VectorEnv, steps: int) -> Callable[[], float]:
    """Steps/s of stepping with random actions (drawn in one numpy call up front)."""
    envs.reset(seed=1)
    rng = np.random.default_rng(0)

    def run() -> float:
        actions = rng.integers(0, 2, size=(steps // NUM_ENVS, NUM_ENVS))
        start = time.perf_counter()
        for a in actions:
            envs.step(a)
        return steps / (time.perf_counter() - start)

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4096, help="env steps per timed collection (all envs)")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats; medians are reported")
    parser.add_argument("--no-baseline", action="store_true", help="leave out Stable-Baselines3")
    args = parser.parse_args(argv)
    if args.steps % NUM_ENVS:
        parser.error(f"--steps must be a multiple of {NUM_ENVS}")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    policy = ActorCritic.for_env(make("CartPole-v1", n=1))
    loops: dict[str, Callable[[], float]] = {
        "pickaxe vector": ours(Collector(make("CartPole-v1", NUM_ENVS, 0, "vector"), policy, args.steps), args.steps),
        "bare vector": bare(NumpyCartPole(NUM_ENVS), policy, args.steps),
        "pickaxe sync": ours(Collector(make("CartPole-v1", NUM_ENVS, 0, "sync"), policy, args.steps), args.steps),
        "bare sync": bare(gym.make_vec("CartPole-v1", NUM_ENVS, vectorization_mode="sync"), policy, args.steps),
        "random sync": random_actions(gym.make_vec("CartPole-v1", NUM_ENVS, vectorization_mode="sync"), args.steps),
    }
    if not args.no_baseline:
        sys.path.insert(0, str(Path(__file__).parent))
        import baselines

        if not baselines.available():
            parser.error(baselines.SB3_MISSING + " (or --no-baseline)")
        loops["SB3 PPO rollout"] = baselines.sb3_ppo_collector(NUM_ENVS, args.steps)

    for run in loops.values():  # warm-up (allocations, first-call dispatch)
        run()
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.repeats):
        for name, run in loops.items():
            times[name].append(run())
    med = {name: statistics.median(v) for name, v in times.items()}

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Collection speed, {NUM_ENVS} CartPole-v1 envs, 64x64 tanh actor and critic, torch {torch.__version__} "
        f"(1 thread), {args.steps} steps per timing, median of {args.repeats} interleaved repeats; "
        f"{os.cpu_count()} CPUs, load average {load:.2f}"
    )
    print(f"  {'loop':<26} {'steps/s':>10}   (min .. max)")
    for name, v in times.items():
        print(f"  {name:<26} {med[name]:>10,.0f}   ({min(v):,.0f} .. {max(v):,.0f})")
    summary: dict[str, float] = {f"{k.replace(' ', '_').lower()}_steps_per_s": round(v) for k, v in med.items()}
    for backend in ("vector", "sync"):
        r = med[f"pickaxe {backend}"] / med[f"bare {backend}"]
        print(f"  pickaxe {backend} / bare {backend} = {r:.3f} (overhead {100 * (1 / r - 1):.1f}%; target <= 25%)")
        summary[f"{backend}_over_bare"] = round(r, 3)
    if "SB3 PPO rollout" in med:
        for backend in ("vector", "sync"):
            r = med[f"pickaxe {backend}"] / med["SB3 PPO rollout"]
            print(
                f"  pickaxe {backend} / SB3 = {r:.2f}x ({med[f'pickaxe {backend}']:,.0f} / "
                f"{med['SB3 PPO rollout']:,.0f} steps/s); target >= 3x: {'met' if r >= 3 else 'NOT met'}"
            )
            summary[f"{backend}_over_sb3"] = round(r, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
