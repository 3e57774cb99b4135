"""Preference steps side by side with TRL: pickaxe's DPO and reward-model steps against TRL's ``DPOTrainer`` and
``RewardTrainer`` on the same tiny model, pairs and settings.

Usage: ``python benchmarks/trl_pairs.py [dpo] [rm] [--pairs N] [--steps N] [--batch N] [--quick]`` in an environment
with TRL (the ``bench`` extra, or ``pip install torch==<the project's> trl==1.16.0 -e .``). Torch runs with one
thread; the load average is printed first; the last line is one JSON object with every figure.

Setup, alike for both libraries: the ``arith-grpo`` recipe's tiny Qwen2-style model and character tokenizer saved
once as a model folder (``benchmarks/llm.py``'s ``save_model_folder``); ``--batch`` pairs a step from
``sorting_preferences`` (``sort 4821=``: a 10-character prompt, chosen the sorted digits, rejected an unsorted
permutation, each response + EOS), a fresh batch every step (so DPO's reference scores every pair, in both:
pickaxe's reference cache never hits); one optimizer step per batch, the whole batch in one micro-batch; lr 1e-4
constant, AdamW without weight decay, grad-norm clip 1.0, float32, CPU, gradient checkpointing off.

* ``dpo``: DPO (sigmoid loss, beta 0.1) against a frozen reference loaded from the same folder. pickaxe:
  ``DPO.update``; TRL: ``DPOTrainer`` (reference log-probs computed in the step, as pickaxe's for unseen pairs).
* ``rm``: a Bradley-Terry reward model started from the folder's LM. pickaxe: ``RewardModelTrainer.update`` on
  ``RewardModel.from_lm``; TRL: ``RewardTrainer`` (``AutoModelForSequenceClassification`` with one label).

pickaxe runs twice per pairing: ``shared`` (the default, ``share_prompts``: a pair's responses share one pass over
their prompt) and ``padded`` (``share_prompts=False``). Every measured run is a fresh process (``--warmup``
unmeasured steps, then ``--steps``), runs interleaved (pickaxe shared, pickaxe padded, TRL, ...) for ``--pairs``
rounds; per run the median step time (TRL: from ``on_step_begin`` to ``on_step_end``, the batch already collated;
pickaxe: ``update`` on a packed batch), the step's CPU seconds and the process's peak RSS. Reported: per part and
layout, the median over rounds of pickaxe / TRL for each figure, with min-max.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_common import GIB, cpu_usage, fmt_spread, peak_bytes, reset_peak, rss_bytes, save_model_folder, spread

PARTS = ("dpo", "rm")
LIBS = ("shared", "padded", "trl")
"""The runs of a round: pickaxe with shared prompts, pickaxe padded, TRL."""
QUICK = {"pairs": 1, "steps": 2, "warmup": 1, "batch": 16}
"""``--quick``'s defaults (a smoke run)."""


