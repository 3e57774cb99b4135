"""Offline checkpoint selection: how well fitted Q evaluation (``pickaxe eval RUN --checkpoints all --fqe``) ranks an
offline run's kept checkpoints against their online return, over seeds; the figures of docs/offline.md.

Datasets (made here, no source run needed):

- ``cartpole``: 16 CartPole-v1 episodes of a balancing controller (push toward the side the pole falls,
  ``theta + 0.5 theta_dot > 0``) acting with epsilon 0, 0.25, 0.5 and 1 in turn, cut at 200 steps (as truncations).
- ``pendulum``: 20 Pendulum-v1 episodes of uniformly random torques (200 steps each).

On each, an offline recipe (``cartpole-cql``, ``pendulum-iql``) trains with ``--seeds`` seeds, keeping a policy at
each of ``--evals`` evaluations; then ``pickaxe eval RUN --checkpoints all --fqe`` scores every kept policy online
(``--episodes`` episodes) and by FQE (its defaults, ``--fqe.steps``), and the Spearman rank correlation of the two
over the checkpoints is recorded, with whether FQE's pick is the online best and the online return of FQE's pick
against the best online return ("regret").

Usage::

    python benchmarks/fqe.py --out /tmp/fqe-bench --seeds 3
    python benchmarks/fqe.py --envs cartpole --seeds 1      # a quick look

The last line printed is one JSON object with every run's figures; a markdown table is printed before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pickaxe.cli import main
from pickaxe.offline.dataset import Episode, write

RECIPES = {"cartpole": "cartpole-cql", "pendulum": "pendulum-iql"}


def cartpole_dataset(out: Path) -> None:
    """The controller's episodes with epsilon 0, 0.25, 0.5, 1 in turn (see the module docstring)."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(16):
        epsilon = (0.0, 0.25, 0.5, 1.0)[i % 4]
        o, _ = env.reset(seed=i)
        obs, act, rew, term, trunc = [o], [], [], [], []
        for t in range(200):
            a = int(rng.integers(2)) if rng.random() < epsilon else int(o[2] + 0.5 * o[3] > 0)
            o, r, te, tr, _ = env.step(a)
            obs.append(o), act.append(a), rew.append(r), term.append(te), trunc.append((tr or t == 199) and not te)
            if te or tr or t == 199:
                break
        episodes.append(
            Episode(np.array(obs, np.float32), np.array(act), np.array(rew), np.array(term), np.array(trunc))
        )
    write(out, episodes, env.observation_space, env.action_space, "cartpole/scripted-v0", {}, env_id="CartPole-v1")


def pendulum_dataset(out: Path) -> None:
    """20 episodes of uniformly random torques."""
    env = gym.make("Pendulum-v1")
    env.action_space.seed(0)
    episodes = []
    for i in range(20):
        o, _ = env.reset(seed=i)
        obs, act, rew, term, trunc = [o], [], [], [], []
        while True:
            a = env.action_space.sample()
            o, r, te, tr, _ = env.step(a)
            obs.append(o), act.append(a), rew.append(r), term.append(te), trunc.append(tr)
            if te or tr:
                break
        episodes.append(
            Episode(
                np.array(obs, np.float32), np.array(act, np.float32), np.array(rew), np.array(term), np.array(trunc)
            )
        )
    write(out, episodes, env.observation_space, env.action_space, "pendulum/random-v0", {}, env_id="Pendulum-v1")


def measure(env: str, data: Path, seed: int, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One offline run and its checkpoints scored online and by FQE."""
    run = out / f"{env}-seed{seed}"
    total = args.gradient_steps * 256
    flags = ["--data.dataset", str(data), "--seed", str(seed), "--trainer.total-steps", str(total)]
    flags += ["--collector.steps", "256", "--trainer.eval-every", str(total // args.evals), "--torch-threads", "1"]
    flags += ["--trainer.eval-episodes", "2", "--env.eval-envs", "2"]
    start = time.perf_counter()
    assert main(["train", RECIPES[env], *flags, "--run-dir", str(run), "--no-progress", "--overwrite"]) == 0
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    fqe = ["--fqe", "--fqe.steps", str(args.fqe_steps)]
    assert main(["eval", str(run), "--checkpoints", "all", *fqe, "--episodes", str(args.episodes)]) == 0
    eval_s = time.perf_counter() - start
    report = json.loads((run / "eval" / "checkpoints.json").read_text())
    online = {r["step"]: r["metrics"]["eval/return_mean"]["mean"] for r in report["rows"]}
    fqe_value = {r["step"]: r["metrics"]["eval/fqe_value"]["mean"] for r in report["rows"]}
    pick = max(fqe_value, key=lambda s: (fqe_value[s], -s))
    best = max(online.values())
    return {
        "env": env,
        "recipe": RECIPES[env],
        "seed": seed,
        "checkpoints": len(online),
        "spearman": report["agreement"]["spearman"],
        "fqe_pick_is_best": online[pick] == best,
        "regret": best - online[pick],
        "online": online,
        "fqe": fqe_value,
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
    }


def main_cli() -> None:
    """Run the benchmark and print the table and the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/fqe-bench")
    p.add_argument("--envs", default="cartpole,pendulum")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--evals", type=int, default=6)
    p.add_argument("--gradient-steps", type=int, default=600)
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--fqe-steps", type=int, default=2000)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for env in args.envs.split(","):
        data = out / f"{env}-data"
        if not data.exists():
            (cartpole_dataset if env == "cartpole" else pendulum_dataset)(data)
        for seed in range(args.seeds):
            results.append(measure(env, data, seed, out, args))
            print(json.dumps(results[-1]), flush=True)
    print(
        "| env | recipe | checkpoints per run | Spearman per seed | median | FQE's pick is the online best | regret |"
    )
    print("|---|---|---|---|---|---|---|")
    for env in args.envs.split(","):
        rs = [r for r in results if r["env"] == env]
        rhos = [r["spearman"] for r in rs if r["spearman"] is not None]
        print(
            f"| {env} | {rs[0]['recipe']} | {rs[0]['checkpoints']} | {', '.join(f'{x:.2f}' for x in rhos)} | "
            f"{statistics.median(rhos):.2f} | {sum(r['fqe_pick_is_best'] for r in rs)} of {len(rs)} | "
            f"{', '.join(format(r['regret'], '.1f') for r in rs)} |"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main_cli()
