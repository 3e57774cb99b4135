"""Checkpoint evaluation throughput: held-out prompts/s of ``pickaxe eval RUN --checkpoints all`` on the tiny model,
cold (every checkpoint generated and scored) and cached (per-sample values read back from ``RUN/eval/cache``).

A tiny ``arith-grpo`` run (the LLM tests' Qwen2-style model: hidden 32, 1 layer) is trained with an evaluation every
``--eval-every`` steps, so it keeps a policy at each of them; then ``evaluate_checkpoints`` scores them all with the
run's own evaluator (``--prompts`` held-out prompts, greedy + ``--samples`` sampled completions each, KL to the
reference, entropy) without the cache (cold, the model and env built once), and again from the cache. Both times are
in-process (the interpreter's imports excluded) and include writing checkpoints.json, the CSV and the plots. Also
reported: the size of one kept policy against one full checkpoint, and the median time to save a policy.

Usage: ``python benchmarks/checkpoint_eval.py [--prompts 64] [--samples 4] [--steps 64] [--eval-every 16]
[--repeats 3]``; the load average is printed first; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pickaxe.exp.checkpoint_eval import evaluate_checkpoints
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.policies import list_policies, save_policy
from pickaxe.train.build import train
from pickaxe.train.config import TrainerConfig
from pickaxe.train.llm import build_model
from pickaxe.train.llm_config import LLMEvalConfig, LMConfig, TextCollectorConfig, WarmStartConfig


def tiny_config(args: argparse.Namespace) -> Any:
    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model = LMConfig(hidden=32, layers=1, heads=4, kv_heads=2, intermediate=64)
    cfg.warm_start = WarmStartConfig(updates=4, batch_size=16, log_every=2)
    cfg.collector = TextCollectorConfig(prompts=4, group_size=4)
    cfg.eval = LLMEvalConfig(prompts=args.prompts, samples=args.samples, pass_k=min(2, max(args.samples, 1)))
    cfg.trainer = TrainerConfig(total_steps=args.steps, eval_every=args.eval_every, keep_last=1)
    cfg.device = "cpu"
    cfg.seed = 0
    return cfg


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    cfg = tiny_config(args)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.perf_counter()
        train(cfg, run_dir=run_dir)
        train_s = time.perf_counter() - t0
        checkpoints = len(list_policies(run_dir))
        prompts = checkpoints * args.prompts
        cold, cached = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            report = evaluate_checkpoints(run_dir, cfg, ["all"], cache=False)
            cold.append(time.perf_counter() - t0)
            assert report.cached == 0
            t0 = time.perf_counter()
            report = evaluate_checkpoints(run_dir, cfg, ["all"], cache=True)
            cached.append(time.perf_counter() - t0)
            assert report.cached == checkpoints
        policy = list_policies(run_dir)[-1]
        full = CheckpointManager(run_dir).list()[-1].path
        full_bytes = sum(f.stat().st_size for f in full.iterdir())
        model, _ = build_model(cfg, torch.device("cpu"), 0)
        saves = []
        for i in range(max(args.repeats, 5)):
            t0 = time.perf_counter()
            save_policy(Path(tmp) / "saves", {"policy": model}, i, {"eval/accuracy": 0.0})
            saves.append(time.perf_counter() - t0)
    cold_s, cached_s = statistics.median(cold), statistics.median(cached)
    out = {
        "checkpoints": checkpoints,
        "prompts_per_checkpoint": args.prompts,
        "samples_per_prompt": args.samples,
        "train_s": round(train_s, 2),
        "cold_s": round(cold_s, 3),
        "cold_prompts_per_s": round(prompts / cold_s, 1),
        "cached_s": round(cached_s, 3),
        "cached_prompts_per_s": round(prompts / cached_s, 1),
        "cached_speedup": round(cold_s / cached_s, 1),
        "policy_bytes": policy.size,
        "checkpoint_bytes": full_bytes,
        "policy_save_s": round(statistics.median(saves), 4),
    }
    print(f"{checkpoints} checkpoints x {args.prompts} held-out prompts ({args.samples} samples each)")
    print(f"cold:   {cold_s:.2f} s  ({out['cold_prompts_per_s']} prompts/s, model built once)")
    print(f"cached: {cached_s:.3f} s  ({out['cached_prompts_per_s']} prompts/s, {out['cached_speedup']}x)")
    print(f"kept policy {policy.size:,} B vs full checkpoint {full_bytes:,} B")
    print(f"saving a policy: {out['policy_save_s']} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