def run_child(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """One measurement (``spec``) in a fresh Python process; its JSON result, or ``{"failed": reason}``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = proc.stderr.strip().splitlines()
    return {"failed": (err[-1] if err else f"exit status {proc.returncode}")[:300]}


def preference_rows(spec: dict[str, Any]) -> list[dict[str, str]]:
    """The pairs of every step, in the order both libraries consume them."""
    from pickaxe.envs.text.synthetic_preferences import sorting_preferences

    pairs = sorting_preferences((spec["warmup"] + spec["steps"]) * spec["batch"], seed=spec["seed"])
    return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs]


def pickaxe_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``warmup + steps`` pickaxe DPO or reward-model updates; per-step wall and CPU seconds, peak RSS."""
    from pickaxe.algos.configs import DPOConfig, RewardModelConfig
    from pickaxe.algos.dpo import DPO
    from pickaxe.algos.reward_model import RewardModelTrainer
    from pickaxe.envs.text.preferences import PreferencePair
    from pickaxe.models.lm import load_lm
    from pickaxe.models.reward import RewardModel
    from pickaxe.models.tokenizer import load_tokenizer
    from pickaxe.rollout.pairs import pack_pairs
    from pickaxe.train.runtime import settle_for_training

    torch.manual_seed(spec["seed"])
    tok = load_tokenizer(spec["folder"])
    share = spec["lib"] == "shared"
    common = {"lr": spec["lr"], "micro_batch_size": 2 * spec["batch"], "share_prompts": share, "weight_decay": 0.0}
    common["max_grad_norm"] = 1.0
    if spec["part"] == "dpo":
        model = load_lm(spec["folder"], "cpu")
        reference = load_lm(spec["folder"], "cpu")
        algo: Any = DPO(model, DPOConfig(beta=spec["beta"], **common), reference)
    else:
        algo = RewardModelTrainer(RewardModel.from_lm(spec["folder"], device="cpu"), RewardModelConfig(**common))
    assert algo.layout == ("shared-prefix" if share else "padded"), algo.layout
    pairs = [PreferencePair(**row) for row in preference_rows(spec)]
    b = spec["batch"]
    batches = [pack_pairs(pairs[s : s + b], tok, range(s, s + b)) for s in range(0, len(pairs), b)]
    settle_for_training()
    rows: dict[str, list[float]] = {"step": [], "cpu": []}
    life_peak, base = 0, 0
    for i, batch in enumerate(batches):
        if i == spec["warmup"]:
            life_peak, base = reset_peak(), rss_bytes()
        t0, u0 = time.perf_counter(), cpu_usage()
        algo.update(batch)
        t1, u1 = time.perf_counter(), cpu_usage()
        if i >= spec["warmup"]:
            rows["step"].append(t1 - t0)
            rows["cpu"].append(u1[0] - u0[0])
    peak = peak_bytes()
    return {"rows": rows, "peak": max(peak, life_peak), "rise": peak - base}


def trl_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``warmup + steps`` steps of TRL's ``DPOTrainer`` or ``RewardTrainer`` configured like ``pickaxe_child``."""
    from datasets import Dataset
    from transformers import TrainerCallback

    from pickaxe.models.tokenizer import load_tokenizer

    torch.manual_seed(spec["seed"])
    total = spec["warmup"] + spec["steps"]
    dataset = Dataset.from_list(preference_rows(spec))
    common: dict[str, Any] = {
        "output_dir": spec["out"],
        "per_device_train_batch_size": spec["batch"],
        "gradient_accumulation_steps": 1,
        "learning_rate": spec["lr"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "max_steps": total,
        "gradient_checkpointing": False,
        "bf16": False,
        "use_cpu": True,
        "seed": spec["seed"],
        "report_to": "none",
        "logging_steps": total + 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "model_init_kwargs": {"dtype": torch.float32},
    }
    tok = load_tokenizer(spec["folder"])
    if spec["part"] == "dpo":
        from transformers import AutoModelForCausalLM
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, beta=spec["beta"], loss_type=["sigmoid"], max_length=None)
        reference = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=torch.float32)
        trainer: Any = DPOTrainer(
            model=spec["folder"], ref_model=reference, args=args, train_dataset=dataset, processing_class=tok
        )
    else:
        from trl import RewardConfig, RewardTrainer

        args = RewardConfig(**common, max_length=None)
        trainer = RewardTrainer(model=spec["folder"], args=args, train_dataset=dataset, processing_class=tok)
    rows: dict[str, list[float]] = {"step": [], "cpu": []}
    marks: dict[str, Any] = {"life_peak": 0, "base": 0}

    class Timer(TrainerCallback):
        """Per-step wall and CPU time: forward passes, loss, backward and optimizer step."""

        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == spec["warmup"]:
                marks["life_peak"], marks["base"] = reset_peak(), rss_bytes()
            marks["t0"], marks["u0"] = time.perf_counter(), cpu_usage()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            step, usage = time.perf_counter() - marks["t0"], cpu_usage()
            if state.global_step > spec["warmup"]:  # global_step already counts this step
                rows["step"].append(step)
                rows["cpu"].append(usage[0] - marks["u0"][0])

    trainer.add_callback(Timer())
    trainer.train()
    peak = peak_bytes()
    return {"rows": rows, "peak": max(peak, marks["life_peak"]), "rise": peak - marks["base"]}


