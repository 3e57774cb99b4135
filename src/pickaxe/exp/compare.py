"""Compare runs: group them by config (seeds pooled), summarise each group with IQM, mean and stratified
bootstrap CIs, and test which group is better with the probability of improvement.

``pickaxe compare RUN_OR_SWEEP_DIR... [--metric NAME] [--out DIR] [--seed N] [--min-seeds N]`` is
``main_compare``; the library entry point is ``compare``. See ``docs/compare.md`` for what the numbers mean.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tyro
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pickaxe.argparsing import parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import PickaxeError
from pickaxe.eval.stats import (
    iqm,
    mean,
    probability_of_improvement,
    probability_of_improvement_ci,
    stratified_bootstrap_ci,
)
from pickaxe.exp.curves import learning_curve, write_curves

__all__ = [
    "IGNORED_KEYS",
    "Comparison",
    "Estimate",
    "GroupSummary",
    "PairComparison",
    "RunGroup",
    "RunRecord",
    "compare",
    "compare_runs",
    "flatten_config",
    "group_runs",
    "learning_curve",
    "load_runs",
    "main_compare",
    "verdict",
]

DEFAULT_METRIC = "eval/return_mean"

IGNORED_KEYS: frozenset[str] = frozenset(
    {
        "seed",  # pooled: the seeds of a group are its samples
        "device",
        "torch_threads",
        "trainer.log_every",  # logging cadence, not the numbers
        "trainer.save_every",  # checkpoints never change a run's numbers (resume is exact)
        "trainer.keep_last",
        "trainer.keep_best",
        "trainer.save_at_eval",
    }
)
"""Config keys (dotted) that never change what a run learns: runs that differ only in these are pooled."""

MIN_SEEDS = 4
"""Fewest distinct seeds per group for a verdict. With 3 against 3 runs even a complete separation has a
two-sided exact rank-test (Mann-Whitney) p-value of 0.1, while the bootstrap CI of P(A > B) collapses to
[1, 1]; from 4 against 4 a complete separation reaches p = 0.029 < 0.05."""

"""At most this many steps on a group's learning-curve grid."""


# ----------------------------------------------------------------------------------------------- loading


@dataclass
class RunRecord:
    """One run directory: its resolved config and its metric records (``step`` on every record)."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def seed(self) -> Any:
        """The run's seed (``config["seed"]``), or None."""
        return self.config.get("seed")

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of the records where ``metric`` is a finite number, sorted by step.

        Non-finite values (written as ``null``) are left out; if a step was logged twice, the last
        record wins.
        """
        by_step: dict[int, float] = {}
        for r in self.records:
            v = r.get(metric)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                by_step[int(r["step"])] = float(v)
        steps = np.array(sorted(by_step), dtype=np.int64)
        return steps, np.array([by_step[int(s)] for s in steps], dtype=np.float64)

    def metric_names(self) -> set[str]:
        """Every key that appears in the run's records, ``step`` and ``time/*`` excluded."""
        return {k for r in self.records for k in r if k != "step" and not k.startswith("time/")}


def _is_run_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "metrics.jsonl").is_file()


def _read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PickaxeError(f"cannot read {file}: {e}; fix or remove that run directory") from None
    if not isinstance(config, dict):
        raise PickaxeError(f"{file} is not a JSON object; fix or remove that run directory")
    return config


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    file = path / "metrics.jsonl"
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PickaxeError(f"cannot read {file}: {e}; fix or remove that run directory") from None
    while lines and not lines[-1].strip():
        lines.pop()
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break  # the last write of a killed run, torn mid-line
            raise PickaxeError(f"{file} line {i} is not valid JSON ({e.msg}); fix or remove that line") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise PickaxeError(f"{file} line {i} has no integer 'step'; every metrics record needs one")
        records.append(record)
    return records


