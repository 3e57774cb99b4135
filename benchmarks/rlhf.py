"""RLHF on the synthetic task: held-out gold score against KL to the SFT policy for PPO, RLOO, DPO and best-of-n.

Usage: ``python benchmarks/rlhf.py [--seeds 3] [--root runs/rlhf-bench] [--plot FILE] [--kl 0.5,1,2,4]``.

For each seed it runs ``pickaxe pipeline rlhf-synthetic --seed S`` into ``ROOT/seed-S`` (a finished pipeline is
kept, so rerunning only analyses), then reads every stage's evaluations: the sampled held-out gold score
(``eval/sampled/gold``, completions at temperature 1) and the KL of the policy to its reference estimated on the
same samples (``eval/kl``); best-of-n's points are the gold of its picks at the bound ``log n - (n - 1)/n``.
Prints, per method, the gain in gold over the run's starting (SFT) policy at matched KL (linear interpolation
inside each run's measured KL range, never extrapolated; mean and min-max over seeds), the peak gold and the KL
where it peaks, the final gold, KL and proxy, and each pipeline's wall time. Writes a plot of the gold gain against
KL (one line per method and seed) when matplotlib is installed. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.runs.tracking import read_metrics

METHODS = {"ppo": "PPO", "rloo": "RLOO", "dpo": "DPO", "bon": "best-of-n"}


def curve(stage_dir: Path, method: str) -> list[tuple[float, float, float]]:
    """``(kl, gold, proxy)`` of every evaluation of one stage, in step order (best-of-n: one point per n)."""
    if not (stage_dir / "metrics.jsonl").is_file():
        return []
    points = []
    for r in read_metrics(stage_dir):
        if "eval/kl" not in r:
            continue
        gold = r.get("eval/reward/gold") if method == "bon" else r.get("eval/sampled/gold")
        proxy = r.get("eval/reward/proxy") if method == "bon" else r.get("eval/sampled/proxy")
        if gold is not None:
            points.append((float(r["eval/kl"]), float(gold), float(proxy) if proxy is not None else float("nan")))
    return points


def gold_at(points: list[tuple[float, float, float]], kl: float) -> float | None:
    """Gold interpolated at ``kl`` over the points sorted by KL (None outside the measured KL range)."""
    points = sorted(points)
    if not points or kl < points[0][0] or kl > points[-1][0]:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return float(np.interp(kl, xs, ys))


def run_pipelines(root: Path, seeds: int) -> dict[int, float]:
    """Run (or continue) the pipeline of each seed; wall seconds per seed (0 for one already finished)."""
    walls = {}
    for s in range(seeds):
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "pickaxe.cli", "pipeline", "rlhf-synthetic", "--seed", str(s),
               "--pipeline-dir", str(root / f"seed-{s}"), "--workers", str(os.cpu_count() or 1)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pipeline of seed {s} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        walls[s] = time.perf_counter() - start
    return walls


def summarize(roots: list[Path], kls: list[float]) -> dict[str, Any]:
    """Matched-KL gold, peaks and proxy per method over the pipelines in ``roots``."""
    out: dict[str, Any] = {}
    for method in METHODS:
        curves = [c for c in (curve(r / method, method) for r in roots) if c]
        if not curves:
            continue
        matched = {}
        for kl in kls:
            # the gain over the run's own starting point (the SFT policy), so seeds with a stronger SFT compare
            values = [v - c[0][1] for c, v in ((c, gold_at(c, kl)) for c in curves) if v is not None]
            if values:
                matched[str(kl)] = {"mean": float(np.mean(values)), "min": min(values), "max": max(values),
                                    "runs": len(values)}  # fmt: skip
        peaks = [max(c, key=lambda p: p[1]) for c in curves]
        finals = [c[-1] for c in curves]
        out[method] = {
            "matched_gold": matched,
            "start_gold": [c[0][1] for c in curves],
            "peak_gold": [p[1] for p in peaks],
            "peak_kl": [p[0] for p in peaks],
            "final_kl": [f[0] for f in finals],
            "final_gold": [f[1] for f in finals],
            "final_proxy": [f[2] for f in finals],
            "curves": curves,
        }
    return out


def plot(summary: dict[str, Any], path: Path) -> bool:
    """Gold against KL, one line per method and seed; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (method, data) in enumerate(summary.items()):
        for j, c in enumerate(data["curves"]):
            ax.plot([p[0] for p in c], [p[1] - c[0][1] for p in c], marker="o", ms=3, color=f"C{i}",
                    label=METHODS[method] if j == 0 else None, alpha=0.8)  # fmt: skip
    ax.set_xscale("symlog", linthresh=0.5)
    ax.set_xlabel("KL(policy || SFT policy), nats per completion")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_ylabel("held-out gold gain over the SFT policy")
    ax.set_title("synthetic RLHF: gold vs KL (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> None:
    """Run the pipelines, print the tables, write the plot, end with one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--root", default="runs/rlhf-bench")
    ap.add_argument("--plot", default=None, help="PNG to write (default ROOT/gold_vs_kl.png)")
    ap.add_argument("--kl", default="0.5,1,2,4", help="KL values to compare the methods at")
    ap.add_argument("--analyse-only", action="store_true", help="read existing pipelines; run nothing")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    try:
        kls = [float(k) for k in args.kl.split(",")]
    except ValueError:
        ap.error(f"--kl takes comma-separated numbers, got {args.kl!r}")
    root = Path(args.root)
    print(f"load average: {os.getloadavg()[0]:.1f}", flush=True)
    walls = {} if args.analyse_only else run_pipelines(root, args.seeds)
    roots = [root / f"seed-{s}" for s in range(args.seeds)]
    summary = summarize(roots, kls)
    print(f"\ngold gain over the SFT policy at matched KL (mean [min-max] over seeds; '-': not reached): KL {kls}")
    for method, data in summary.items():
        cells = []
        for kl in kls:
            m = data["matched_gold"].get(str(kl))
            cells.append(f"{m['mean']:.3f} [{m['min']:.3f}-{m['max']:.3f}] n={m['runs']}" if m else "-")
        print(f"  {METHODS[method]:>10}: " + " | ".join(cells))
    print("\nper method: start gold, peak gold @ KL, final gold @ KL (proxy), per seed")
    for method, data in summary.items():
        rows = zip(data["start_gold"], data["peak_gold"], data["peak_kl"], data["final_gold"], data["final_kl"],
                   data["final_proxy"], strict=True)  # fmt: skip
        text = "; ".join(f"{s:.3f} -> peak {p:.3f} @ {pk:.2f} -> {f:.3f} @ {fk:.2f} ({fp:.2f})"
                         for s, p, pk, f, fk, fp in rows)  # fmt: skip
        print(f"  {METHODS[method]:>10}: {text}")
    if walls:
        print(f"\npipeline wall time per seed: {', '.join(f'{w:.0f} s' for w in walls.values())}")
    figure = Path(args.plot) if args.plot else root / "gold_vs_kl.png"
    if plot(summary, figure):
        print(f"plot: {figure}")
    result = {m: {k: v for k, v in d.items() if k != "curves"} for m, d in summary.items()}
    print(json.dumps({"rlhf": result, "pipeline_wall_s": walls, "kl": kls}))


if __name__ == "__main__":
    main()
