"""The update's utilisation of a bare-matmul floor: the ``floor`` part of ``llm.py`` (see its docstring for the FLOP
formula)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from llm_common import run_child

from pickaxe.algos.grpo import GRPO
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import TextCollector
from pickaxe.train.llm import build_env, build_model, derive_llm_seeds


def linear_shapes(config: Any) -> list[tuple[int, int]]:
    """``(in, out)`` of every linear map of one decoder layer of a Qwen2/Llama-style ``config``."""
    H, inter = config.hidden_size, config.intermediate_size
    hd = getattr(config, "head_dim", None) or H // config.num_attention_heads
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    return [(H, q), (H, kv), (H, kv), (q, H), (H, inter), (H, inter), (inter, H)]


def update_flops(config: Any, lengths: list[int], completion_tokens: int) -> dict[str, float]:
    """Model FLOPs of one update (forward + backward) from the config and token counts; see the module docstring."""
    H, V = config.hidden_size, config.vocab_size
    hd = getattr(config, "head_dim", None) or H // config.num_attention_heads
    d_attn = config.num_attention_heads * hd
    T = sum(lengths)
    p_layers = config.num_hidden_layers * sum(i * o for i, o in linear_shapes(config))
    dense = 2 * p_layers * T
    head = 2 * H * V * completion_tokens
    attention = 2 * config.num_hidden_layers * d_attn * sum(n * (n + 1) for n in lengths)
    forward = dense + head + attention
    return {"forward": float(forward), "update": 3.0 * forward, "dense": float(dense), "head": float(head),
            "attention": float(attention)}  # fmt: skip


def median_seconds(run: Callable[[], None], repeats: int) -> float:
    """The median wall seconds of ``repeats`` calls of ``run``, after one untimed warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_floor(config: Any, lengths: list[int], completion_tokens: int, repeats: int) -> dict[str, float]:
    """Seconds and FLOP rate of bare matmuls of the update's shapes: each layer's linear maps over the real tokens
    (forward, grad-input, grad-weight), the head over the completion tokens, and per-sequence causal attention
    products (``QK^T``, ``AV`` and their backward, as full square products timed once per distinct length)."""
    H, V = config.hidden_size, config.vocab_size
    T = sum(lengths)
    hd = getattr(config, "head_dim", None) or H // config.num_attention_heads
    heads = config.num_attention_heads
    g = torch.Generator().manual_seed(0)

    def mm_triplet(m: int, k: int, n: int) -> tuple[float, float]:
        a, w, gy = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(m, n, generator=g)

        def run() -> None:
            a @ w  # forward
            gy @ w.t()  # grad input
            a.t() @ gy  # grad weight

        return median_seconds(run, repeats), 3 * 2.0 * m * k * n

    seconds, flops = 0.0, 0.0
    for k, n in linear_shapes(config):
        s, f = mm_triplet(T, k, n)
        seconds += config.num_hidden_layers * s
        flops += config.num_hidden_layers * f
    s, f = mm_triplet(completion_tokens, H, V)
    seconds, flops = seconds + s, flops + f
    # attention: per length L, [heads, L, hd] x [heads, hd, L] and [heads, L, L] x [heads, L, hd], forward + 2 backward
    counts: dict[int, int] = {}
    for n in lengths:
        counts[n] = counts.get(n, 0) + 1
    for n, c in counts.items():
        q, kt, p = (torch.randn(heads, n, hd, generator=g), torch.randn(heads, hd, n, generator=g),
                    torch.randn(heads, n, n, generator=g))  # fmt: skip

        def run(q: torch.Tensor = q, kt: torch.Tensor = kt, p: torch.Tensor = p) -> None:
            for _ in range(3):
                torch.bmm(q, kt)
                torch.bmm(p, q)

        seconds += config.num_hidden_layers * c * median_seconds(run, repeats)
        flops += config.num_hidden_layers * c * 3 * 2 * (2.0 * heads * n * n * hd)
    return {"seconds": seconds, "rate": flops / seconds}


def floor_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``GRPO.update`` on a collected ``arith-grpo`` batch and the bare-matmul floor of its shapes."""
    torch.set_num_threads(1)
    cfg = LLM_RECIPES["arith-grpo"].make()
    seeds = derive_llm_seeds(cfg.seed)
    model, tok = build_model(cfg, torch.device("cpu"), seeds["model"])
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    e = cfg.engine
    sampling = SamplingParams(e.max_new_tokens, e.temperature, e.top_k, e.top_p, n=cfg.collector.group_size)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, e.max_batch, seed=0)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    prompts = spec["prompts"] or cfg.collector.prompts
    collector = TextCollector(env, engine, tok, prompts, sampling, model, reference, lambda: 0)
    batch = collector.collect()
    # the floor counts the FLOPs of the plain layout (every completion with its own copy of the prompt); the default
    # shared-prefix layout runs fewer, timed alongside (interleaved) against the same floor
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(spec["repeats"] + 1):  # the first is a warm-up
        for share in (False, True):
            algo = GRPO(copy.deepcopy(model), dataclasses.replace(cfg.algo, share_prompts=share), sampling, seed=0)
            b = batch.clone()
            t = time.perf_counter()
            algo.update(b)
            times[share].append(time.perf_counter() - t)
    update_s, shared_s = statistics.median(times[False][1:]), statistics.median(times[True][1:])
    lengths = [int(n) for n in batch["attention_mask"].sum(-1)]
    completion = int(batch["loss_mask"].sum())
    flops = update_flops(model.config, lengths, completion)
    floor = matmul_floor(model.config, lengths, completion, spec["repeats"])
    floor_s = flops["update"] / floor["rate"]
    return {
        "update_s": update_s,
        "flops": flops,
        "matmul_rate": floor["rate"],
        "floor_s": floor_s,
        "utilisation": floor_s / update_s,
        "shared_update_s": shared_s,
        "shared_over_floor": shared_s / floor_s,
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "completion_tokens": completion,
        "padded_slots": int(batch["attention_mask"].numel()),
    }


def report_floor(args: argparse.Namespace) -> dict[str, Any]:
    """Run the ``floor`` measurement in a fresh process; print and return it."""
    r = run_child({"kind": "floor", "repeats": args.floor_repeats, "prompts": args.floor_prompts})
    if "failed" in r:
        print(f"\n[floor] failed: {r['failed']}")
        return {"failed": r["failed"]}
    f = r["flops"]
    print(
        f"\n[floor] GRPO.update of an arith-grpo batch ({r['sequences']} sequences, {r['tokens']} real tokens in "
        f"{r['padded_slots']} slots, {r['completion_tokens']} completion tokens), median of {args.floor_repeats}:"
    )
    print(
        f"  model FLOPs {f['update'] / 1e9:.2f} G (forward: dense {f['dense'] / 1e9:.2f} G, head {f['head'] / 1e9:.3f}"
        f" G, attention {f['attention'] / 1e9:.3f} G; update = 3 x forward)"
    )
    print(
        f"  bare matmuls of these shapes: {r['matmul_rate'] / 1e9:.1f} GFLOP/s -> floor {r['floor_s']:.3f} s; update "
        f"{r['update_s']:.3f} s ({f['update'] / r['update_s'] / 1e9:.1f} GFLOP/s); utilisation {r['utilisation']:.1%}"
        " (goal >= 60%)"
    )
    print(
        f"  with shared prompts (the default layout, fewer FLOPs than counted): update {r['shared_update_s']:.3f} s = "
        f"{r['shared_over_floor']:.2f} x the floor of the plain update"
    )
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "flops"} | {
        "update_gflops": round(f["update"] / 1e9, 3)
    }
