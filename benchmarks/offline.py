"""Offline RL on datasets made from pickaxe's own runs: every offline recipe on expert, medium and random datasets
of CartPole-v1, Pendulum-v1, Hopper-v5 and HalfCheetah-v5, over seeds; the figures of docs/offline.md.

For each env: the source run (``cartpole-ppo`` / ``pendulum-sac``, seed 0, trained until it reaches its target;
``hopper-ppo`` for 300,000 env steps and ``halfcheetah-sac`` for its 100,000, the source runs the ``hopper-*`` and
``halfcheetah-*`` recipes make their datasets from), then three datasets of it with ``pickaxe collect``: expert (its
final policy, deterministic), medium (CartPole: ``--epsilon 0.5``; the Box envs: ``--noise 0.5``) and random
(``--epsilon 1``). Each offline recipe (``cartpole-bc``, ``cartpole-iql``, ``cartpole-cql``, ``cartpole-bcq``,
``cartpole-crr``; ``pendulum-bc``, ``pendulum-td3-bc``, ``pendulum-iql``, ``pendulum-cql``, ``pendulum-crr``;
``hopper-iql``, ``hopper-td3-bc``, ``halfcheetah-iql``, ``halfcheetah-td3-bc``) trains on each dataset with its recipe
budget (CartPole and Pendulum: 2,000 gradient steps of 256 transitions; Hopper and HalfCheetah: 10,000) for each
seed; recorded: the final evaluation (CartPole, Pendulum: 10 deterministic episodes; Hopper, HalfCheetah: 5) and its
normalised score against the references ``collect`` stored, with each run's wall and process CPU seconds.

Usage::

    python benchmarks/offline.py --out /tmp/offline-bench --seeds 3
    python benchmarks/offline.py --envs cartpole --seeds 1      # a quick look
    python benchmarks/offline.py --algos bcq,crr --seeds 3       # some algorithms only
    python benchmarks/offline.py --envs hopper,halfcheetah --datasets medium --seeds 3   # the MuJoCo recipes

The last line printed is one JSON object with every run's figures; a markdown table is printed before it. The
default ``--envs`` is CartPole and Pendulum: the MuJoCo source runs take tens of minutes of CPU each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.recipes import get_recipe
from pickaxe.recipes.datasets import DATASET_SOURCES
from pickaxe.runs.run import read_metrics


def _env(name: str, env_id: str, algos: list[str]) -> dict[str, Any]:
    """An env's entry: the source recipe and per dataset kind its ``pickaxe collect`` flags, both from
    ``recipes/datasets.py``'s ``DATASET_SOURCES`` (what the ``{name}-*`` recipes make their datasets from), and the
    source run's env steps from those recipes' ``data.source_steps`` (None: until the source reaches its target)."""
    source = DATASET_SOURCES[env_id]
    datasets = {kind: [a for k, v in flags.items() for a in (f"--{k}", str(v))] for kind, flags in source.kinds.items()}
    steps = get_recipe(f"{name}-{algos[0]}").data.source_steps
    return {"source": source.recipe, "source_steps": steps, "datasets": datasets, "algos": algos}


ENVS: dict[str, dict[str, Any]] = {
    "cartpole": _env("cartpole", "CartPole-v1", ["bc", "iql", "cql", "bcq", "crr"]),
    "pendulum": _env("pendulum", "Pendulum-v1", ["bc", "td3-bc", "iql", "cql", "crr"]),
    "hopper": _env("hopper", "Hopper-v5", ["iql", "td3-bc"]),
    "halfcheetah": _env("halfcheetah", "HalfCheetah-v5", ["iql", "td3-bc"]),
}


def check_exit(code: int, what: str) -> None:
    """Stop the benchmark when a ``pickaxe`` command it ran failed."""
    if code != 0:
        raise SystemExit(f"{what} failed with exit status {code}")


def make_dataset(env: str, dataset: str, out: Path, source_steps: int | None = None) -> Path:
    """The source run of ``env`` and its ``dataset`` (expert, medium or random) under ``out``, both reused when
    present; ``source_steps`` sets the source run's env steps (default: the env's ``source_steps``, else the source
    recipe's own budget; a smaller one makes a smoke run's cheap dataset). Every offline benchmark makes its datasets
    here, so they compare on the same data. The source run's wall and CPU seconds go to ``source/timing.json``."""
    spec = ENVS[env]
    source = out / env / "source"
    if not (source / "model.safetensors").exists():
        steps = source_steps or spec.get("source_steps")
        budget = ["--trainer.total-steps", str(steps)] if steps else []
        args = ["train", spec["source"], *budget, "--run-dir", str(source), "--no-progress", "--overwrite"]
        wall, cpu = time.perf_counter(), time.process_time()
        check_exit(main(args), "source")
        timing = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "load": os.getloadavg()}
        (source / "timing.json").write_text(json.dumps(timing))
    path = out / env / f"data-{dataset}"
    if not path.exists():
        check_exit(main(["collect", str(source), *spec["datasets"][dataset], "--out", str(path)]), f"collect {dataset}")
    return path


