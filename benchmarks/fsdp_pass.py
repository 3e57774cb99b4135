"""The fixed cost of a sharded pass: CPU seconds of one forward and backward pass of a random-weight causal LM in one
process, and sharded on two gloo learners (``models.sharding.shard_model``, as ``--dist.shard fsdp`` shards the
policy), at several token counts per pass.

Usage: ``python benchmarks/fsdp_pass.py [--shape smollm2-135m] [--tokens 8 1024] [--passes 3] [--quick]``. Each
configuration is fresh processes (one torch thread each), run one after the other. A learner runs a pass of the
given tokens (one sequence, next-token loss) after a warm-up pass and reports its CPU seconds per pass (user and
system, every thread: gloo's included) and its minor page faults per pass. A sharded pass gathers the model's
weights for the forward pass and again for the backward pass and reduces the gradients: a cost per pass, not per
token, which the ratio ``overhead_s`` (a learner's sharded pass minus the one-process pass at the same tokens)
shows; ``--tokens`` at which the overhead is small is how many tokens a pass must train for sharding to be cheap.
The last line is one JSON object with every figure. ``--quick`` (what the benchmark test runs): the tiny-qwen2
shape, 8 and 64 tokens, 1 pass.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

LEARNER = r"""
import gc, json, os, resource, sys, torch
from pickaxe.models.lm import tiny_lm
from pickaxe.models.shapes import get_shape
torch.set_num_threads(1)
shape, tokens, passes, sharded, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
s = get_shape(shape)
model = tiny_lm(s.vocab, s.arch, s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, max_positions=tokens + 1,
                tied=s.tied).train()
if sharded:
    from pickaxe.dist import data_parallel
    from pickaxe.models.sharding import shard_model
    data_parallel.init_from_env()
    shard_model(model)
ids = torch.randint(0, s.vocab, (1, tokens), generator=torch.Generator().manual_seed(0))

def one_pass():
    model(input_ids=ids, labels=ids).loss.backward()

def used():
    t = os.times()
    return t.user + t.system, resource.getrusage(resource.RUSAGE_SELF).ru_minflt

one_pass()
cpu0, faults0 = used()
for _ in range(passes):
    one_pass()
cpu1, faults1 = used()
with open(os.path.join(out, os.environ.get("RANK", "0") + ".json"), "w") as f:  # not stdout: learners interleave
    json.dump({"cpu_s": (cpu1 - cpu0) / passes, "faults": (faults1 - faults0) / passes}, f)
if sharded:  # the sharded model (and the gloo work it holds) freed while the interpreter is alive: left to its
    del model  # finalisation, a gloo thread releasing a tensor then aborts the process (SIGABRT, ~6% of runs)
    gc.collect()
    data_parallel.shutdown()
"""


def run(shape: str, tokens: int, passes: int, sharded: bool) -> list[dict[str, float]]:
    """Each process's figures (one process, or two sharded learners under torchrun), each written to its own file:
    two learners printing to one stdout could interleave their lines."""
    out = tempfile.mkdtemp(prefix="pickaxe-fsdp-pass-")
    args = [shape, str(tokens), str(passes), "1" if sharded else "0", out]
    if sharded:  # torchrun on a free port of this machine, each learner running LEARNER
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
               sys.executable, "-c", LEARNER, *args]  # fmt: skip
    else:
        cmd = [sys.executable, "-c", LEARNER, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            what = "sharded" if sharded else "one"
            said = [line for line in done.stderr.splitlines() if "terminate called" in line or "Error" in line]
            raise SystemExit(f"{what} at {tokens} tokens failed: {' | '.join(said[:5])}\n{done.stderr.strip()[-400:]}")
        figures = [json.loads(path.read_text()) for path in sorted(Path(out).glob("*.json"))]
        if len(figures) != (2 if sharded else 1):
            raise SystemExit(f"{len(figures)} processes reported their figures at {tokens} tokens; expected all")
        return figures
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    """Measure one process and two sharded learners at each token count; print a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 1024])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny-qwen2 shape, 8 and 64 tokens, 1 pass")
    args = parser.parse_args()
    if args.quick:
        args.shape, args.tokens, args.passes = "tiny-qwen2", [8, 64], 1
    if min(args.tokens) < 1 or args.passes < 1:
        parser.error("--tokens and --passes must be 1 or more")
    print(f"load average {os.getloadavg()[0]:.2f}; shape {args.shape}; {args.passes} passes each", flush=True)
    rows: list[dict[str, Any]] = []
    for tokens in args.tokens:
        one = run(args.shape, tokens, args.passes, False)[0]
        learners = run(args.shape, tokens, args.passes, True)
        per_learner = sum(r["cpu_s"] for r in learners) / len(learners)
        row = {
            "tokens": tokens,
            "one_cpu_s": one["cpu_s"],
            "sharded_cpu_s_per_learner": per_learner,
            "overhead_s": per_learner - one["cpu_s"],
            "one_faults": one["faults"],
            "sharded_faults_per_learner": sum(r["faults"] for r in learners) / len(learners),
        }
        rows.append(row)
        print(
            f"{tokens:>6} tokens: one process {one['cpu_s']:.2f} CPU-s a pass, a sharded learner {per_learner:.2f} "
            f"(+{row['overhead_s']:.2f}); minor page faults {one['faults']:.0f} / "
            f"{row['sharded_faults_per_learner']:.0f}",
            flush=True,
        )
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps({"shape": args.shape, "passes": args.passes, "rows": rows, "children_max_rss_kb": usage.ru_maxrss})
    )


if __name__ == "__main__":
    main()