def _find_run_dirs(root: Path) -> list[Path]:
    if _is_run_dir(root):
        return [root]
    found = {p.parent for p in root.rglob("config.json") if _is_run_dir(p.parent)}
    # a run directory's own subfolders are not separate runs
    return sorted(p for p in found if not any(q in found for q in p.parents))


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Load every run directory (a folder holding ``config.json`` and ``metrics.jsonl``) found at or below
    each of ``paths``, in path order; a run reached twice is loaded once.

    Raises ``PickaxeError`` naming the path when a path does not exist or holds no run directory, and
    naming the file when a ``config.json`` or a ``metrics.jsonl`` line is malformed (a torn last line,
    left by a killed run, is skipped).
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise PickaxeError("no run or sweep directory given; pass at least one")
    runs: list[RunRecord] = []
    seen: set[Path] = set()
    for root in paths:
        if not root.exists():
            raise PickaxeError(f"{root} does not exist; pass a run directory or a sweep directory holding runs")
        if not root.is_dir():
            raise PickaxeError(f"{root} is not a directory; pass a run directory or a sweep directory holding runs")
        dirs = _find_run_dirs(root)
        if not dirs:
            hint = (
                " (it has config.json but no metrics.jsonl: did the run log anything?)"
                if (root / "config.json").is_file()
                else ""
            )
            raise PickaxeError(
                f"no run directories (a folder with config.json and metrics.jsonl) at or below {root}{hint}; "
                "pass a run directory or a sweep directory holding runs"
            )
        for d in dirs:
            key = d.resolve()
            if key in seen:
                continue
            seen.add(key)
            runs.append(RunRecord(path=d, config=_read_config(d), records=_read_metrics(d)))
    return runs


# ---------------------------------------------------------------------------------------------- grouping


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> ``{"algo.lr": 0.001, ...}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


def _format_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


_MISSING = "<unset>"


@dataclass
class RunGroup:
    """Runs whose configs are equal up to ``IGNORED_KEYS`` (seeds pooled).

    ``label`` names the group by the config keys that differ between groups (``algo.lr=0.001``);
    ``varying`` holds those keys and this group's values.
    """

    label: str
    config: dict[str, Any]
    varying: dict[str, Any]
    runs: list[RunRecord] = field(default_factory=list)


def group_runs(runs: Sequence[RunRecord], ignore: Iterable[str] = IGNORED_KEYS) -> list[RunGroup]:
    """Group ``runs`` by flattened config minus ``ignore`` (``seed``, ``device``, ... pool), in order of
    first appearance, and label each group by the dotted keys whose values differ between groups
    (``"algo.lr=0.001, algo.clip=0.1"``). A single group is labelled by its recipe (or ``"all runs"``)."""
    ignored = set(ignore)
    groups: dict[str, RunGroup] = {}
    for run in runs:
        flat = {k: v for k, v in flatten_config(run.config).items() if k not in ignored}
        key = json.dumps(flat, sort_keys=True, default=str)
        if key not in groups:
            groups[key] = RunGroup(label="", config=flat, varying={})
        groups[key].runs.append(run)
    out = list(groups.values())
    order: list[str] = []
    for g in out:
        order += [k for k in g.config if k not in order]
    varying = [
        k for k in order if len({json.dumps(g.config.get(k, _MISSING), sort_keys=True, default=str) for g in out}) > 1
    ]
    for g in out:
        g.varying = {k: g.config.get(k, _MISSING) for k in varying}
        g.label = ", ".join(f"{k}={_format_value(v)}" for k, v in g.varying.items())
    if len(out) == 1:
        out[0].label = str(out[0].config.get("recipe") or "all runs")
    return out


# ------------------------------------------------------------------------------------------- statistics


@dataclass
class Estimate:
    """A point estimate with its bootstrap confidence interval ``(low, high)``."""

    value: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        """``{"value", "low", "high"}``."""
        return {"value": self.value, "low": self.low, "high": self.high}

    def text(self, digits: int = 4) -> str:
        """``"12.3 [10.1, 14.2]"`` with ``digits`` significant digits."""
        return f"{self.value:.{digits}g} [{self.low:.{digits}g}, {self.high:.{digits}g}]"