def source_record(name: str, out: Path) -> dict[str, Any]:
    """The source run of ``name`` under ``out``: its env steps, last evaluation and (when this script trained it) its
    wall and CPU seconds with the load average at its end."""
    source = out / name / "source"
    evals = [r for r in read_metrics(source) if "eval/return_mean" in r]
    timing = source / "timing.json"
    return {
        "env": name,
        "source": ENVS[name]["source"],
        "env_steps": evals[-1].get("step") if evals else None,
        "final_eval_return": evals[-1]["eval/return_mean"] if evals else None,
        **(json.loads(timing.read_text()) if timing.exists() else {}),
    }


def run_env(
    name: str, out: Path, seeds: int, only: set[str] | None = None, datasets: set[str] | None = None
) -> list[dict[str, Any]]:
    """The source run, its datasets (those in ``datasets`` where given) and every offline recipe on each (those in
    ``only`` where given); one record per offline run."""
    spec = ENVS[name]
    rows = []
    for dataset in [d for d in spec["datasets"] if datasets is None or d in datasets]:
        path = make_dataset(name, dataset, out)
        data = read(path)
        behaviour = float(data.episode_returns.mean())
        for algo in [a for a in spec["algos"] if only is None or a in only]:
            for seed in range(seeds):
                run = out / name / f"{algo}-{dataset}-s{seed}"
                start, cpu = time.perf_counter(), time.process_time()
                if not (run / "model.safetensors").exists():
                    args = ["train", f"{name}-{algo}", "--data.dataset", str(path), "--seed", str(seed)]
                    check_exit(main([*args, "--run-dir", str(run), "--no-progress", "--overwrite"]), str(run))
                last = [r for r in read_metrics(run) if "eval/return_mean" in r][-1]
                rows.append(
                    {
                        "env": name,
                        "dataset": dataset,
                        "algo": algo,
                        "seed": seed,
                        "behaviour_return": behaviour,
                        "transitions": len(data),
                        "eval_return": last["eval/return_mean"],
                        "normalized_score": last.get("eval/normalized_score"),
                        "wall_s": time.perf_counter() - start,
                        "cpu_s": time.process_time() - cpu,
                        "load": os.getloadavg(),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per env, dataset and algorithm the median final return and normalised score with their range."""
    lines = [
        "| env | dataset (transitions, behaviour return) | algorithm | final return, median [min, max] | "
        "normalised score, median [min, max] | seeds |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["env"], r["dataset"], r["algo"]) for r in rows}, key=lambda k: (k[0], k[1], k[2]))
    for env, dataset, algo in keys:
        group = [r for r in rows if (r["env"], r["dataset"], r["algo"]) == (env, dataset, algo)]
        ret = [r["eval_return"] for r in group]
        score = [r["normalized_score"] for r in group if r["normalized_score"] is not None]
        first = group[0]
        what = f"{dataset} ({first['transitions']:,}, {first['behaviour_return']:.1f})"
        score_text = f"{statistics.median(score):.1f} [{min(score):.1f}, {max(score):.1f}]" if score else "-"
        lines.append(
            f"| {env} | {what} | {algo} | {statistics.median(ret):.1f} [{min(ret):.1f}, {max(ret):.1f}] | "
            f"{score_text} | {len(group)} |"
        )
    return "\n".join(lines)


def cli() -> None:
    """Parse the options, run, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/offline-bench", help="folder of the runs and datasets (reused)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--envs", default="cartpole,pendulum")
    parser.add_argument("--algos", default=None, help="comma-separated algorithms (default: every one of each env)")
    parser.add_argument("--datasets", default=None, help="comma-separated datasets (default: expert,medium,random)")
    args = parser.parse_args()
    only = set(args.algos.split(",")) if args.algos else None
    datasets = set(args.datasets.split(",")) if args.datasets else None
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    names = args.envs.split(",")
    for name in names:
        rows += run_env(name, out, args.seeds, only, datasets)
    sources = [source_record(name, out) for name in names]
    for record in sources:
        print(json.dumps(record))
    print(table(rows))
    print(json.dumps({"sources": sources, "runs": rows}))


if __name__ == "__main__":
    cli()
