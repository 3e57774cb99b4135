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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import resource
import statistics
import subprocess
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


def rss_bytes() -> int:
    """Resident set size of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes() -> int:
    """Peak resident set size of this process (since start or the last ``reset_peak``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux ``clear_refs`` 5); returns the peak before."""
    before = peak_bytes()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return before


def run_child(spec: dict[str, Any], cap_bytes: int | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run one measurement (``spec``) in a fresh Python process, under an address-space cap when given; returns
    its JSON result, or ``{"failed": ...}`` with the reason (``at_cap`` when it ran out of the capped memory)."""

    def limit() -> None:
        if cap_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s", "at_cap": False}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = proc.stderr.strip().splitlines()
    last = err[-1] if err else f"exit status {proc.returncode}"
    oom = any(s in proc.stderr for s in ("can't allocate memory", "MemoryError", "std::bad_alloc", "out of memory"))
    return {"failed": last[:300], "at_cap": bool(cap_bytes) and (oom or proc.returncode == -9)}


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(s: dict[str, float], unit: str = "", digits: int = 2) -> str:
    """``median [min-max]`` text."""
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def rounded(d: dict[str, float], digits: int = 4) -> dict[str, float]:
    """``d`` with each value rounded to ``digits`` decimals (for the JSON line)."""
    return {k: round(v, digits) for k, v in d.items()}


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


# ------------------------------------------------------------------------------------------------------ trl


def save_model_folder(folder: Path, seed: int = 0, shape: str | None = None) -> None:
    """The ``arith-grpo`` recipe's tiny model (at a named real ``shape``, random weights, if given) and character
    tokenizer, saved as a transformers model folder."""
    from pickaxe.models.lm import no_progress_bars

    cfg = LLM_RECIPES["arith-grpo"].make()
    cfg.model.shape = shape
    model, tok = build_model(cfg, torch.device("cpu"), seed)
    with no_progress_bars():  # off while saving, as they were afterwards (a test calls this in its own process)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)


def save_prompt_stream(path: Path, n: int, seed: int = 0) -> None:
    """``n`` training prompts of the ``arith-grpo`` task, in the order both learners consume them."""
    cfg = LLM_RECIPES["arith-grpo"].make()
    env = build_env(cfg, seed, seed)
    rows = [{"prompt": ex.prompt, "answer": ex.answer, "metadata": ex.metadata} for ex in env.sample(n)]
    path.write_text(json.dumps(rows))


class StreamEnv:
    """A fixed prompt stream (both learners see the same prompts in the same order), scored by the task."""

    def __init__(self, path: str) -> None:
        from pickaxe.envs.text.example import Example

        cfg = LLM_RECIPES["arith-grpo"].make()
        self.scorer = build_env(cfg, 0, 0)
        self.examples = [Example(**row) for row in json.loads(Path(path).read_text())]
        self.next = 0

    def sample(self, n: int) -> list[Any]:
        """The next ``n`` prompts."""
        out = self.examples[self.next : self.next + n]
        self.next += n
        return out

    def score(self, example: Any, text: str) -> tuple[float, dict[str, float]]:
        """The task's reward of ``text`` for ``example``."""
        return self.scorer.score(example, text)

    def __getattr__(self, name: str) -> Any:
        """Everything else (batched scoring, reward names and weights) is the task's own."""
        if name == "scorer":  # not set yet (e.g. while unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.scorer, name)


ROW_KEYS = ("step", "generate", "reward", "ref", "update", "cpu", "faults", "tokens")
"""Per-step figures of a GRPO child: wall seconds (step and its split), CPU seconds, minor page faults, tokens."""