def _estimate(values: np.ndarray, statistic: Any, reps: int, alpha: float, seed: int) -> Estimate:
    low, high = stratified_bootstrap_ci(values, statistic, reps=reps, alpha=alpha, seed=seed)
    return Estimate(float(statistic(values)), low, high)


@dataclass
class GroupSummary:
    """One group's numbers: ``final`` is each run's last value of the metric, ``best`` its maximum."""

    label: str
    varying: dict[str, Any]
    run_dirs: list[str]
    final_values: list[float]
    best_values: list[float]
    final_steps: list[int]
    final_iqm: Estimate
    final_mean: Estimate
    best_iqm: Estimate
    best_mean: Estimate

    @property
    def n_runs(self) -> int:
        """Runs in the group."""
        return len(self.final_values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "label": self.label,
            "varying": self.varying,
            "n_runs": self.n_runs,
            "run_dirs": self.run_dirs,
            "final": {
                "iqm": self.final_iqm.to_dict(),
                "mean": self.final_mean.to_dict(),
                "values": self.final_values,
                "steps": self.final_steps,
            },
            "best": {"iqm": self.best_iqm.to_dict(), "mean": self.best_mean.to_dict(), "values": self.best_values},
        }


@dataclass
class PairComparison:
    """P(a run of group ``a`` ends better than a run of group ``b``) on the final metric, with its CI.

    ``better`` is the label of the group that is better with confidence ``1 - alpha`` (the CI excludes
    0.5), or None when the data cannot tell.
    """

    a: str
    b: str
    probability: Estimate
    better: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"a": self.a, "b": self.b, "probability_a_better": self.probability.to_dict(), "better": self.better}


