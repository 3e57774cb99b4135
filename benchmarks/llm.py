"""LLM RL benchmarks: GRPO and PPO step breakdowns, generation speed, memory at real vocabulary, TRL side by side,
FLOP floor.

Usage: ``python benchmarks/llm.py [step ppo generate memory trl floor ...] [--quick] [options]``; no subcommand runs
``step ppo generate memory floor`` (``trl`` needs the ``bench`` extra: ``pip install -e .[bench]``). Torch runs with
one thread; the load average is printed first; the last line is one JSON object with every figure.

1. ``step``: the ``arith-grpo`` recipe's collector and GRPO (tiny Qwen2-style model, 32 prompts x 8 completions,
   KL to a frozen reference) for ``--steps`` updates without the SFT warm start; per step, medians of
   generate (engine), reward (scoring), ref (reference log-probs) and update (GRPO, forward + backward + AdamW).
2. ``ppo``: the ``synthetic-ppo`` recipe (PPO with a critic against a reward model, 64 sorting prompts x 1
   completion, 4 PPO epochs, KL to a frozen reference) built by ``build_llm_trainer`` without the SFT warm start,
   with a reward model made in memory from the fresh policy's decoder (``RewardModel.from_lm``, handed over
   through a temporary folder) as the ``proxy`` reward and the critic's starting point; ``--ppo-steps`` updates
   after one warm-up. Per step: generate (engine), reward (reward-model scoring, plus the logged-only verify and
   gold checks), reference (frozen reference log-probs), values (``LLMPPO.prepare``: old log-probs and old
   values, no gradient) and update (the rest of ``LLMPPO.update``: PPO epochs, forward + backward of policy and
   critic, both AdamW steps); median [min-max] seconds and share of the step, and completion tokens/s end to end.
3. ``generate``: generated tokens/s on the same left-padded prompts (``--prompts`` held-out arithmetic prompts,
   ``--new-tokens`` new tokens, temperature 1) of ``hf`` (``HFEngine.generate``), ``generate`` (a plain
   ``model.generate(do_sample=True)`` call) and ``generate+logprobs`` (the same with ``output_scores=True`` and
   the sampled tokens' log-probs gathered, which is what an engine needs). EOS is masked out of the logits in every
   loop so all produce exactly ``--new-tokens`` tokens. Repeats are interleaved; medians, with hf / generate.
4. ``memory``: peak RSS of the log-prob computation of one GRPO update at a real vocabulary: a Qwen2-style
   ``tiny_lm(151936, hidden=64, layers=2)``, ``--mem-batch`` sequences of ``--mem-prompt`` prompt tokens plus
   ``--mem-new`` completion tokens. Each case runs in a fresh process under an address-space cap
   (``--cap-gb``; a case that hits it is reported as failed at the cap):
   * ``pickaxe-logprobs``: ``completion_logprobs`` with gradient + backward of the summed log-probs;
   * ``pickaxe-update``: one whole ``GRPO.update`` (KL to a reference, AdamW step);
   * ``naive``: the model's full ``[B, L, V]`` logits, ``log_softmax`` and ``gather``, + backward;
   * ``trl``: TRL's ``GRPOTrainer._get_per_token_logps_and_entropies`` called as its loss does (fused LM head
     with entropy, ``logits_to_keep`` = completion length) + backward (skipped without TRL).
   Figures are the process's peak RSS and the rise of the peak over the RSS just before the measured call (model
   and batch already built); ``beyond params`` subtracts the parameter-sized state the call must create
   (gradients: 1x the parameter bytes; an update's gradients and AdamW moments: 3x). Also ``pickaxe-logprobs`` at
   vocabularies 32768, 65536 and 151936 (``--mem-sweep``, with ``--mem-sweep-new`` 64 completion tokens per
   sequence, enough to fill a chunk at each) and with 4, 16 and 64 completion tokens per sequence at the main
   vocabulary (``--mem-new-sweep``): beyond the gradients it holds one chunk of logits (64 MiB, and a few copies
   of it for the backward pass) and a few parameter-sized temporaries, so it grows with the vocabulary only until
   the completion tokens fill one chunk, and not with the completion tokens after that.
5. ``trl``: pickaxe's GRPO against TRL's ``GRPOTrainer`` (the optional ``bench`` extra pins the TRL version),
   same model folder (the recipe's tiny model and character tokenizer saved once), same prompt stream (2-digit
   addition, ``--trl-prompts`` prompts x G=8 per step), reward (exact match), 5 new tokens at temperature 1, lr
   1e-4 constant, k3 KL with beta 0.005 to a reference loaded from the folder, token-mean loss (TRL ``dapo``),
   clip 0.2, grad-norm clip 1.0, AdamW without weight decay, float32, one optimizer step per generation, no vLLM,
   CPU, one thread. Gradient checkpointing off in both, then on in both. Every measured run is a fresh process
   (``--trl-warmup`` unmeasured steps, then ``--trl-steps``), pairs interleaved (pickaxe, TRL, pickaxe, TRL, ...);
   ``--trl-shape qwen2-0.5b`` runs both at a real model shape (random weights), ``--trl-gc off`` one pairing;
   per run the median step time, the generate / reward / ref / update split (TRL's methods are wrapped with
   timers; ``update`` is the rest of the step: forward, backward, optimizer), the step's CPU seconds and minor
   page faults (CPU time is the steadier figure on a shared machine), generated tokens/s end to end and the peak
   RSS. Reported: per pairing, the median over pairs of pickaxe / TRL for each figure, with min-max. pickaxe
   runs with ``GRPOConfig``'s defaults (shared prompts included) and calls ``settle_for_training`` once its
   models are built, as ``pickaxe train`` does.
6. ``floor``: the update's utilisation of a bare-matmul floor. Model FLOPs of one GRPO update from the config
   and token counts (dense layers only; norms, rotary, softmax and the loss are not counted):

       forward  = 2 * P_layers * T  +  2 * H * V * C  +  2 * layers * d_attn * sum_i L_i * (L_i + 1)
       update   = 3 * forward                               (backward = 2 x forward)

   with ``P_layers`` the weights of the decoder layers' linear maps (q, k, v, o, gate, up, down; embeddings
   excluded: a lookup is not a matmul), ``T`` the real tokens, ``C`` the completion tokens (the only positions
   whose log-probs the update needs), ``H`` the hidden size, ``V`` the vocabulary, ``d_attn`` = heads x head_dim
   and ``L_i`` each sequence's length (causal attention: ``QK^T`` and ``AV`` over the lower triangle). The floor
   is the same FLOPs at the rate torch reaches on bare ``mm`` / ``bmm`` calls of exactly those shapes (each linear
   map's forward and both backward products; per-sequence attention products), measured in the same run;
   utilisation = floor time / measured ``GRPO.update`` time (median of ``--floor-repeats``) of the plain update
   (``share_prompts=False``: each completion with its own copy of the prompt, what the formula counts). The default
   update (shared prompts, :mod:`pickaxe.data.shared_prefix`) runs fewer FLOPs; its time is reported against the
   same floor (``shared_over_floor`` < 1: faster than the plain update could be).

``--quick`` shrinks every part (a CI smoke run, under 2 minutes without ``trl``).

The ``trl`` part lives in ``llm_trl.py``, the ``floor`` part in ``llm_floor.py`` and what they share with this file and
``trl_pairs.py`` in ``llm_common.py``; this file runs them all and every fresh measurement process.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pickaxe.algos.configs import GRPOConfig
from pickaxe.algos.grpo import GRPO
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import TextCollector, encode_prompts
from pickaxe.train.llm import build_env, build_model, derive_llm_seeds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_common import fmt_spread, peak_bytes, reset_peak, rounded, rss_bytes, run_child, spread
from llm_floor import floor_child, report_floor, update_flops  # noqa: F401 (update_flops: tests read it here)
from llm_trl import pickaxe_grpo_child, report_trl, trl_grpo_child

FAST = ("step", "ppo", "generate", "memory", "floor")
ALL = ("step", "ppo", "generate", "memory", "trl", "floor")
GIB = 1 << 30
QUICK = {
    "steps": 2, "ppo_steps": 2, "ppo_prompts": 16, "prompts": 32, "new_tokens": 8, "repeats": 2,
    "mem_batch": 4, "mem_prompt": 32, "mem_vocab": 32768, "mem_sweep": [8192],
    "mem_sweep_new": 4, "mem_new_sweep": [], "cap_gb": 4.0,
    "trl_pairs": 1, "trl_steps": 2, "trl_prompts": 8, "floor_repeats": 2, "floor_prompts": 8,
}  # fmt: skip
"""``--quick``'s defaults (a CI smoke run)."""


