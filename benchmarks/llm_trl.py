"""pickaxe's GRPO against TRL's ``GRPOTrainer`` in interleaved fresh-process pairs: the ``trl`` part of ``llm.py``
(see its docstring for the settings both sides share)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from llm_common import (
    GIB,
    cpu_usage,
    fmt_spread,
    peak_bytes,
    reset_peak,
    rss_bytes,
    run_child,
    save_model_folder,
    save_prompt_stream,
    spread,
)

from pickaxe.algos.configs import GRPOConfig
from pickaxe.algos.grpo import GRPO
from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.rollout.engines import HFEngine, SamplingParams
from pickaxe.rollout.text_collector import TextCollector
from pickaxe.train.llm import build_env


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
