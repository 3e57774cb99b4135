"""The memory planner's table for docs/distributed.md: what a 7B and a 70B policy need per device for SFT, GRPO and
PPO over 8 learners, unsharded against FSDP (with and without offload). The planner's arithmetic, not a measurement:
nothing here runs a model. Prints a markdown table and, as its last line, one JSON object with the figures.

    python benchmarks/plan_table.py [--device-gib 80] [--shapes qwen2.5-7b,llama-3-70b]
"""

from __future__ import annotations

import argparse
import json

from pickaxe.recipes.args import parse_train
from pickaxe.train.plan import GiB, plan_memory

COMMON = ["--algo.autocast", "bf16", "--algo.gradient-checkpointing", "True", "--algo.micro-batch-size", "4",
          "--engine.max-new-tokens", "1024", "--engine.max-batch", "64", "--dist.learners", "8"]  # fmt: skip
"""float32 weights and AdamW state, bf16 matmuls, checkpointed layers, micro-batches of 4 sequences of 512 prompt +
1024 new tokens, generation in chunks of 64 rows."""
ALGOS = {"SFT": ["arith-sft"], "GRPO": ["arith-grpo"], "PPO": ["synthetic-ppo", "--data.reward-model", "rm"]}
"""The recipes standing for each method (arith-grpo keeps a KL reference; PPO a reference, a reward model of the
policy's shape and a critic)."""
SHARDING = {
    "none": [],
    "fsdp": ["--dist.shard", "fsdp"],
    "fsdp, offload optimizer": ["--dist.shard", "fsdp", "--dist.offload", "optimizer"],
    "fsdp, offload params": ["--dist.shard", "fsdp", "--dist.offload", "params"],
}
GRPO_ONLY = {
    "none, LoRA r 64": ["--model.lora.r", "64"],
    "fsdp, LoRA r 64": ["--model.lora.r", "64", "--dist.shard", "fsdp"],
    "fsdp, bf16 weights": ["--model.dtype", "bfloat16", "--dist.shard", "fsdp"],
    "fsdp, reference on host": ["--dist.shard", "fsdp", "--collector.offload-reference", "True"],
}
"""GRPO's extra rows: LoRA adapters (only they train), bfloat16 weights with bfloat16 AdamW moments, the KL reference
kept in host memory between its scoring passes."""


def main() -> None:
    """Print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-gib", type=float, default=80.0)
    parser.add_argument("--shapes", default="qwen2.5-7b,llama-3-70b")
    args = parser.parse_args()
    rows = []
    print("| model | method | 8 learners | rank 0 device | ranks 1-7 device | host per rank | fits |")
    print("|---|---|---|---:|---:|---:|---|")
    for shape in args.shapes.split(","):
        for algo, recipe in ALGOS.items():
            for sharding, flags in {**SHARDING, **(GRPO_ONLY if algo == "GRPO" else {})}.items():
                cfg, _ = parse_train(recipe[0], [*recipe[1:], "--model.shape", shape, *COMMON, *flags])
                plan = plan_memory(cfg, prompt_tokens=512, device_gib=args.device_gib)
                gib = [round(r.peak("device") / GiB, 1) for r in plan.ranks]
                host = round(max(r.peak("host") for r in plan.ranks) / GiB, 1)
                fits = "yes" if plan.fits() else ("ranks 1-7 only" if gib[1] <= args.device_gib else "no")
                print(f"| {shape} | {algo} | {sharding} | {gib[0]} | {gib[1]} | {host} | {fits} |")
                rows.append({"shape": shape, "algo": algo, "sharding": sharding, "rank0_gib": gib[0],
                             "others_gib": gib[1], "host_gib": host, "fits": plan.fits()})  # fmt: skip
    print(json.dumps({"device_gib": args.device_gib, "rows": rows}))


if __name__ == "__main__":
    main()
