"""The cost of one offline gradient step (issue 29): every offline algorithm of the recipes (BC, TD3+BC, CQL, BCQ,
CRR, IQL; Box on Pendulum's spaces, Discrete on CartPole's) built as its recipe builds it (64x64 relu, lr 1e-3,
minibatches of 256), fed fixed synthetic dataset batches of 8 minibatches (one offline iteration, as the recipes'
``collector.steps`` 2048), timed as the trainer times it: ``algo.update(batch)`` plus the trainer's finite-weights
check, in thread CPU seconds (one torch thread).

* ``--time``: per algorithm, the minimum over ``--rounds`` rounds of ``--steps`` gradient steps of thread CPU ms per
  step (after one warm-up iteration);
* ``--hash``: per algorithm, the sha256 of its weights, optimizer state and every metric ``update`` returned over
  ``--steps`` steps: a change that must not change a number keeps every hash;
* ``--plain``: for BCQ and BC by regression (``PLAIN``), the same gradient steps written as plain eager PyTorch
  (``F.linear`` on the weights, the losses of ``torch.nn.functional``, ``zero_grad``, ``backward``, a fused Adam's
  ``step``; no guard, no metrics), timed in rounds alternating with pickaxe's on the same batches, and pickaxe's
  ms per step over the plain loop's: how much of a step is pickaxe's and how much PyTorch's own work.

Run it in fresh processes alternately for two source trees to compare them (``PYTHONPATH=A/src python
benchmarks/offline_step.py --time``, then B, then A, ...). ``bc-box-mse`` is BC by regression (Tianshou's BC method on
Box actions), ``FLAGS``. Usage: ``python benchmarks/offline_step.py [--time]
[--hash] [--plain] [--steps 80] [--rounds 3] [--algos bc-box,bcq,...]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from pickaxe.algos.base import all_finite
from pickaxe.algos.offline import split_minibatches
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


PLAIN = ("bcq", "bc-box-mse")
"""The cases ``--plain`` writes as plain PyTorch: the cheapest steps, where the library's share would show most."""


def _mlp(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """A relu MLP from its ``[weight, bias, ...]`` list (the layers of ``pickaxe.models.mlp.mlp`` in order)."""
    last = len(params) // 2 - 1
    for i in range(0, len(params), 2):
        x = F.linear(x, params[i], params[i + 1])
        if i // 2 < last:
            x = torch.relu_(x)
    return x


def plain_step(case: str, algo: Any) -> tuple[Callable[[dict[str, torch.Tensor]], torch.Tensor], list[torch.Tensor]]:
    """``case``'s gradient step on one minibatch as plain eager PyTorch (the same computation as ``algo.update``'s,
    without its guard and metrics; the step returns its loss), and the weights it trains: copies of ``algo``'s
    current trained parameters, in ``algo.learned``'s order."""
    cfg = algo.config

    def copies(module: torch.nn.Module, grad: bool) -> list[torch.Tensor]:
        return [p.detach().clone().requires_grad_(grad) for p in module.parameters()]

    if case == "bcq":
        q, im, target = copies(algo.qnet, True), copies(algo.imitation, True), copies(algo.target, False)
        opt = torch.optim.Adam(q + im, lr=cfg.lr, fused=True)

        def bcq(mb: dict[str, torch.Tensor]) -> torch.Tensor:
            obs, next_obs, action = mb["obs"], mb["next_obs"], mb["action"]
            with torch.no_grad():
                next_logprobs = F.log_softmax(_mlp(im, next_obs), dim=-1)
                ratio = (next_logprobs - next_logprobs.max(dim=-1, keepdim=True).values).exp()
                masked = torch.where(ratio >= cfg.threshold, _mlp(q, next_obs), torch.finfo(torch.float32).min)
                next_value = _mlp(target, next_obs).gather(-1, masked.argmax(-1, keepdim=True)).squeeze(-1)
                y = mb["reward"] + cfg.gamma * (1.0 - mb["terminated"].float()) * next_value
            logits = _mlp(im, obs)
            q_data = _mlp(q, obs).gather(-1, action.unsqueeze(-1)).squeeze(-1)
            loss = F.smooth_l1_loss(q_data, y) + F.cross_entropy(logits, action)
            loss = loss + cfg.imitation_penalty * logits.pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(target, q, cfg.tau)
            return loss.detach()

        return bcq, q + im
    if case == "bc-box-mse":
        actor = copies(algo.actor, True)
        opt = torch.optim.Adam(actor, lr=cfg.lr, fused=True)
        scale = algo.policy.scale

        def bc(mb: dict[str, torch.Tensor]) -> torch.Tensor:
            unit = ((mb["action"] - scale.center) / scale.half_range).clamp(-1.0, 1.0)
            loss = F.mse_loss(torch.tanh(_mlp(actor, mb["obs"])), unit)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.detach()

        return bc, actor
    raise ValueError(f"no plain PyTorch step for {case!r}; choose from {', '.join(PLAIN)}")


def time_plain(case: str, steps: int, rounds: int) -> tuple[float, float]:
    """``(pickaxe, plain)``: the minimum over ``rounds`` of thread CPU ms per gradient step of each, rounds
    alternating (pickaxe's as ``time_case`` times it; the plain loop's with the same cutting into minibatches)."""
    algo, batches = build(case)
    step = plain_step(case, algo)[0]
    size = algo.config.batch_size
    per_iteration = batches[0].batch_size[0] // size
    iterations = max(steps // per_iteration, 1)

    def plain(batch: Any) -> None:
        for mb in split_minibatches(batch, size):
            step(mb)

    runs = (lambda batch: iteration(algo, batch), plain)
    best = [float("inf"), float("inf")]
    for run in runs:  # warm-up, both
        run(batches[0])
    for _ in range(rounds):
        for which, run in enumerate(runs):
            start = time.thread_time()
            for i in range(iterations):
                run(batches[i % len(batches)])
            best[which] = min(best[which], (time.thread_time() - start) * 1e3 / (iterations * per_iteration))
    return best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--hash", action="store_true")
    parser.add_argument("--plain", action="store_true", help=f"time {' and '.join(PLAIN)} beside plain PyTorch")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algos", default=None, help="comma-separated cases (default: all; with --plain, PLAIN's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = args.algos.split(",") if args.algos else list(PLAIN if args.plain else CASES)
    unknown = [c for c in cases if c not in CASES]
    unplain = [c for c in cases if c not in PLAIN] if args.plain else []
    if unknown or unplain:
        print(
            f"unknown case {unknown[0]!r}; fix: --algos from {','.join(CASES)}"
            if unknown
            else f"--plain times {', '.join(PLAIN)}, not {unplain[0]}; fix: --algos {','.join(PLAIN)}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    out: dict[str, Any] = {}
    if args.hash:
        out["hash"] = {case: hash_case(case, args.steps) for case in cases}
    if args.plain:
        timed = {case: time_plain(case, args.steps, args.rounds) for case in cases}
        out["plain"] = {
            case: {"pickaxe_ms": round(p, 3), "plain_ms": round(q, 3), "ratio": round(p / q, 3)}
            for case, (p, q) in timed.items()
        }
    if args.time or not (args.hash or args.plain):
        out["ms_per_step"] = {case: round(time_case(case, args.steps, args.rounds), 3) for case in cases}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