# ---------------------------------------------------------------------------------------------------- processes


# ----------------------------------------------------------------------------------------------------- step


def step_breakdown(steps: int) -> dict[str, float]:
    """Median seconds per phase of an ``arith-grpo`` step."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    seeds = derive_llm_seeds(cfg.seed)
    model, tok = build_model(cfg, torch.device("cpu"), seeds["model"])
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    e = cfg.engine
    sampling = SamplingParams(e.max_new_tokens, e.temperature, e.top_k, e.top_p, n=cfg.collector.group_size)
    algo = GRPO(model, cfg.algo, sampling, seed=0)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, e.max_batch, seed=0)
    collector = TextCollector(env, engine, tok, cfg.collector.prompts, sampling, model, reference, lambda: algo.version)
    rows: dict[str, list[float]] = {"generate": [], "reward": [], "ref": [], "update": [], "total": []}
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = collector.collect()
        t1 = time.perf_counter()
        algo.update(batch)
        t2 = time.perf_counter()
        m = collector.metrics()
        rows["generate"].append(m["time/generate_s"])
        rows["reward"].append(m["time/reward_s"])
        rows["ref"].append(m["time/ref_logprob_s"])
        rows["update"].append(t2 - t1)
        rows["total"].append(t2 - t0)
    out = {k: statistics.median(v) for k, v in rows.items()}
    out["completions"] = float(cfg.collector.prompts * cfg.collector.group_size)
    return out


def report_step(steps: int) -> dict[str, Any]:
    """Print and return the ``step`` figures."""
    step = step_breakdown(steps)
    print(f"\n[step] arith-grpo step ({step['completions']:.0f} completions), median of {steps}, seconds:")
    for key in ("generate", "reward", "ref", "update", "total"):
        print(f"  {key:<9} {step[key]:7.3f}  ({100 * step[key] / step['total']:4.1f}%)")
    return {
        "step_s": {k: round(v, 4) for k, v in step.items() if k != "completions"},
        "completions_per_step": step["completions"],
    }


# ------------------------------------------------------------------------------------------------------ ppo

PPO_PHASES = ("generate", "reward", "reference", "values", "update")
"""The ``ppo`` step's phases, in order; with ``other`` (the rest of the step) they add up to the step."""


