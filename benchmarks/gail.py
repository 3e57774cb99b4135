"""GAIL imitating expert datasets made from pickaxe's own runs: ``cartpole-gail`` and ``pendulum-gail`` over seeds;
the figures of docs/offline.md's GAIL section.

For each env the expert dataset is made as ``benchmarks/offline.py`` makes its expert datasets (so with the same
``--out`` both scripts share them): the source run (``cartpole-ppo`` / ``pendulum-sac``, seed 0, trained until it
reaches its target), then ``pickaxe collect`` of its final policy, deterministic (CartPole: 10 episodes; Pendulum:
20). Each GAIL recipe trains on it at its defaults for each seed; recorded: every evaluation (10 deterministic
episodes in the env, whose rewards GAIL never learns from), the final one and its normalised score against the
references ``collect`` stored (the mean return's, which is the mean of the episodes' scores). ``--control`` adds the
same runs with ``--algo.disc-steps 0`` (the discriminator left as initialised: a reward that carries nothing of the
demonstrations), which separates imitation from what the reward form alone gives (``-log(1 - D)`` is positive: on
CartPole, living longer pays by itself). ``--absorbing`` adds AIRL's reward with episode ends as absorbing states
(``--algo.reward airl --algo.absorbing true``) on the expert's demonstrations, and the same on the random dataset
``benchmarks/offline.py`` makes (its control: imitating a random policy must not solve the task).

Usage::

    python benchmarks/gail.py --out /tmp/gail-bench --seeds 3
    python benchmarks/gail.py --envs cartpole --seeds 3 --control --absorbing

The last line printed is one JSON object with every run's figures; a markdown table is printed before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.offline.scores import normalized_score, references
from pickaxe.runs.run import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import ENVS, check_exit, make_dataset  # the expert datasets of benchmarks/offline.py

ABSORBING = ["--algo.reward", "airl", "--algo.absorbing", "true"]
VARIANTS: dict[str, tuple[str, str, list[str]]] = {
    # name: (run folder tag, demonstrations, flags)
    "gail": ("gail", "expert", []),
    "control (disc-steps 0)": ("gail-control", "expert", ["--algo.disc-steps", "0"]),
    "airl + absorbing": ("airl-absorbing", "expert", ABSORBING),
    "airl + absorbing, random demonstrations": ("airl-absorbing-random", "random", ABSORBING),
}
"""Each run of an env: the recipe at its defaults; the control (the discriminator left as initialised); AIRL's
reward with episode ends as absorbing states (Kostrikov et al. 2019), on the expert's demonstrations and, as its
control, on a random policy's (the same algorithm must then imitate the random policy, not solve the task)."""


def run_env(name: str, out: Path, seeds: int, variants: list[str]) -> list[dict[str, Any]]:
    """The source run, its expert dataset and ``{name}-gail`` on it per variant and seed; one record per run."""
    rows = []
    for variant in variants:
        tag, kind, flags = VARIANTS[variant]
        data_dir = make_dataset(name, kind, out)
        data = read(data_dir)
        refs = references(data.metadata)
        for seed in range(seeds):
            run = out / name / f"{tag}-s{seed}"
            start = time.perf_counter()
            if not (run / "model.safetensors").exists():
                args = ["train", f"{name}-gail", "--data.dataset", str(data_dir), "--seed", str(seed), *flags]
                check_exit(main([*args, "--run-dir", str(run), "--no-progress", "--overwrite"]), str(run))
            evals = [r for r in read_metrics(run) if "eval/return_mean" in r]
            rows.append(
                {
                    "env": name,
                    "variant": variant,
                    "seed": seed,
                    "demonstrations": kind,
                    "demo_return": float(data.episode_returns.mean()),
                    "transitions": len(data),
                    "eval_return": evals[-1]["eval/return_mean"],
                    "normalized_score": None
                    if refs is None
                    else float(normalized_score(evals[-1]["eval/return_mean"], *refs)),
                    "env_steps": evals[-1]["step"],
                    "evals": [(r["step"], r["eval/return_mean"]) for r in evals],
                    "wall_s": time.perf_counter() - start,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}, {max(values):,.{digits}f}]"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per env and variant the median final return, normalised score and env steps with their range."""
    lines = [
        "| env | demonstrations (transitions, return) | run | env steps, median [min, max] | final return, median "
        "[min, max] | normalised score, median [min, max] | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for env in ENVS:
        for variant in VARIANTS:
            group = [r for r in rows if (r["env"], r["variant"]) == (env, variant)]
            if not group:
                continue
            first = group[0]
            score = [r["normalized_score"] for r in group if r["normalized_score"] is not None]
            lines.append(
                f"| {env} | {first['demonstrations']}: {first['transitions']:,}, {first['demo_return']:.1f} | "
                f"{variant} | "
                f"{_spread([r['env_steps'] for r in group], 0)} | {_spread([r['eval_return'] for r in group])} | "
                f"{_spread(score) if score else '-'} | {len(group)} |"
            )
    return "\n".join(lines)


def cli() -> None:
    """Parse the options, run, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/offline-bench", help="folder of the runs and datasets (reused)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--envs", default="cartpole,pendulum")
    parser.add_argument("--control", action="store_true", help="also the runs with --algo.disc-steps 0")
    parser.add_argument(
        "--absorbing", action="store_true", help="also AIRL's reward with absorbing states, on expert and random data"
    )
    args = parser.parse_args()
    variants = ["gail"] + (["control (disc-steps 0)"] if args.control else [])
    variants += ["airl + absorbing", "airl + absorbing, random demonstrations"] if args.absorbing else []
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    for name in args.envs.split(","):
        rows += run_env(name, out, args.seeds, variants)
    print(table(rows))
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    cli()
