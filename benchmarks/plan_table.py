"""The memory planner's table for docs/distributed.md: what a 7B and a 70B policy need per device for SFT, GRPO and
PPO over 8 learners, unsharded against FSDP (with and without offload). The planner's arithmetic, not a measurement:
nothing here runs a model. Prints a markdown table and, as its last line, one JSON object with the figures.

``--measure`` also checks the planner at a real size on this machine's CPU: one SFT update (2 micro-batches of 4
sequences of 64 prompt + 64 answer tokens) of the random-weight qwen2-0.5b shape, its peak RSS (less the process's
RSS before the model was built) against the plan's weights + gradients + AdamW state + activations (~10 GB of RAM,
about a minute).

    python benchmarks/plan_table.py [--device-gib 80] [--shapes qwen2.5-7b,llama-3-70b] [--measure]
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
    "fsdp, reference whole on rank 0": ["--dist.shard", "fsdp", "--dist.no-shard-reference"],
    "fsdp, reference whole, on host": ["--dist.shard", "fsdp", "--dist.no-shard-reference",
                                       "--collector.offload-reference", "True"],
}  # fmt: skip
"""GRPO's extra rows: LoRA adapters (only they train), bfloat16 weights with bfloat16 AdamW moments, the KL reference
whole on rank 0 (not sharded) and the same kept in host memory between its scoring passes."""
PPO_ONLY = {
    "fsdp, reward model whole on rank 0": ["--dist.shard", "fsdp", "--dist.no-shard-reward-model"],
    "fsdp, offload params, reward model whole": ["--dist.shard", "fsdp", "--dist.offload", "params",
                                                 "--dist.no-shard-reward-model"],
}  # fmt: skip
"""PPO's extra rows: its reward model whole on rank 0 (not sharded, as before it was)."""
EXTRA = {"GRPO": GRPO_ONLY, "PPO": PPO_ONLY}


def measure() -> dict[str, float]:
    """One SFT update of qwen2-0.5b on the CPU: its peak RSS above the starting RSS against the plan's sum."""
    import resource

    import torch

    from pickaxe.algos.sft import SFT
    from pickaxe.data.batch import Batch
    from pickaxe.train.llm import build_model

    torch.set_num_threads(1)
    cfg, _ = parse_train("arith-sft", ["--model.shape", "qwen2-0.5b", "--algo.micro-batch-size", "4",
                                       "--engine.max-new-tokens", "64"])  # fmt: skip
    planned = sum(t.bytes for t in plan_memory(cfg, prompt_tokens=64).ranks[0].terms if t.phase != "generate")
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * 4096
    model, _ = build_model(cfg, torch.device("cpu"), seed=0)
    algo = SFT(model, cfg.algo)
    rows, seq = 8, 128
    mask = torch.zeros(rows, seq)
    mask[:, seq // 2 :] = 1
    ids = torch.randint(3, 90, (rows, seq), generator=torch.Generator().manual_seed(0))
    algo.update(Batch({"input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.long),
                       "loss_mask": mask}, batch_size=[rows]))  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    print(f"qwen2-0.5b SFT update on the CPU: planned {planned / GiB:.2f} GiB, peak RSS {peak / GiB:.2f} GiB above "
          f"the start, ratio {planned / peak:.3f}")  # fmt: skip
    return {"planned_gib": planned / GiB, "peak_rss_gib": peak / GiB, "ratio": planned / peak}


def main() -> None:
    """Print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-gib", type=float, default=80.0)
    parser.add_argument("--shapes", default="qwen2.5-7b,llama-3-70b")
    parser.add_argument("--measure", action="store_true", help="also measure qwen2-0.5b's SFT update (~10 GB RAM)")
    args = parser.parse_args()
    measured = measure() if args.measure else None
    rows = []
    print("| model | method | 8 learners | rank 0 device | ranks 1-7 device | host per rank | fits |")
    print("|---|---|---|---:|---:|---:|---|")
    for shape in args.shapes.split(","):
        for algo, recipe in ALGOS.items():
            for sharding, flags in {**SHARDING, **EXTRA.get(algo, {})}.items():
                cfg, _ = parse_train(recipe[0], [*recipe[1:], "--model.shape", shape, *COMMON, *flags])
                plan = plan_memory(cfg, prompt_tokens=512, device_gib=args.device_gib)
                gib = [round(r.peak("device") / GiB, 1) for r in plan.ranks]
                host = round(max(r.peak("host") for r in plan.ranks) / GiB, 1)
                fits = "yes" if plan.fits() else ("ranks 1-7 only" if gib[1] <= args.device_gib else "no")
                print(f"| {shape} | {algo} | {sharding} | {gib[0]} | {gib[1]} | {host} | {fits} |")
                rows.append({"shape": shape, "algo": algo, "sharding": sharding, "rank0_gib": gib[0],
                             "others_gib": gib[1], "host_gib": host, "fits": plan.fits()})  # fmt: skip
    print(json.dumps({"device_gib": args.device_gib, "rows": rows, "measured": measured}))


if __name__ == "__main__":
    main()
