"""The cost of one offline gradient step (issue 29): every offline algorithm of the recipes (BC, TD3+BC, CQL, BCQ,
CRR, IQL; Box on Pendulum's spaces, Discrete on CartPole's) built as its recipe builds it (64x64 relu, lr 1e-3,
minibatches of 256), fed fixed synthetic dataset batches of 8 minibatches (one offline iteration, as the recipes'
``collector.steps`` 2048), timed as the trainer times it: ``algo.update(batch)`` plus the trainer's finite-weights
check, in thread CPU seconds (one torch thread).

* ``--time``: per algorithm, the minimum over ``--rounds`` rounds of ``--steps`` gradient steps of thread CPU ms per
  step (after one warm-up iteration);
* ``--hash``: per algorithm, the sha256 of its weights, optimizer state and every metric ``update`` returned over
  ``--steps`` steps: a change that must not change a number keeps every hash.

Run it in fresh processes alternately for two source trees to compare them (``PYTHONPATH=A/src python
benchmarks/offline_step.py --time``, then B, then A, ...). ``bc-box-mse`` is BC by regression (Tianshou's BC method on
Box actions), ``FLAGS``. Usage: ``python benchmarks/offline_step.py [--time]
[--hash] [--steps 80] [--rounds 3] [--algos bc-box,bcq,...]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from pickaxe.algos.base import all_finite
from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_algorithm

CASES: dict[str, str] = {
    "bc-box": "pendulum-bc",
    "bc-box-mse": "pendulum-bc",
    "bc-discrete": "cartpole-bc",
    "td3-bc": "pendulum-td3-bc",
    "cql-box": "pendulum-cql",
    "cql-discrete": "cartpole-cql",
    "bcq": "cartpole-bcq",
    "crr-box": "pendulum-crr",
    "crr-discrete": "cartpole-crr",
    "iql-box": "pendulum-iql",
    "iql-discrete": "cartpole-iql",
}
"""Case name -> the recipe whose algorithm and settings it takes (the spaces: the recipe's env's)."""

FLAGS: dict[str, dict[str, Any]] = {"bc-box-mse": {"box_loss": "mse"}}
"""Algorithm settings on top of the recipe's: ``bc-box-mse`` is behaviour cloning by regression (``--algo.box-loss
mse``, Tianshou's BC method on Box actions) beside the likelihood of ``bc-box``."""

SPACES: dict[str, tuple[gym.Space, gym.Space]] = {
    "Pendulum-v1": (
        gym.spaces.Box(np.array([-1.0, -1.0, -8.0], np.float32), np.array([1.0, 1.0, 8.0], np.float32)),
        gym.spaces.Box(-2.0, 2.0, (1,), np.float32),
    ),
    "CartPole-v1": (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)),
}


class _Spaces:
    """What the builders read of a dataset sampler: its spaces."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = self.single_observation_space = obs_space
        self.action_space = self.single_action_space = action_space


def synthetic_batches(obs_space: gym.Space, action_space: gym.Space, n: int, size: int, seed: int = 1) -> list[Any]:
    """``n`` fixed dataset batches of ``size`` transitions with a dataset sampler's keys and dtypes."""
    from pickaxe.data.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    dim = obs_space.shape[0]
    out = []
    for _ in range(n):
        if isinstance(action_space, gym.spaces.Discrete):
            action = torch.randint(0, int(action_space.n), (size,), generator=gen)
        else:
            action = (torch.rand(size, *action_space.shape, generator=gen) * 4.0 - 2.0).float()
        fields = {
            "obs": torch.randn(size, dim, generator=gen),
            "action": action,
            "reward": torch.randn(size, generator=gen),
            "terminated": torch.rand(size, generator=gen) < 0.02,
            "truncated": torch.rand(size, generator=gen) < 0.01,
            "next_obs": torch.randn(size, dim, generator=gen),
        }
        out.append(Batch(fields, batch_size=[size]))
    return out


def build(case: str) -> tuple[Any, list[Any]]:
    """The case's algorithm (weights from seed 0) and 4 synthetic dataset batches of one iteration each."""
    cfg = get_recipe(CASES[case])
    for key, value in FLAGS.get(case, {}).items():
        setattr(cfg.algo, key, value)
    obs_space, action_space = SPACES[cfg.env.id]
    torch.manual_seed(0)
    algo = build_algorithm(cfg, _Spaces(obs_space, action_space))
    return algo, synthetic_batches(obs_space, action_space, 4, cfg.collector.steps)


def iteration(algo: Any, batch: Any) -> dict[str, float]:
    """One offline iteration as the trainer runs it: ``update`` and the finite-weights check."""
    metrics = algo.update(batch)
    assert all_finite(p for net in algo.networks().values() for p in net.parameters())
    return metrics


def time_case(case: str, steps: int, rounds: int) -> float:
    """Minimum over ``rounds`` of thread CPU ms per gradient step."""
    algo, batches = build(case)
    per_iteration = batches[0].batch_size[0] // algo.config.batch_size
    iteration(algo, batches[0])  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for i in range(max(steps // per_iteration, 1)):
            iteration(algo, batches[i % len(batches)])
        best = min(best, (time.thread_time() - start) * 1e3 / (max(steps // per_iteration, 1) * per_iteration))
    return best


def hash_case(case: str, steps: int) -> str:
    """sha256 of the weights, optimizer state and metrics after ``steps`` gradient steps."""
    algo, batches = build(case)
    per_iteration = batches[0].batch_size[0] // algo.config.batch_size
    digest = hashlib.sha256()
    for i in range(max(steps // per_iteration, 1)):
        metrics = iteration(algo, batches[i % len(batches)])
        digest.update(repr(sorted(metrics.items())).encode())
    for name, net in algo.networks().items():
        for key, value in net.state_dict().items():
            digest.update(f"{name}.{key}".encode())
            digest.update(value.detach().contiguous().numpy().tobytes())
    state = algo.optimizer.state_dict()["state"]
    for k in sorted(state):
        for key in sorted(state[k]):
            digest.update(state[k][key].detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--hash", action="store_true")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algos", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = args.algos.split(",")
    out: dict[str, Any] = {}
    if args.hash:
        out["hash"] = {case: hash_case(case, args.steps) for case in cases}
    if args.time or not args.hash:
        out["ms_per_step"] = {case: round(time_case(case, args.steps, args.rounds), 3) for case in cases}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