def cpu_usage() -> tuple[float, int]:
    """CPU seconds (user + system) and minor page faults of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def pickaxe_grpo_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``warmup + steps`` pickaxe GRPO steps from the model folder; per-step times, split, tokens and peak RSS."""
    from pickaxe.models.lm import load_lm
    from pickaxe.models.tokenizer import load_tokenizer
    from pickaxe.train.runtime import settle_for_training

    torch.manual_seed(spec["seed"])
    model, tok = load_lm(spec["folder"], "cpu"), load_tokenizer(spec["folder"])
    reference = load_lm(spec["folder"], "cpu").eval().requires_grad_(False)
    n = spec["prompts"] * spec["group"]
    cfg = GRPOConfig(
        lr=spec["lr"],
        micro_batch_size=n,
        kl_coef=spec["beta"],
        kl_estimator="k3",
        aggregation="token-mean",
        gradient_checkpointing=spec["gc"],
    )
    sampling = SamplingParams(spec["new"], temperature=1.0, top_k=0, top_p=1.0, n=spec["group"])
    algo = GRPO(model, cfg, sampling, seed=spec["seed"])
    engine = HFEngine(model, tok.eos_token_id, tok.pad_token_id, max_batch=512, seed=spec["seed"])
    env = StreamEnv(spec["stream"])
    collector = TextCollector(env, engine, tok, spec["prompts"], sampling, model, reference, lambda: algo.version)  # type: ignore[arg-type]
    settle_for_training()  # what build_llm_trainer does once the models are built
    rows: dict[str, list[float]] = {k: [] for k in ROW_KEYS}
    life_peak = 0
    for i in range(spec["warmup"] + spec["steps"]):
        if i == spec["warmup"]:
            life_peak = reset_peak()
            base = rss_bytes()
        t0, u0 = time.perf_counter(), cpu_usage()
        batch = collector.collect()
        t1 = time.perf_counter()
        algo.update(batch)
        t2, u2 = time.perf_counter(), cpu_usage()
        if i < spec["warmup"]:
            continue
        m = collector.metrics()
        rows["step"].append(t2 - t0)
        rows["cpu"].append(u2[0] - u0[0])
        rows["faults"].append(u2[1] - u0[1])
        rows["generate"].append(m["time/generate_s"])
        rows["reward"].append(m["time/reward_s"])
        rows["ref"].append(m["time/ref_logprob_s"])
        rows["update"].append(t2 - t1)
        rows["tokens"].append(float(batch["loss_mask"].sum()))
    peak = peak_bytes()
    return {"rows": rows, "peak": max(peak, life_peak), "rise": peak - base, "base": base}


def trl_grpo_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``warmup + steps`` steps of TRL's ``GRPOTrainer`` configured like ``pickaxe_grpo_child``; per-step times, the
    split from timers wrapped around its methods, tokens and peak RSS."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from pickaxe.models.tokenizer import load_tokenizer

    torch.manual_seed(spec["seed"])
    env = StreamEnv(spec["stream"])
    n = spec["prompts"] * spec["group"]
    total = spec["warmup"] + spec["steps"]
    dataset = Dataset.from_list([{"prompt": ex.prompt, "idx": i} for i, ex in enumerate(env.examples)])

    def exact_match(prompts: list[str], completions: list[str], idx: list[int], **kwargs: Any) -> list[float]:
        return [env.score(env.examples[i], c)[0] for i, c in zip(idx, completions, strict=True)]

    args = TRLConfig(
        output_dir=spec["out"],
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=spec["group"],
        max_completion_length=spec["new"],
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=spec["beta"],
        loss_type="dapo",  # token-mean over the step's completion tokens
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=total,
        gradient_checkpointing=spec["gc"],
        bf16=False,
        use_cpu=True,
        shuffle_dataset=False,
        seed=spec["seed"],
        report_to="none",
        logging_steps=total + 1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )
    trainer = GRPOTrainer(
        model=spec["folder"],
        reward_funcs=exact_match,
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(spec["folder"]),
    )
    phase: dict[str, float] = {"generate": 0.0, "reward": 0.0, "ref": 0.0, "prep": 0.0, "tokens": 0.0}

    def timed(name: str, fn: Any, only_no_grad: bool = False) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            if only_no_grad and torch.is_grad_enabled():
                return fn(*a, **kw)
            t = time.perf_counter()
            out = fn(*a, **kw)
            phase[name] += time.perf_counter() - t
            if name == "generate":
                phase["tokens"] += sum(len(c) for c in out[1])
            return out

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed("ref", trainer._get_per_token_logps_and_entropies, True)
    trainer._generate_and_score_completions = timed("prep", trainer._generate_and_score_completions)
    rows: dict[str, list[float]] = {k: [] for k in ROW_KEYS}
    marks: dict[str, Any] = {"life_peak": 0, "base": 0}

    class Timer(TrainerCallback):
        """Per-step wall time (generation, scoring, reference log-probs, forward, backward, optimizer step)."""

        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == spec["warmup"]:
                marks["life_peak"], marks["base"] = reset_peak(), rss_bytes()
            for k in phase:
                phase[k] = 0.0
            marks["t0"], marks["u0"] = time.perf_counter(), cpu_usage()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            step, usage = time.perf_counter() - marks["t0"], cpu_usage()
            if state.global_step <= spec["warmup"]:  # global_step already counts this step
                return
            rows["step"].append(step)
            rows["cpu"].append(usage[0] - marks["u0"][0])
            rows["faults"].append(usage[1] - marks["u0"][1])
            for k in ("generate", "reward", "ref", "tokens"):
                rows[k].append(phase[k])
            rows["update"].append(step - phase["prep"])

    trainer.add_callback(Timer())
    trainer.train()
    peak = peak_bytes()
    return {"rows": rows, "peak": max(peak, marks["life_peak"]), "rise": peak - marks["base"], "base": marks["base"]}