@dataclass
class Comparison:
    """The result of ``compare``: per-group summaries, each group against the best one, and the winner.

    ``best`` is the group with the highest IQM of the final metric; ``winner`` is that group if its
    probability of improvement over every other group has a CI above 0.5, else None.
    """

    metric: str
    groups: list[GroupSummary]
    pairs: list[PairComparison]
    best: str
    winner: str | None
    alpha: float
    reps: int
    seed: int
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    min_seeds: int = MIN_SEEDS

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``summary.json`` holds)."""
        return {
            "metric": self.metric,
            "confidence": 1 - self.alpha,
            "bootstrap_reps": self.reps,
            "seed": self.seed,
            "min_seeds": self.min_seeds,
            "best": self.best,
            "winner": self.winner,
            "groups": [g.to_dict() for g in self.groups],
            "comparisons": [p.to_dict() for p in self.pairs],
            "notes": self.notes,
        }


def _metric_error(runs: Sequence[RunRecord], metric: str) -> PickaxeError:
    names = sorted(set().union(*(r.metric_names() for r in runs)))
    close = difflib.get_close_matches(metric, names, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    evals = [n for n in names if n.startswith("eval/")]
    avail = f" (eval metrics logged: {', '.join(evals)})" if evals else " (no run logged an eval/ metric yet)"
    return PickaxeError(f"no run has a finite value of metric {metric!r}{hint}{avail}; choose one with --metric")


def _summarise(
    group: RunGroup, metric: str, reps: int, alpha: float, seed: int
) -> tuple[GroupSummary | None, list[str]]:
    notes: list[str] = []
    finals, bests, steps, dirs = [], [], [], []
    seen: dict[Any, RunRecord] = {}
    for run in group.runs:
        key = json.dumps(run.seed, default=str)
        if key in seen:  # the same config and seed: a repeat of one sample, not another one
            notes.append(
                f"group {group.label}: {run.path} repeats seed {run.seed} of {seen[key].path} with the same config; "
                "counted once (a repeat is not an independent sample)"
            )
            continue
        seen[key] = run
        s, v = run.series(metric)
        if len(v) == 0:
            notes.append(f"{run.path}: no value of {metric} yet, left out")
            continue
        finals.append(float(v[-1]))
        bests.append(float(v.max()))
        steps.append(int(s[-1]))
        dirs.append(str(run.path))
    if not finals:
        return None, notes
    if len(set(steps)) > 1:
        notes.append(f"group {group.label}: runs end at different steps ({min(steps)} to {max(steps)})")
    f, b = np.array(finals), np.array(bests)
    summary = GroupSummary(
        label=group.label,
        varying=group.varying,
        run_dirs=dirs,
        final_values=finals,
        best_values=bests,
        final_steps=steps,
        final_iqm=_estimate(f, iqm, reps, alpha, seed),
        final_mean=_estimate(f, mean, reps, alpha, seed),
        best_iqm=_estimate(b, iqm, reps, alpha, seed),
        best_mean=_estimate(b, mean, reps, alpha, seed),
    )
    return summary, notes


def _pairs(
    groups: list[GroupSummary], best: GroupSummary, reps: int, alpha: float, seed: int, min_seeds: int
) -> list[PairComparison]:
    out = []
    for g in groups:
        if g is best:
            continue
        x, y = np.array(best.final_values), np.array(g.final_values)
        low, high = probability_of_improvement_ci(x, y, reps=reps, alpha=alpha, seed=seed)
        p = Estimate(probability_of_improvement(x, y), low, high)
        better = best.label if low > 0.5 else g.label if high < 0.5 else None
        if min(len(x), len(y)) < min_seeds:  # too few seeds: a bootstrap CI of [1, 1] is no evidence
            better = None
        out.append(PairComparison(a=best.label, b=g.label, probability=p, better=better))
    return out


def compare(
    paths: Sequence[str | Path] | str | Path,
    metric: str = DEFAULT_METRIC,
    out_dir: str | Path | None = None,
    seed: int = 0,
    reps: int = 2000,
    alpha: float = 0.05,
    console: Console | None = None,
    min_seeds: int = MIN_SEEDS,
) -> Comparison:
    """Compare the runs at or below ``paths``, grouped by config with seeds pooled.

    Per group: the final value of ``metric`` (last logged value of each run) and the best value (its
    maximum over the run), each as IQM and mean with ``1 - alpha`` stratified-bootstrap CIs; then the
    probability that the best group (highest final IQM) beats each other group, with a bootstrap CI.
    Prints rich tables on ``console``; with ``out_dir`` also writes ``summary.md``, ``summary.csv``,
    ``summary.json`` and ``curves.png`` (IQM learning curves with CI bands). Higher is assumed better.
    No group is called better or worse unless both groups have ``min_seeds`` distinct seeds (a note says
    how many more are needed); runs repeating a seed of their group with the same config count once.
    Deterministic given ``seed``. User errors raise ``PickaxeError``.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    console = console or Console()
    result, kept_groups = compare_runs(load_runs(paths), metric, seed=seed, reps=reps, alpha=alpha, min_seeds=min_seeds)
    _print(result, console)
    if out_dir is not None:
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            png = write_curves(kept_groups, metric, out / "curves.png", reps, alpha, seed)
            if png is None:
                result.notes.append("curves.png skipped: matplotlib is not installed (pip install matplotlib)")
                console.print(f"[yellow]{escape(result.notes[-1])}[/]")
            md, table = _write_md(result, out / "summary.md"), _write_csv(result, out / "summary.csv")
            result.files = [md, table, _write_json(result, out / "summary.json")] + ([png] if png else [])
        except OSError as e:
            raise PickaxeError(f"cannot write the reports to {out}: {e}; choose another folder with --out") from None
        console.print(escape(f"wrote {', '.join(p.name for p in result.files)} to {out}"))
    return result


