"""LLM RL speed: the per-step time breakdown of ``arith-grpo`` and the ``hf`` engine against ``model.generate``.

1. ``step``: the ``arith-grpo`` recipe's collector and GRPO (tiny Qwen2-style model, 32 prompts x 8 completions,
   KL to a frozen reference) for ``--steps`` updates without the SFT warm start; per step, medians of
   generate (engine), reward (scoring), ref (reference log-probs) and update (GRPO, forward + backward + AdamW).
2. ``generate``: generated tokens/s on the same left-padded prompts (``--prompts`` held-out arithmetic prompts,
   ``--new-tokens`` new tokens, temperature 1) of
   * ``hf``: ``HFEngine.generate`` (own KV-cached loop, sampler log-probs included, finished rows dropped);
   * ``generate``: a plain ``model.generate(do_sample=True)`` call over the same batch;
   * ``generate+logprobs``: the same with ``output_scores=True`` and the sampled tokens' log-probs gathered,
     which is what an engine needs.
   EOS is masked out of the tiny model's logits in every loop so all produce exactly ``--new-tokens`` tokens.
   Repeats are interleaved; medians are reported, with the ratio hf / generate(+logprobs).

Usage: ``python benchmarks/llm.py [--steps 8] [--prompts 256] [--new-tokens 16] [--repeats 5]``; the last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

from pickaxe.algos.grpo import GRPO
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import TextCollector, encode_prompts
from pickaxe.train.llm import build_env, build_model, derive_llm_seeds


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


def main() -> None:
    """Run both benchmarks, print figures, end with one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    step = step_breakdown(args.steps)
    print(f"arith-grpo step ({step['completions']:.0f} completions), median seconds:")
    for key in ("generate", "reward", "ref", "update", "total"):
        print(f"  {key:<9} {step[key]:7.3f}  ({100 * step[key] / step['total']:4.1f}%)")
    gen = generation_speed(args.prompts, args.new_tokens, args.repeats)
    print(f"generation, {args.prompts} prompts x {args.new_tokens} new tokens, tokens/s (median of {args.repeats}):")
    for key, value in gen.items():
        print(f"  {key:<18} {value:10,.0f}")
    ratio = gen["hf"] / gen["generate"]
    ratio_lp = gen["hf"] / gen["generate+logprobs"]
    print(f"  hf / generate = {ratio:.2f}; hf / generate+logprobs = {ratio_lp:.2f}")
    summary = {
        "benchmark": "llm",
        "step_s": {k: round(v, 4) for k, v in step.items() if k != "completions"},
        "completions_per_step": step["completions"],
        "gen_tokens_per_s": {k: round(v, 1) for k, v in gen.items()},
        "hf_over_generate": round(ratio, 3),
        "hf_over_generate_logprobs": round(ratio_lp, 3),
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
