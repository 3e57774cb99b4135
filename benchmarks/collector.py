"""Collection speed: pickaxe's ``Collector`` against a raw gymnasium loop with the same policy.

Three loops over 8 CartPole-v1 envs, one torch thread, the same ``ActorCritic`` policy (64x64 tanh MLP,
``ActorCritic.for_env``) for the first two:

* ``ours``: ``pickaxe.rollout.Collector(pickaxe.envs.make("CartPole-v1", n=8, seed=0), policy, steps=S).collect()``
  (time-major ``Batch`` with obs, action, reward, terminated, truncated, next_obs, logprob, value; true final
  observations; episode bookkeeping).
* ``raw``: ``gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")`` and the minimal loop
  obs -> ``torch.from_numpy`` -> ``with torch.no_grad(): policy.act(obs)`` -> ``.numpy()`` -> ``envs.step``,
  keeping nothing.
* ``random``: the same raw vector env stepped with random actions (numpy), no policy: the ceiling.

Each repeat times one collection of ``--steps`` env steps (all envs together) of each loop; repeats are
interleaved (ours, raw, random, ours, raw, random, ...) so load changes hit all three alike, and medians are
reported. Reference figures (2-core machine): raw random stepping ~146k steps/s; Stable-Baselines3's PPO
rollout ~22k steps/s; Tianshou's Collector ~8k steps/s. Targets: ours / raw >= 0.9; ours >= 3x SB3 (66k steps/s).

Usage: ``python benchmarks/collector.py [--steps 4096] [--repeats 9]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from pickaxe.envs import make
from pickaxe.models import ActorCritic
from pickaxe.rollout import Collector

NUM_ENVS = 8
SB3_PPO_ROLLOUT = 22_000.0
TIANSHOU_COLLECTOR = 8_000.0
RAW_RANDOM_REFERENCE = 146_000.0


def time_ours(collector: Collector, steps: int) -> float:
    """Steps/s of one ``collect``."""
    start = time.perf_counter()
    collector.collect(steps)
    return steps / (time.perf_counter() - start)


def time_raw(envs: gym.vector.VectorEnv, policy: ActorCritic, steps: int, state: dict) -> float:
    """Steps/s of the minimal policy loop (gymnasium's default NEXT_STEP autoreset)."""
    obs = state["obs"]
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps // envs.num_envs):
            action, _ = policy.act(torch.from_numpy(obs))
            obs, _, _, _, _ = envs.step(action.numpy())
    elapsed = time.perf_counter() - start
    state["obs"] = obs
    return steps / elapsed


def time_random(envs: gym.vector.VectorEnv, steps: int, rng: np.random.Generator) -> float:
    """Steps/s of stepping with random actions (drawn in one numpy call up front)."""
    actions = rng.integers(0, 2, size=(steps // envs.num_envs, envs.num_envs))
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4096, help="env steps per timed collection (all envs)")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved repeats; medians are reported")
    args = parser.parse_args(argv)
    if args.steps % NUM_ENVS:
        parser.error(f"--steps must be a multiple of {NUM_ENVS}")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    ours_envs = make("CartPole-v1", n=NUM_ENVS, seed=0)
    policy = ActorCritic.for_env(ours_envs)
    collector = Collector(ours_envs, policy, steps=args.steps)
    raw_envs = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")
    state = {"obs": raw_envs.reset(seed=0)[0]}
    rand_envs = gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="sync")
    rand_envs.reset(seed=1)
    rng = np.random.default_rng(0)

    # warm-up (allocations, first-call dispatch)
    time_ours(collector, args.steps)
    time_raw(raw_envs, policy, args.steps, state)
    time_random(rand_envs, args.steps, rng)

    ours, raw, rand = [], [], []
    for _ in range(args.repeats):
        ours.append(time_ours(collector, args.steps))
        raw.append(time_raw(raw_envs, policy, args.steps, state))
        rand.append(time_random(rand_envs, args.steps, rng))
    med_ours, med_raw, med_rand = statistics.median(ours), statistics.median(raw), statistics.median(rand)
    ratios = [o / r for o, r in zip(ours, raw, strict=True)]
    ratio = med_ours / med_raw

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Collection speed, {NUM_ENVS} CartPole-v1 envs (sync), 64x64 tanh ActorCritic, torch "
          f"{torch.__version__} (1 thread), {args.steps} steps per timing, median of {args.repeats} interleaved "
          f"repeats; {os.cpu_count()} CPUs, load average {load:.2f}")
    print(f"  {'loop':<40} {'steps/s':>10}   (min .. max)")
    print(f"  {'pickaxe Collector (policy)':<40} {med_ours:>10,.0f}   ({min(ours):,.0f} .. {max(ours):,.0f})")
    print(f"  {'raw gymnasium loop (same policy)':<40} {med_raw:>10,.0f}   ({min(raw):,.0f} .. {max(raw):,.0f})")
    print(f"  {'raw gymnasium loop (random actions)':<40} {med_rand:>10,.0f}   ({min(rand):,.0f} .. {max(rand):,.0f})")
    print(f"  ours / raw = {ratio:.3f} (median of per-repeat ratios {statistics.median(ratios):.3f}); "
          f"target >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'}")
    print("  reference figures (2-core machine): raw random stepping ~146k steps/s; SB3 PPO rollout ~22k steps/s; "
          "Tianshou Collector ~8k steps/s")
    print(f"  ours / SB3 reference = {med_ours / SB3_PPO_ROLLOUT:.2f}x (target >= 3x = 66k steps/s); "
          f"this machine's random stepping is {med_rand / RAW_RANDOM_REFERENCE:.2f}x the reference machine's")
    print(json.dumps({
        "ours_steps_per_s": round(med_ours),
        "raw_policy_steps_per_s": round(med_raw),
        "raw_random_steps_per_s": round(med_rand),
        "ours_over_raw": round(ratio, 3),
        "ours_over_sb3_ref": round(med_ours / SB3_PPO_ROLLOUT, 2),
        "machine_over_ref_random": round(med_rand / RAW_RANDOM_REFERENCE, 2),
    }))


if __name__ == "__main__":
    main()
