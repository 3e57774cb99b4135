"""The cost of one PPO gradient step of the ``cartpole-ppo`` recipe (64x64 tanh actor and critic behind a running
observation normaliser, minibatch 256) against the bare PyTorch loop doing the same arithmetic (the floor), and
``torch.compile`` of that bare step.

* ``pickaxe``: ``PPO._step`` of the recipe's algorithm on a minibatch of a real rollout (loss with its metrics,
  backward, gradient clipping, fused Adam, the non-finite guard and the one host read of loss and metrics);
* ``bare``: the same networks, normalisation statistics and minibatch, the same normalisation and loss terms
  written out in PyTorch, ``clip_grad_norm_``, fused Adam, and one ``.tolist()`` of the same metrics;
* ``bare compiled``: the bare loss under ``torch.compile`` (its compile time is reported apart).

Repeats are interleaved (pickaxe, bare, compiled, pickaxe, ...) with ``--steps`` gradient steps each; medians of
milliseconds per step are reported. Target: pickaxe's overhead over the bare step <= 25%.

Usage: ``python benchmarks/ppo_step.py [--steps 200] [--repeats 7] [--no-compile]``; the last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer


def bare_step(
    actor: nn.Module,
    critic: nn.Module,
    opt: torch.optim.Optimizer,
    mb: dict[str, torch.Tensor],
    compiled: bool,
    norm: Any = None,
) -> Callable[[], list[float]]:
    """One bare PPO minibatch step (observations normalised as the ``RunningMeanStd`` ``norm`` does, when given):
    returns its loss and metrics read in one host sync."""
    params = [*actor.parameters(), *critic.parameters()]
    stats = None if norm is None else (norm.mean, norm.var, norm.eps, norm.clip)  # read once, as plain tensors

    def loss_fn(
        obs: torch.Tensor, action: torch.Tensor, old_logprob: torch.Tensor, old_value: torch.Tensor,
        adv: torch.Tensor, ret: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if stats is not None:  # the recipe's observation normaliser, written out: float64, then clipped
            mean, var, eps, clip = stats
            obs = ((obs.to(torch.float64) - mean) / torch.sqrt(var + eps)).clamp(-clip, clip).to(torch.float32)
        logits = actor(obs)
        logp_all = torch.log_softmax(logits, -1)
        logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        value = critic(obs).squeeze(-1)
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
        ratio = (logprob - old_logprob).exp()
        unclipped = ratio * adv
        clipped_obj = ratio.clamp(0.8, 1.2) * adv
        pg = -torch.minimum(unclipped, clipped_obj).mean()
        v = (0.5 * (value - ret).pow(2)).mean()
        ent = entropy.mean()
        log_ratio = logprob.detach() - old_logprob
        kl = (log_ratio.exp() - 1.0 - log_ratio).mean()
        clip_frac = (clipped_obj < unclipped).float().mean()
        return pg + 0.5 * v, torch.stack([pg.detach(), v.detach(), ent.detach(), kl, clip_frac])

    fn = torch.compile(loss_fn) if compiled else loss_fn
    args = (mb["obs"], mb["action"], mb["logprob"], mb["value"], mb["advantage"], mb["return"])

    def step() -> list[float]:
        loss, stats = fn(*args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        return torch.cat([norm.reshape(1), loss.detach().reshape(1), stats]).tolist()

    return step


def timed(step: Callable[[], object], n: int) -> float:
    """Milliseconds per call over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        step()
    return 1000 * (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="gradient steps per timing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats; medians are reported")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variant")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    cfg = get_recipe("cartpole-ppo")
    trainer = build_trainer(cfg)
    algo = trainer.algo
    from pickaxe.algos.ppo import compute_targets

    compute_targets(algo.policy, algo.rollout, trainer.collector.collect())
    mb = next(iter(algo.rollout.minibatches(cfg.algo.minibatch_size)))
    assert mb.batch_size[0] == 256, mb.batch_size
    clip = cfg.algo.clip
    policy = getattr(algo.policy, "inner", algo.policy)  # the actor-critic behind the observation normaliser
    norm = getattr(algo.policy, "obs_norm", None)  # its statistics do not change during the timed steps
    loops: dict[str, Callable[[], object]] = {"pickaxe": lambda: algo._step(mb, cfg.algo, clip, None)}
    tensors = {k: mb[k] for k in ("obs", "action", "logprob", "value", "advantage", "return")}
    variants = [("bare", False)] + ([] if args.no_compile else [("bare compiled", True)])
    compile_s = None
    for name, compiled in variants:
        actor, critic = _copy(policy.actor), _copy(policy.critic)
        opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=cfg.algo.lr, eps=1e-5, fused=True)
        loops[name] = bare_step(actor, critic, opt, tensors, compiled, norm)
        start = time.perf_counter()
        loops[name]()  # warm-up; for the compiled variant, the compilation
        if compiled:
            compile_s = time.perf_counter() - start
    for step in loops.values():
        timed(step, 10)
    times: dict[str, list[float]] = {k: [] for k in loops}
    for _ in range(args.repeats):
        for name, step in loops.items():
            times[name].append(timed(step, args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    load = os.getloadavg()[0]
    print(f"PPO gradient step, cartpole-ppo networks (64x64 tanh actor and critic, normalised observations), "
          f"minibatch 256, torch {torch.__version__} (1 thread), {args.steps} steps per timing, median of "
          f"{args.repeats} interleaved repeats; {os.cpu_count()} CPUs, load average {load:.2f}")  # fmt: skip
    for name, v in times.items():
        print(f"  {name:<16} {med[name]:>8.3f} ms/step   ({min(v):.3f} .. {max(v):.3f})")
    ratio = med["pickaxe"] / med["bare"]
    print(f"  pickaxe / bare = {ratio:.3f} (overhead {100 * (ratio - 1):.1f}%; target <= 25%)")
    summary = {f"{k.replace(' ', '_')}_ms": round(v, 4) for k, v in med.items()}
    summary["pickaxe_over_bare"] = round(ratio, 3)
    if compile_s is not None:
        c = med["bare compiled"] / med["bare"]
        saved = med["bare"] - med["bare compiled"]
        payback = compile_s / (saved / 1000) if saved > 0 else float("inf")
        print(f"  compiled / bare = {c:.3f}; compile took {compile_s:.1f} s, paid back after "
              f"{payback:,.0f} steps (cartpole-ppo solves in 240-470 steps)")  # fmt: skip
        summary.update(compiled_over_bare=round(c, 3), compile_s=round(compile_s, 2))
    print(json.dumps(summary))


def _copy(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module)


if __name__ == "__main__":
    main()
