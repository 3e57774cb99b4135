"""Offline-to-online: IQL and CQL trained offline on a medium dataset, then continued online (``--warm-start.run``)
against the same online recipe from scratch; the figures of docs/offline.md's offline-to-online section.

For each env: the source run and medium dataset of ``benchmarks/offline.py`` (CartPole: ``cartpole-ppo``,
``--epsilon 0.5``; Pendulum: ``pendulum-sac``, ``--noise 0.5``; reused from its ``--out`` folder when there), then for
each algorithm and seed: the offline recipe (``pendulum-iql``, 2,000 gradient steps), its continuation
(``pendulum-iql-online --warm-start.run``, 10,000 env steps, evaluations every 1,000 and at step 0) and the online
recipe from an empty replay (``--algo.learning-starts 1000``). Recorded: each run's evaluations (10 deterministic
episodes).

Usage::

    python benchmarks/offline_online.py --out runs/offline-bench --seeds 3 --envs pendulum
    python benchmarks/offline_online.py --seeds 3 --scratch-seeds 1     # from scratch at seed 0 only

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
from pickaxe.runs.run import read_metrics

sys.path.insert(0, str(Path(__file__).parent))
from offline import check_exit, make_dataset  # the datasets of benchmarks/offline.py

CHECKPOINTS = (0, 1_000, 5_000, 10_000)
"""Env steps whose evaluations the table shows (the first evaluation at or after each)."""


def _train(run: Path, *args: str) -> dict[int, float]:
    """Train ``args`` into ``run`` unless it finished before; its evaluations by env step."""
    if not (run / "model.safetensors").exists():
        check_exit(main(["train", *args, "--run-dir", str(run), "--no-progress", "--overwrite"]), str(run))
    return {int(r["step"]): r["eval/return_mean"] for r in read_metrics(run) if "eval/return_mean" in r}


def run_env(name: str, out: Path, seeds: int, algos: list[str], scratch_seeds: int) -> list[dict[str, Any]]:
    """Source run, medium dataset, then per algorithm and seed the offline run, its continuation and (the first
    ``scratch_seeds`` seeds) the online recipe from scratch; one record per (algorithm, seed, start)."""
    data = make_dataset(name, "medium", out)
    behaviour = float(read(data).episode_returns.mean())
    rows = []
    for algo in algos:
        for seed in range(seeds):
            start = time.perf_counter()
            offline = out / name / f"{algo}-medium-s{seed}"
            offline_evals = _train(offline, f"{name}-{algo}", "--data.dataset", str(data), "--seed", str(seed))
            runs = {
                "warm start": ["--warm-start.run", str(offline)],
                "scratch": ["--algo.learning-starts", "1000"],
            }
            if seed >= scratch_seeds:
                del runs["scratch"]
            for what, flags in runs.items():
                tag = "o2o" if what == "warm start" else "scratch"
                run = out / name / f"{algo}-online-{tag}-s{seed}"
                evals = _train(run, f"{name}-{algo}-online", *flags, "--seed", str(seed))
                rows.append(
                    {
                        "env": name,
                        "algo": algo,
                        "start": what,
                        "seed": seed,
                        "behaviour_return": behaviour,
                        "offline_final": offline_evals[max(offline_evals)],
                        "evals": {str(k): v for k, v in sorted(evals.items())},
                        "wall_s": time.perf_counter() - start,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _at(evals: dict[str, float], step: int) -> float | None:
    """The first evaluation at or after env step ``step`` (evaluations fall on collect boundaries: 1,024, 2,016...)."""
    if step == 0:
        return evals.get("0")
    later = sorted((int(k), v) for k, v in evals.items() if int(k) >= step)
    return later[0][1] if later else None


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}, {max(values):.1f}]" if values else "-"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per env, algorithm and start the median [min, max] over seeds of the evaluation at each of
    ``CHECKPOINTS`` and of the run's lowest evaluation after step 0 (a dip after the warm start)."""
    head = " | ".join(f"step {s:,}" if s == 0 else f"step ~{s:,}" for s in CHECKPOINTS)
    lines = [
        f"| env | online run | {head} | lowest evaluation after step 0 | seeds |",
        "|---|---|" + "---|" * len(CHECKPOINTS) + "---|---|",
    ]
    keys = sorted({(r["env"], r["algo"], r["start"]) for r in rows}, key=lambda k: (k[0], k[1], k[2] != "scratch"))
    for env, algo, start in keys:
        group = [r for r in rows if (r["env"], r["algo"], r["start"]) == (env, algo, start)]
        cells = [_cell([v for r in group if (v := _at(r["evals"], s)) is not None]) for s in CHECKPOINTS]
        cells.append(_cell([min(v for k, v in r["evals"].items() if k != "0") for r in group]))
        origin = "from scratch" if start == "scratch" else f"warm start from `{env}-{algo}`"
        what = f"`{env}-{algo}-online`, {origin}"
        lines.append(f"| {env} | {what} | {' | '.join(cells)} | {len(group)} |")
    return "\n".join(lines)


def cli() -> None:
    """Parse the options, run, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/offline-bench", help="folder of the runs and datasets (reused)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--envs", default="pendulum,cartpole")
    parser.add_argument("--algos", default="iql,cql")
    parser.add_argument("--scratch-seeds", type=int, default=None, help="seeds of the from-scratch runs (all)")
    args = parser.parse_args()
    out = Path(args.out)
    scratch = args.seeds if args.scratch_seeds is None else args.scratch_seeds
    rows: list[dict[str, Any]] = []
    for name in args.envs.split(","):
        rows += run_env(name, out, args.seeds, args.algos.split(","), scratch)
    print(table(rows))
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    cli()