def compare_runs(
    runs: Sequence[RunRecord],
    metric: str = DEFAULT_METRIC,
    seed: int = 0,
    reps: int = 2000,
    alpha: float = 0.05,
    min_seeds: int = MIN_SEEDS,
) -> tuple[Comparison, list[RunGroup]]:
    """The numbers of :func:`compare` for runs already loaded, printing and writing nothing (``pickaxe ui`` shows
    them): the ``Comparison`` and the groups that have a value of ``metric``, in the same order as its
    ``groups``. Raises ``PickaxeError`` when no run has a finite value of ``metric``."""
    groups = group_runs(runs)
    summaries: list[GroupSummary] = []
    kept_groups: list[RunGroup] = []
    notes: list[str] = []
    for g in groups:
        s, n = _summarise(g, metric, reps, alpha, seed)
        notes += n
        if s is not None:
            summaries.append(s)
            kept_groups.append(g)
    if not summaries:
        raise _metric_error(runs, metric)
    if min_seeds < 1:
        raise PickaxeError(f"--min-seeds must be >= 1, got {min_seeds}")
    short = [s for s in summaries if s.n_runs < min_seeds]
    if len(summaries) > 1 and short:
        notes.append(
            f"no verdicts: a verdict needs at least {min_seeds} seeds per group and "
            + ", ".join(f"{s.label} has {s.n_runs}" for s in short)
            + f"; run {min_seeds - min(s.n_runs for s in short)} more seed(s) (--seeds {min_seeds} in a sweep)"
        )
    best = max(summaries, key=lambda s: (s.final_iqm.value, s.final_mean.value))
    pairs = _pairs(summaries, best, reps, alpha, seed, min_seeds)
    winner = best.label if pairs and all(p.better == best.label for p in pairs) else None
    result = Comparison(metric, summaries, pairs, best.label, winner, alpha, reps, seed, notes, min_seeds=min_seeds)
    return result, kept_groups


# --------------------------------------------------------------------------------------------- reporting


def verdict(result: Comparison) -> str:
    """The one-line verdict ``pickaxe compare`` prints last."""
    return _verdict(result)


def _verdict(result: Comparison) -> str:
    conf = f"{1 - result.alpha:.0%}"
    if len(result.groups) == 1:
        return f"one group only ({result.best}); nothing to compare"
    if result.winner is not None:
        return f"{result.winner} is better than every other group ({conf} CI of P(improvement) above 0.5)"
    short = [g for g in result.groups if g.n_runs < result.min_seeds]
    if short:
        need = result.min_seeds - min(g.n_runs for g in short)
        return (
            f"no verdict: {len(short)} group(s) have fewer than the {result.min_seeds} seeds a verdict needs "
            f"(run {need} more); best IQM so far: {result.best}"
        )
    return f"no group is better than all others with {conf} confidence; best IQM: {result.best}"


