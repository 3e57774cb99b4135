"""A small sweep from Python: two learning rates x N seeds, then the comparison `pickaxe compare` prints.

    python examples/sweep.py [TOTAL_STEPS] [SEEDS]

Each run is an ordinary run folder (resumable with `px.resume`); `pickaxe sweep` does the same through a job queue
with parallel workers and picks up where it stopped.
"""

import sys

import pickaxe as px
from pickaxe.exp.compare import compare

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
root = "runs/example-sweep"
for lr in (3e-3, 3e-4):
    for seed in range(seeds):
        run = px.train(
            "cartpole-ppo",
            f"{root}/lr={lr}-seed={seed}",
            overwrite=True,
            seed=seed,
            algo={"lr": lr},
            trainer={"total_steps": steps, "eval_every": max(steps // 4, 2048), "stop_at_target": False},
        )
        print(f"lr={lr} seed={seed}: final eval return {run.eval_return:.1f}")
result = compare(root, out_dir=f"{root}/compare")  # IQM and mean with 95% CIs, probability of improvement
print(f"best group: {result.best}")