def summarise_run(r: dict[str, Any]) -> dict[str, float]:
    """Medians of one run's per-step rows, tokens/s end to end and memory."""
    rows = r["rows"]
    out = {k: statistics.median(v) for k, v in rows.items() if k != "tokens"}
    out["tokens_per_s"] = sum(rows["tokens"]) / sum(rows["step"])
    out["peak"], out["rise"] = float(r["peak"]), float(r["rise"])
    return out


def report_trl(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved fresh-process pairs of pickaxe and TRL GRPO runs, GC off and on; print and return ratios."""
    import trl

    steps, warmup, pairs = args.trl_steps, args.trl_warmup, args.trl_pairs
    keys = ("step", "cpu", "generate", "reward", "ref", "update", "faults", "tokens_per_s", "peak", "rise")
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        gc: {"pickaxe": [], "trl": []} for gc in ("gc_off", "gc_on")
    }
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pickaxe-bench-") as tmp:
        folder, stream = Path(tmp) / "model", Path(tmp) / "prompts.json"
        save_model_folder(folder, shape=args.trl_shape)
        save_prompt_stream(stream, (warmup + steps) * args.trl_prompts)
        base = {
            "folder": str(folder),
            "stream": str(stream),
            "out": str(Path(tmp) / "trl-out"),
            "prompts": args.trl_prompts,
            "group": 8,
            "new": 5,
            "lr": 1e-4,
            "beta": 0.005,
            "seed": 0,
            "steps": steps,
            "warmup": warmup,
        }
        print(
            f"\n[trl] pickaxe vs TRL {trl.__version__} GRPOTrainer: {args.trl_prompts} prompts x 8, 5 new tokens, "
            f"{warmup} warm-up + {steps} measured steps per fresh process, {pairs} interleaved pairs per pairing"
        )
        for p in range(pairs):
            for gc in ("gc_off", "gc_on") if args.trl_gc == "both" else (f"gc_{args.trl_gc}",):
                for lib in ("pickaxe", "trl"):
                    r = run_child({**base, "kind": "grpo", "lib": lib, "gc": gc == "gc_on"})
                    if "failed" in r:
                        failures.append(f"{lib} {gc} pair {p}: {r['failed']}")
                        print(f"  {lib} {gc} pair {p}: FAILED {r['failed']}")
                        continue
                    s = summarise_run(r)
                    results[gc][lib].append(s)
                    print(
                        f"  pair {p} {gc} {lib:<7} step {s['step']:.3f}s (gen {s['generate']:.3f} ref {s['ref']:.3f} "
                        f"update {s['update']:.3f}) {s['tokens_per_s']:7.0f} tok/s peak {s['peak'] / GIB:.2f}G "
                        f"(+{s['rise'] / GIB:.2f}G in training)",
                        flush=True,
                    )
    summary: dict[str, Any] = {"trl_version": trl.__version__, "pairs": pairs, "steps": steps, "failures": failures}
    for gc, libs in results.items():
        pk, tr = libs["pickaxe"], libs["trl"]
        n = min(len(pk), len(tr))
        if n == 0:
            continue
        # reward is left out: pickaxe's includes decoding each completion, TRL decodes inside its generate
        compared = [k for k in keys if k != "reward"]
        ratios = {k: spread([pk[i][k] / tr[i][k] for i in range(n)]) for k in compared}
        summary[gc] = {
            "pickaxe_over_trl": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in ratios.items()},
            "pickaxe": {
                k: round(statistics.median(r[k] for r in pk) / (GIB if k in ("peak", "rise") else 1), 4) for k in keys
            },
            "trl": {
                k: round(statistics.median(r[k] for r in tr) / (GIB if k in ("peak", "rise") else 1), 4) for k in keys
            },
        }
        print(f"  {gc}: pickaxe / TRL over {n} pairs, median [min-max] (< 1: pickaxe faster or smaller):")
        for k, s in ratios.items():
            print(f"    {k:<13} {fmt_spread(s)}")
        print(
            f"    TRL's step {summary[gc]['trl']['step']:.3f}s = gen {summary[gc]['trl']['generate']:.3f} + ref "
            f"{summary[gc]['trl']['ref']:.3f} + reward {summary[gc]['trl']['reward']:.3f} + update "
            f"{summary[gc]['trl']['update']:.3f} + rest; speed-up pickaxe = {1 / ratios['step']['median']:.2f}x"
        )
    return summary


# ---------------------------------------------------------------------------------------------------- floor


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

        run()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        return statistics.median(times), 3 * 2.0 * m * k * n

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

        run()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        seconds += config.num_hidden_layers * c * statistics.median(times)
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
