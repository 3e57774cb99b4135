"""What ``pickaxe eval --checkpoints`` reports: the :class:`Report`, its files (``RUN/eval/checkpoints.json``,
``.csv`` and one plot per metric) and the table it prints (a row per checkpoint; for a multi-agent run a row for
the team's total and one per agent)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.exp.checkpoint_fqe import FQE_METRIC
from pickaxe.runs.weights import write_json_synced


@dataclass
class Report:
    """What ``pickaxe eval --checkpoints`` found (``to_dict`` is ``checkpoints.json``)."""

    run: str
    kind: str
    settings: dict[str, Any]
    metrics: list[str]
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    alarms: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    plots: dict[str, str] = field(default_factory=dict)
    agreement: dict[str, Any] | None = None
    """With ``--fqe``: Spearman's rank correlation of the online return and the FQE estimate over the checkpoints
    that have both (``metrics``, ``spearman``, ``n``)."""
    cached: int = 0
    """Rows served from the cache (not written to the file)."""

    def to_dict(self) -> dict[str, Any]:
        """The ``checkpoints.json`` document."""
        doc = asdict(self)
        doc.pop("cached")
        return doc


def write_outputs(run_dir: Path, report: Report) -> None:
    """``RUN/eval/checkpoints.json`` and ``.csv`` (each metric's mean and CI per step) and the plots, each file
    written whole or not at all."""
    out = run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    report.plots = plots_of(out / "plots", report)
    write_json_synced(out / "checkpoints.json", report.to_dict())
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        ["step", "source", "sha256", *[f"{m}{s}" for m in report.metrics for s in ("", "_ci_low", "_ci_high")]]
    )
    for row in report.rows:
        cells = []
        for m in report.metrics:
            e = row["metrics"].get(m, {})
            cells += [e.get("mean"), e.get("low"), e.get("high")]
        writer.writerow([row["step"], row["source"], row["sha256"], *["" if c is None else repr(c) for c in cells]])
    tmp = out / ".checkpoints.csv.tmp"
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(out / "checkpoints.csv")


def plot_name(metric: str) -> str:
    """The file name of ``metric``'s plot (``eval/sampled/gold`` -> ``eval_sampled_gold.png``)."""
    return metric.replace("/", "_") + ".png"


def plots_of(folder: Path, report: Report) -> dict[str, str]:
    """One PNG per metric: mean and 95% CI band over steps, the best step starred, alarm steps marked. Skipped
    (empty) without matplotlib; unchanged results keep their plots."""
    content = json.dumps([report.rows, report.best, report.alarms], sort_keys=True).encode()
    stamp = folder / ".digest"
    digest = hashlib.sha256(content).hexdigest()
    names = {m: f"plots/{plot_name(m)}" for m in report.metrics}
    if stamp.is_file() and stamp.read_text() == digest and all((folder.parent / p).is_file() for p in names.values()):
        return names
    try:  # the Agg canvas directly: no pyplot, no global backend switch
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return {}
    folder.mkdir(parents=True, exist_ok=True)
    best = report.best["step"] if report.best else None
    for metric in report.metrics:
        pts = [
            (r["step"], r["metrics"][metric])
            for r in report.rows
            if r["metrics"].get(metric, {}).get("mean") is not None
        ]
        if not pts:
            continue
        steps = np.array([s for s, _ in pts], dtype=np.float64)
        mean = np.array([e["mean"] for _, e in pts], dtype=np.float64)
        low = np.array([np.nan if e["low"] is None else e["low"] for _, e in pts], dtype=np.float64)
        high = np.array([np.nan if e["high"] is None else e["high"] for _, e in pts], dtype=np.float64)
        fig = Figure(figsize=(7, 4), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot(steps, mean, marker="o", label=metric)
        ax.fill_between(steps, low, high, alpha=0.2, linewidth=0, label="95% CI")
        if best is not None and best in set(steps.astype(int).tolist()):
            i = int(np.flatnonzero(steps == best)[0])
            ax.plot([best], [mean[i]], marker="*", markersize=16, color="goldenrod", linestyle="none", label="best")
        for k, alarm in enumerate(report.alarms):
            ax.axvline(alarm["step"], color="crimson", linestyle=":", label="alarm" if k == 0 else None)
        ax.set_xlabel("env steps")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.savefig(folder / plot_name(metric), dpi=100)
    stamp.write_text(digest)
    return names


HEADLINE = (
    "eval/accuracy",
    "eval/pass@1",
    "eval/reward/gold",
    "eval/sampled/gold",
    "eval/sampled/proxy",
    "eval/kl",
    "eval/sampled_length",
    "eval/entropy",
    "eval/return_mean",
    "eval/return_iqm",
    FQE_METRIC,
)
"""The metrics the table shows (the selection metric too); every metric is in the JSON and CSV files."""


def format_report(report: Report) -> str:
    """The table and summary lines ``pickaxe eval --checkpoints`` prints."""
    best = report.best["step"] if report.best else None
    if report.kind == "multiagent":
        header, lines = multiagent_table(report, best)
    else:
        shown = [m for m in HEADLINE if m in report.metrics]
        if report.best and report.best["metric"] not in shown and report.best["metric"] in report.metrics:
            shown.insert(0, report.best["metric"])
        header = ["step", "source", *shown]
        lines = [
            [f"{r['step']}{' *' if r['step'] == best else ''}", r["source"], *(cell(r, m) for m in shown)]
            for r in report.rows
        ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *lines]]
    if report.best:
        out.append(f"best (*) by rule {report.best['rule']}: {report.best['reason']}")
    if report.agreement is not None:
        rho = report.agreement["spearman"]
        a, b = report.agreement["metrics"]
        out.append(
            f"rank agreement of {b} with {a} over {report.agreement['n']} checkpoints: Spearman "
            + ("undefined (a side has no order)" if rho is None else f"{rho:.3f}")
        )
    for a in report.alarms:
        out.append(f"alarm {a['name']} at step {a['step']}: {a['message']}")
    for p in report.pairs:
        more = p["more_samples"]
        unit = "prompts" if report.kind == "llm" else "episodes"
        how = (
            "already separated" if more == 0 else "never (equal means)" if more is None else f"~{more} more {unit} each"
        )
        out.append(
            f"top two by {p['metric']}: step {p['a']} vs {p['b']}, difference {p['difference']:.4g}; to separate: {how}"
        )
    plots = "plots/" if report.plots else "no plots: pip install 'pickaxe[plots]' for them"
    out.append(f"wrote {Path(report.run) / 'eval' / 'checkpoints.json'} (+ .csv, {plots}); {report.cached} of "
               f"{len(report.rows)} from the cache")  # fmt: skip
    return "\n".join(out)


def cell(row: dict[str, Any], metric: str) -> str:
    """A table cell: ``metric``'s mean and CI in ``row``, ``-`` where it has none."""
    e = row["metrics"].get(metric)
    return "-" if not e or e["mean"] is None else fmt(e)


def agent_names(metrics: Sequence[str]) -> list[str]:
    """The agents of a multi-agent run's ``eval/agent/<name>/return_mean`` metrics, in their order in ``metrics``."""
    head, tail = "eval/agent/", "/return_mean"
    return [m[len(head) : -len(tail)] for m in metrics if m.startswith(head) and m.endswith(tail)]


def multiagent_table(report: Report, best: int | None) -> tuple[list[str], list[list[str]]]:
    """A multi-agent run's table: per step one row for the team's total return and one per agent (whatever their
    number), each with its mean and IQM and 95% CIs."""
    header = ["step", "source", "agent", "return_mean", "return_iqm"]
    lines = []
    for r in report.rows:
        lines.append([f"{r['step']}{' *' if r['step'] == best else ''}", r["source"], "total",
                      cell(r, "eval/return_mean"), cell(r, "eval/return_iqm")])  # fmt: skip
        for agent in agent_names(report.metrics):
            prefix = f"eval/agent/{agent}/return"
            lines.append(["", "", agent, cell(r, f"{prefix}_mean"), cell(r, f"{prefix}_iqm")])
    return header, lines


def fmt(e: dict[str, Any]) -> str:
    """``mean [low, high]`` (the mean alone without a CI), 4 significant digits."""
    if e["low"] is None or e["high"] is None:
        return f"{e['mean']:.4g}"
    return f"{e['mean']:.4g} [{e['low']:.4g}, {e['high']:.4g}]"


__all__ = ["Report", "agent_names", "format_report", "plot_name", "write_outputs"]