def ppo_breakdown(steps: int, warmup: int = 1, prompts: int = 0) -> dict[str, Any]:
    """Per-step seconds of each phase of a ``synthetic-ppo`` step (no warm start), ``warmup`` steps unmeasured.

    The setup is the recipe's own (``build_llm_trainer``): a reward model made here from the freshly initialised
    policy's decoder (``RewardModel.from_lm``; saved to a temporary folder for ``--data.reward-model``) scores the
    completions as the env's ``proxy`` reward, the critic starts from it, KL to a frozen reference. ``prepare``
    (old log-probs and old values, no gradient) is timed by wrapping ``LLMPPO.prepare``; ``update`` is the rest of
    ``LLMPPO.update``. ``prompts`` (0: the recipe's 64) sets the prompts per step."""
    from pickaxe.algos.llm_ppo import LLMPPO
    from pickaxe.models.reward import RewardModel
    from pickaxe.train.llm import build_llm_trainer

    cfg = LLM_RECIPES["synthetic-ppo"].make()
    cfg.warm_start.updates = 0
    cfg.eval.before = False
    cfg.torch_threads = 1
    if prompts:
        cfg.collector.prompts = prompts
    policy, _ = build_model(cfg, torch.device("cpu"), derive_llm_seeds(cfg.seed)["model"])
    with tempfile.TemporaryDirectory() as tmp:
        RewardModel.from_lm(policy).save(tmp)
        cfg.data.reward_model = tmp
        trainer = build_llm_trainer(cfg)  # the reward model and the critic are read from tmp here
    torch.set_num_threads(1)
    algo, collector = trainer.algo, trainer.collector
    assert isinstance(algo, LLMPPO)
    prepare_s: list[float] = []
    prepare = algo.prepare

    def timed_prepare(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return prepare(*a, **k)
        finally:
            prepare_s.append(time.perf_counter() - t)

    algo.prepare = timed_prepare  # type: ignore[method-assign]
    rows: dict[str, list[float]] = {k: [] for k in (*PPO_PHASES, "other", "total", "tokens", "tokens_per_s")}
    # "other": what no phase covers, in practice the collector's metric summary after its own timers
    completions = 0
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        batch = collector.collect()
        t1 = time.perf_counter()
        algo.update(batch)
        t2 = time.perf_counter()
        if i < warmup:
            continue
        m = collector.metrics()
        completions, tokens = batch.batch_size[0], int(batch["loss_mask"].sum())
        rows["tokens"].append(tokens)
        phases = {
            "generate": m["time/generate_s"],
            "reward": m["time/reward_s"],
            "reference": m["time/ref_logprob_s"],
            "values": prepare_s[-1],
            "update": t2 - t1 - prepare_s[-1],
        }
        for k, v in phases.items():
            rows[k].append(v)
        rows["other"].append(t2 - t0 - sum(phases.values()))
        rows["total"].append(t2 - t0)
        rows["tokens_per_s"].append(tokens / (t2 - t0))
    return {
        "rows": rows,
        "spread": {k: spread(v) for k, v in rows.items()},
        "share": {k: spread([x / t for x, t in zip(rows[k], rows["total"], strict=True)]) for k in PPO_PHASES},
        "completions": completions,
        "completion_tokens": statistics.median(rows["tokens"]),
        "epochs": cfg.algo.epochs,
    }


def report_ppo(steps: int, prompts: int = 0) -> dict[str, Any]:
    """Print and return the ``ppo`` figures."""
    r = ppo_breakdown(steps, prompts=prompts)
    s, share = r["spread"], r["share"]
    print(
        f"\n[ppo] synthetic-ppo step ({r['completions']} completions, {r['completion_tokens']:.0f} completion tokens, "
        f"{r['epochs']} PPO epochs), {steps} steps after 1 warm-up, seconds median [min-max], share of the step:"
    )
    for key in (*PPO_PHASES, "other", "total"):
        pct = f"  {fmt_spread({k: 100 * v for k, v in share[key].items()}, '%', 1)}" if key in share else ""
        print(f"  {key:<9} {fmt_spread(s[key], digits=3)}{pct}")
    print(f"  end to end {fmt_spread(s['tokens_per_s'], ' completion tokens/s', 0)}")
    return {
        "step_s": {k: rounded(v) for k, v in s.items() if k not in ("tokens", "tokens_per_s")},
        "share": {k: rounded(v) for k, v in share.items()},
        "tokens_per_s": rounded(s["tokens_per_s"], 1),
        "completions_per_step": r["completions"],
        "completion_tokens_per_step": r["completion_tokens"],
        "steps": steps,
    }


# ------------------------------------------------------------------------------------------------- generate


def generation_speed(n_prompts: int, new_tokens: int, repeats: int) -> dict[str, float]:
    """Median generated tokens/s of HFEngine and of model.generate (with and without log-probs)."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    seeds = derive_llm_seeds(cfg.seed)
    model, tok = build_model(cfg, torch.device("cpu"), seeds["model"])
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, 16 + new_tokens)
    bias = torch.zeros(model.config.vocab_size)  # never stop early: every loop generates exactly new_tokens
    bias[tok.eos_token_id] = -1e9
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    env = build_env(cfg, seeds["env"], seeds["eval_env"])
    examples = env.sample(n_prompts)
    prompt_ids = encode_prompts(tok, examples)
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, max_batch=n_prompts, seed=0)
    params = SamplingParams(new_tokens, temperature=1.0)
    batch = tok([ex.prompt for ex in examples], return_tensors="pt", padding=True)
    tokens = n_prompts * new_tokens

    def hf() -> float:
        start = time.perf_counter()
        out = engine.generate(prompt_ids, params)
        assert sum(len(c.token_ids) for c in out) == tokens
        return tokens / (time.perf_counter() - start)

    def plain(scores: bool) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                return_dict_in_generate=True,
                output_scores=scores,
            )
            if scores:
                logits = torch.stack(out.scores, dim=1).float()
                new = out.sequences[:, -new_tokens:]
                logits.log_softmax(-1).gather(-1, new.unsqueeze(-1))
        assert out.sequences.shape[1] == batch["input_ids"].shape[1] + new_tokens
        return tokens / (time.perf_counter() - start)

    hf()  # warm-up
    plain(False)
    results: dict[str, list[float]] = {"hf": [], "generate": [], "generate+logprobs": []}
    for _ in range(repeats):
        results["hf"].append(hf())
        results["generate"].append(plain(False))
        results["generate+logprobs"].append(plain(True))
    handle.remove()
    return {k: statistics.median(v) for k, v in results.items()}


def report_generate(prompts: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """Print and return the ``generate`` figures."""
    gen = generation_speed(prompts, new_tokens, repeats)
    print(f"\n[generate] {prompts} prompts x {new_tokens} new tokens, tokens/s (median of {repeats}):")
    for key, value in gen.items():
        print(f"  {key:<18} {value:10,.0f}")
    ratio, ratio_lp = gen["hf"] / gen["generate"], gen["hf"] / gen["generate+logprobs"]
    print(f"  hf / generate = {ratio:.2f}; hf / generate+logprobs = {ratio_lp:.2f}")
    return {
        "gen_tokens_per_s": {k: round(v, 1) for k, v in gen.items()},
        "hf_over_generate": round(ratio, 3),
        "hf_over_generate_logprobs": round(ratio_lp, 3),
        "gen_prompts": prompts,
        "gen_new_tokens": new_tokens,
    }


# --------------------------------------------------------------------------------------------------- memory


def memory_batch(spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A collector-shaped batch (see ``text_collector.pack``) of ``batch`` sequences: prompts of ``prompt``
    tokens, ``new`` completion tokens each, random ids (seeded), groups of 8."""
    from pickaxe.rollout.text_collector import pack

    g = torch.Generator().manual_seed(0)
    B, P, T, V = spec["batch"], spec["prompt"], spec["new"], spec["vocab"]
    prompts = torch.randint(2, V, (B, P), generator=g).tolist()
    completions = torch.randint(2, V, (B, T), generator=g).tolist()
    data = pack(prompts, completions, pad_token_id=0)
    data["reward"] = torch.randint(0, 2, (B,), generator=g).float()
    data["group"] = torch.arange(B) // 8
    data["policy_version"] = torch.zeros(B, dtype=torch.long)
    data["advantage"] = torch.zeros(B)
    return data


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``memory`` case in this (fresh) process: build the model and batch, reset the peak mark, run the case;
    returns peak RSS figures and seconds."""
    from pickaxe.models.lm import completion_logprobs, num_parameters, position_ids, tiny_lm

    model = tiny_lm(spec["vocab"], hidden=spec["hidden"], layers=spec["layers"], max_positions=1024).train()
    data = memory_batch(spec)
    ids, attn, mask = data["input_ids"], data["attention_mask"], data["loss_mask"]
    params = num_parameters(model)
    case = spec["case"]
    state_copies = 3 if case == "pickaxe-update" else 1
    if case == "pickaxe-update":
        from tensordict import TensorDict

        with torch.no_grad():
            lp = completion_logprobs(model, ids, attn, mask)
        data["logprob"], data["ref_logprob"] = lp, lp.clone()
        batch = TensorDict(data, batch_size=[ids.shape[0]])
        cfg = GRPOConfig(lr=1e-4, micro_batch_size=ids.shape[0], kl_coef=0.005, kl_estimator="k3")
        algo = GRPO(model, cfg, SamplingParams(spec["new"], n=8), seed=0)
    elif case == "trl":
        from trl import GRPOTrainer
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as GRPOTrainer.__init__ does for the policy
        trainer = argparse.Namespace(accelerator=argparse.Namespace(autocast=contextlib.nullcontext))
        completion_mask = mask[:, -spec["new"] :]
    base_peak = reset_peak()
    base = rss_bytes()
    start = time.perf_counter()
    if case == "pickaxe-logprobs":
        logp = completion_logprobs(model, ids, attn, mask)
        logp.sum().backward()
    elif case == "pickaxe-update":
        algo.update(batch)
    elif case == "naive":
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits[:, :-1]
        logp = logits.float().log_softmax(-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        (logp * mask[:, 1:]).sum().backward()
    elif case == "trl":
        # GRPOTrainer._compute_loss's call: whole batch, logits_to_keep = completion width, entropy computed
        # (__wrapped__: the method without TRL's profiling timer, which needs a whole trainer)
        logp, _, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
            trainer, model, ids, attn, spec["new"], compute_entropy=True
        )
        (logp * completion_mask).sum().backward()
    else:
        raise ValueError(f"unknown memory case {case!r}")
    seconds = time.perf_counter() - start
    # the kernel's RSS counters are batched per CPU and lag by a few pages, so the peak mark can read below an
    # RSS read a moment earlier: never report a peak below a reading taken
    peak = max(peak_bytes(), rss_bytes(), base)
    return {
        "peak": max(peak, base_peak),
        "base": base,
        "rise": peak - base,
        "beyond_params": peak - base - state_copies * 4 * params,
        "params": params,
        "seconds": seconds,
    }


def report_memory(args: argparse.Namespace, have_trl: bool) -> dict[str, Any]:
    """Run the ``memory`` cases in fresh processes; print and return the figures."""
    cap = int(args.cap_gb * GIB)
    shape = {"hidden": 64, "layers": 2, "batch": args.mem_batch, "prompt": args.mem_prompt, "new": args.mem_new}
    vocab = args.mem_vocab
    cases = ["pickaxe-logprobs", "pickaxe-update", "naive"] + (["trl"] if have_trl else [])
    print(
        f"\n[memory] tiny_lm({vocab}, hidden=64, layers=2), {args.mem_batch} sequences x ({args.mem_prompt} prompt + "
        f"{args.mem_new} completion) tokens, fresh process each, cap {args.cap_gb:g} GiB of address space:"
    )
    print(f"  {'case':<18} {'peak RSS':>10} {'rise':>10} {'beyond params':>14} {'seconds':>8}")
    out: dict[str, Any] = {}

    def show(name: str, r: dict[str, Any]) -> None:
        if "failed" in r:
            why = f"failed at the {args.cap_gb:g} GiB cap" if r["at_cap"] else f"failed: {r['failed']}"
            print(f"  {name:<18} {why}")
            return
        print(
            f"  {name:<18} {r['peak'] / GIB:9.2f}G {r['rise'] / GIB:9.2f}G {r['beyond_params'] / GIB:13.2f}G "
            f"{r['seconds']:8.2f}"
        )

    for case in cases:
        r = run_child({"kind": "memory", "case": case, "vocab": vocab, **shape}, cap)
        out[case] = r
        show(case, r)

    def sweep(label: str, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        print(f"  pickaxe-logprobs {label} (rise beyond the gradients, GiB): ", end="")
        got = {}
        for key, spec in specs.items():
            got[key] = r = run_child({"kind": "memory", "case": "pickaxe-logprobs", **spec}, cap)
            print(
                f"{key}: " + (f"failed ({r['failed']})" if "failed" in r else f"{r['beyond_params'] / GIB:.3f}"),
                end="  ",
            )
        print()
        return got

    fill = args.mem_sweep_new
    by_vocab = sweep(
        f"by vocabulary, {fill} completion tokens per sequence",
        {str(v): {**shape, "vocab": v, "new": fill} for v in args.mem_sweep},
    )
    by_new = sweep(
        f"at {vocab} by completion tokens per sequence",
        {str(n): {**shape, "vocab": vocab, "new": n} for n in args.mem_new_sweep},
    )
    summary: dict[str, Any] = {"shape": {**shape, "vocab": vocab}, "cap_gib": args.cap_gb}
    summary["pickaxe_beyond_params_by_new_tokens_gib"] = {
        n: (None if "failed" in r else round(r["beyond_params"] / GIB, 4)) for n, r in by_new.items()
    }
    for case, r in out.items():
        summary[case] = (
            {"failed": r["failed"], "at_cap": r["at_cap"]}
            if "failed" in r
            else {k: round(r[k] / GIB, 3) for k in ("peak", "rise", "beyond_params")} | {"s": round(r["seconds"], 3)}
        )
    summary["pickaxe_beyond_params_by_vocab_gib"] = {
        v: (None if "failed" in r else round(r["beyond_params"] / GIB, 4)) for v, r in by_vocab.items()
    }
    return summary


# ----------------------------------------------------------------------------------------------------- main


def child_main(spec: dict[str, Any]) -> None:
    """Entry point of a fresh measurement process: run ``spec`` and print its JSON result."""
    torch.set_num_threads(1)
    kind = spec["kind"]
    if kind == "memory":
        out = memory_child(spec)
    elif kind == "grpo":
        out = pickaxe_grpo_child(spec) if spec["lib"] == "pickaxe" else trl_grpo_child(spec)
    elif kind == "floor":
        out = floor_child(spec)
    else:
        raise ValueError(f"unknown child kind {kind!r}")
    print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` shrinks every part."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(ALL)}, all (default: {' '.join(FAST)})")
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats (CI smoke run)")
    parser.add_argument("--steps", type=int, default=8, help="step: measured steps")
    parser.add_argument("--ppo-steps", type=int, default=6, help="ppo: measured steps (after one warm-up)")
    parser.add_argument("--ppo-prompts", type=int, default=0, help="ppo: prompts per step (0: the recipe's 64)")
    parser.add_argument("--prompts", type=int, default=256, help="generate: prompts")
    parser.add_argument("--new-tokens", type=int, default=16, help="generate: new tokens")
    parser.add_argument("--repeats", type=int, default=5, help="generate: interleaved repeats")
    parser.add_argument("--mem-vocab", type=int, default=151936)
    parser.add_argument("--mem-batch", type=int, default=32)
    parser.add_argument("--mem-prompt", type=int, default=300)
    parser.add_argument("--mem-new", type=int, default=4)
    parser.add_argument("--mem-sweep", type=int, nargs="*", default=[32768, 65536, 151936])
    parser.add_argument("--mem-sweep-new", type=int, default=64, help="memory: completion tokens of the vocab sweep")
    parser.add_argument("--mem-new-sweep", type=int, nargs="*", default=[4, 16, 64])
    parser.add_argument("--cap-gb", type=float, default=12.0, help="memory: address-space cap of each case (GiB)")
    parser.add_argument("--trl-pairs", type=int, default=5)
    parser.add_argument("--trl-steps", type=int, default=5)
    parser.add_argument("--trl-warmup", type=int, default=1)
    parser.add_argument("--trl-prompts", type=int, default=32)
    parser.add_argument("--trl-shape", default=None, help="trl: a named real shape (e.g. qwen2-0.5b), random weights")
    parser.add_argument("--trl-gc", choices=("off", "on", "both"), default="both", help="trl: gradient checkpointing")
    parser.add_argument("--floor-repeats", type=int, default=5)
    parser.add_argument("--floor-prompts", type=int, default=0, help="floor: prompts per batch (0: the recipe's)")
    args = parser.parse_args(argv)
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    parts = args.parts or list(FAST)
    unknown = [p for p in parts if p not in (*ALL, "all")]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; choose from {', '.join(ALL)} or all")
    args.parts = list(ALL) if "all" in parts else parts
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the chosen parts, print figures, end with one JSON line."""
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        child_main(json.loads(sys.argv[2]))
        return
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    try:
        import trl  # noqa: F401

        have_trl = True
    except ImportError:
        have_trl = False
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}, one thread; "
          f"parts: {' '.join(args.parts)}{' (quick)' if args.quick else ''}")  # fmt: skip
    summary: dict[str, Any] = {"benchmark": "llm", "quick": args.quick, "load_avg": [round(x, 2) for x in load]}
    for part in args.parts:
        if part == "step":
            summary["step"] = report_step(args.steps)
        elif part == "ppo":
            summary["ppo"] = report_ppo(args.ppo_steps, args.ppo_prompts)
        elif part == "generate":
            summary["generate"] = report_generate(args.prompts, args.new_tokens, args.repeats)
        elif part == "memory":
            summary["memory"] = report_memory(args, have_trl)
        elif part == "trl":
            if not have_trl:
                print("\n[trl] skipped: TRL is not installed (pip install -e .[bench])")
                summary["trl"] = {"skipped": "trl not installed"}
            else:
                summary["trl"] = report_trl(args)
        elif part == "floor":
            summary["floor"] = report_floor(args)
    summary["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