def summarise(r: dict[str, Any]) -> dict[str, float]:
    """Medians of one run's per-step figures and its memory."""
    out = {k: statistics.median(v) for k, v in r["rows"].items()}
    out["peak"], out["rise"] = float(r["peak"]), float(r["rise"])
    return out


def report(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved fresh-process rounds of pickaxe (shared, padded) and TRL for each part; print and return ratios."""
    import trl

    keys = ("step", "cpu", "peak", "rise")
    summary: dict[str, Any] = {"trl_version": trl.__version__, "rounds": args.pairs, "steps": args.steps}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pickaxe-bench-") as tmp:
        folder = Path(tmp) / "model"
        save_model_folder(folder)
        base = {"folder": str(folder), "out": str(Path(tmp) / "trl-out"), "batch": args.batch, "lr": 1e-4,
                "beta": 0.1, "seed": 0, "steps": args.steps, "warmup": args.warmup}  # fmt: skip
        for part in args.parts:
            name = "DPOTrainer" if part == "dpo" else "RewardTrainer"
            print(
                f"\n[{part}] pickaxe vs TRL {trl.__version__} {name}: {args.batch} pairs a step, {args.warmup} "
                f"warm-up + {args.steps} measured steps per fresh process, {args.pairs} interleaved rounds"
            )
            runs: dict[str, list[dict[str, float]]] = {lib: [] for lib in LIBS}
            for p in range(args.pairs):
                for lib in LIBS:
                    kind = "trl" if lib == "trl" else "pickaxe"
                    r = run_child({**base, "kind": kind, "part": part, "lib": lib})
                    if "failed" in r:
                        failures.append(f"{part} {lib} round {p}: {r['failed']}")
                        print(f"  round {p} {lib}: FAILED {r['failed']}")
                        continue
                    s = summarise(r)
                    runs[lib].append(s)
                    print(f"  round {p} {lib:<6} step {s['step']:.4f}s cpu {s['cpu']:.4f}s peak "
                          f"{s['peak'] / GIB:.3f}G (+{s['rise'] / GIB:.3f}G in training)", flush=True)  # fmt: skip
            part_summary: dict[str, Any] = {
                lib: {k: round(statistics.median(r[k] for r in rs) / (GIB if k in ("peak", "rise") else 1), 4)
                      for k in keys} for lib, rs in runs.items() if rs
            }  # fmt: skip
            for lib in ("shared", "padded"):
                n = min(len(runs[lib]), len(runs["trl"]))
                if n == 0:
                    continue
                ratios = {k: spread([runs[lib][i][k] / runs["trl"][i][k] for i in range(n)]) for k in keys}
                rounded = {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in ratios.items()}
                part_summary[f"{lib}_over_trl"] = rounded
                print(f"  pickaxe {lib} / TRL over {n} rounds, median [min-max] (< 1: pickaxe faster or smaller):")
                for k, s in ratios.items():
                    print(f"    {k:<5} {fmt_spread(s)}")
            summary[part] = part_summary
    summary["failures"] = failures
    return summary


def child_main(spec: dict[str, Any]) -> None:
    """Entry point of a fresh measurement process: run ``spec`` and print its JSON result."""
    torch.set_num_threads(1)
    out = pickaxe_child(spec) if spec["kind"] == "pickaxe" else trl_child(spec)
    print(json.dumps(out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; ``--quick`` shrinks the run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help=f"any of {', '.join(PARTS)} (default: both)")
    parser.add_argument("--quick", action="store_true", help="few small steps (a smoke run)")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved rounds (fresh processes) per part")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--batch", type=int, default=64, help="preference pairs per step")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    args.parts = args.parts or list(PARTS)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the chosen parts, print figures, end with one JSON line."""
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        child_main(json.loads(sys.argv[2]))
        return
    args = parse_args(argv)
    try:
        import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed: pip install -e .[bench] (or trl==1.16.0 beside the project's torch)")
        print(json.dumps({"benchmark": "trl_pairs", "skipped": "trl not installed"}))
        return
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}, one thread; "
          f"parts: {' '.join(args.parts)}{' (quick)' if args.quick else ''}")  # fmt: skip
    summary = {"benchmark": "trl_pairs", "quick": args.quick, "load_avg": [round(x, 2) for x in load]}
    summary.update(report(args))
    summary["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