def _print(result: Comparison, console: Console) -> None:
    conf = f"{1 - result.alpha:.0%}"
    title = f"{escape(result.metric)}: IQM and mean over seeds \\[{conf} stratified-bootstrap CI]"
    table = Table(title=title, box=SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    stats = ("final_iqm", "final_mean", "best_iqm", "best_mean")
    cells = {
        g.label: [f"{e.value:.3g}\n[{e.low:.3g}, {e.high:.3g}]" for e in (getattr(g, s) for s in stats)]
        for g in result.groups
    }
    table.add_column("group", overflow="fold")
    table.add_column("runs", justify="right")
    for j, col in enumerate(("final IQM", "final mean", "best IQM", "best mean")):
        widest = max(len(line) for row in cells.values() for line in row[j].splitlines())
        table.add_column(col, justify="right", min_width=max(widest, len(col)))
    for g in result.groups:
        name = f"[bold]{escape(g.label)}[/] *" if g.label == result.best else escape(g.label)
        table.add_row(name, str(g.n_runs), *(escape(c) for c in cells[g.label]))
    console.print(table)
    if result.pairs:
        pt = Table(title=f"P(a run of A ends above a run of B) \\[{conf} bootstrap CI]", box=SIMPLE_HEAD)
        for col in ("A", "B", "P(A > B)", "better"):
            pt.add_column(col, overflow="fold", no_wrap=col == "P(A > B)")
        for p in result.pairs:
            pt.add_row(escape(p.a), escape(p.b), escape(p.probability.text(3)), escape(p.better or "can't tell"))
        console.print(pt)
    for note in result.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    console.print(escape(_verdict(result)))


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _write_md(result: Comparison, path: Path) -> Path:
    conf = f"{1 - result.alpha:.0%}"
    lines = [
        f"# Comparison: `{result.metric}`",
        "",
        f"IQM and mean over seeds with {conf} stratified-bootstrap CIs ({result.reps} resamples, seed "
        f"{result.seed}). *final*: each run's last value; *best*: each run's maximum. `*` marks the best group.",
        "",
        "| group | runs | final IQM | final mean | best IQM | best mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g in result.groups:
        star = " *" if g.label == result.best else ""
        lines.append(
            f"| {_md_escape(g.label)}{star} | {g.n_runs} | {g.final_iqm.text()} | {g.final_mean.text()} "
            f"| {g.best_iqm.text()} | {g.best_mean.text()} |"
        )
    if result.pairs:
        lines += ["", f"## Probability of improvement (final metric, {conf} CI)", ""]
        lines += ["| A | B | P(A > B) | better |", "|---|---|---:|---|"]
        for p in result.pairs:
            lines.append(
                f"| {_md_escape(p.a)} | {_md_escape(p.b)} | {p.probability.text(3)} "
                f"| {_md_escape(p.better or 'cannot tell')} |"
            )
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes]
    lines += ["", f"**Verdict:** {_verdict(result)}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _write_csv(result: Comparison, path: Path) -> Path:
    keys = list(dict.fromkeys(k for g in result.groups for k in g.varying))
    stats = ("final_iqm", "final_mean", "best_iqm", "best_mean")
    header = ["group", *keys, "n_runs"] + [f"{s}{suffix}" for s in stats for suffix in ("", "_low", "_high")]
    header += ["p_best_better", "p_best_better_low", "p_best_better_high", "is_best", "is_winner"]
    pairs = {p.b: p for p in result.pairs}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for g in result.groups:
            row: list[Any] = [g.label, *(_format_value(g.varying.get(k)) for k in keys), g.n_runs]
            for s in stats:
                e: Estimate = getattr(g, s)
                row += [e.value, e.low, e.high]
            p = pairs.get(g.label)
            row += [p.probability.value, p.probability.low, p.probability.high] if p else ["", "", ""]
            row += [g.label == result.best, g.label == result.winner]
            w.writerow(row)
    return path


def _write_json(result: Comparison, path: Path) -> Path:
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------------- CLI


@dataclass
class CompareArgs:
    """Group runs by config (seeds pooled), report IQM and mean with 95% stratified-bootstrap CIs and the
    probability of improvement, and write summary.md, summary.csv, summary.json and curves.png."""

    paths: tyro.conf.Positional[tuple[str, ...]]
    """Run folders and folders holding runs (sweeps), searched at any depth."""
    metric: str = DEFAULT_METRIC
    """Metric to compare (higher is better)."""
    out: str = "compare"
    """Folder for the reports (relative to the current folder)."""
    seed: int = 0
    """Bootstrap seed."""
    min_seeds: int = ranged(MIN_SEEDS, ge=1)
    """Fewest distinct seeds per group before any group is called better or worse."""


def main_compare(argv: Sequence[str]) -> int:
    """``pickaxe compare``: parse ``argv`` (the words after ``compare``), run ``compare``, return 0.

    ``-h``/``--help`` prints the usage. User errors raise ``PickaxeError`` (one line naming the fix).
    """
    argv = list(argv)
    if not wants_help(argv) and not [a for a in argv if not a.startswith("-")]:
        raise PickaxeError("pickaxe compare needs at least one run or sweep directory (pickaxe compare --help)")
    args = parse(CompareArgs, argv, "pickaxe compare")
    compare(list(args.paths), metric=args.metric, out_dir=Path(args.out), seed=args.seed, min_seeds=args.min_seeds)
    return 0
