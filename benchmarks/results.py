"""What pickaxe's classic recipes reach at a short CPU budget: the results table of docs/algorithms.md.

For every classic recipe (``--recipes a,b`` for a subset) and seeds ``0..N-1``, one training run at a short
budget (``--budget RECIPE=STEPS`` overrides the defaults below), each in a fresh Python process and one at a time,
so wall times never overlap. A run is ``pickaxe train RECIPE --seed S --device cpu --trainer.total-steps STEPS
--run-dir DIR --no-progress`` (called in the child process through ``pickaxe.cli.main``); recipes with a target
return keep their stop rule and stop at the first evaluation that reaches it. Before training, the child builds the
same seeded run and evaluates its untrained policy with the recipe's eval settings (the reference row: what the
policy scores before learning). Everything else is read back from the run's ``metrics.jsonl`` and ``status.json``.

Per recipe: env steps to the target (median and per seed; a seed that never reaches it counts as infinitely slow
in the median), the final and the best eval return (median [min-max] over seeds), the untrained policy's eval
return, training wall seconds per run (``fit``'s clock: evaluations and checkpoints included, interpreter start
and env construction excluded), and the full-budget command for GPU users.

Usage::

    python benchmarks/results.py                                  # every classic recipe, 3 seeds (~1 h here)
    python benchmarks/results.py --recipes pendulum-sac,pendulum-td3 --seeds 5
    python benchmarks/results.py --budget hopper-ppo=102400 --write docs/algorithms.md

``--write FILE`` replaces the block between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in FILE with
the table and a line naming the command, the date and the machine; with ``--merge`` it replaces only the rows of
the recipes measured this time, keeps the others and their lines, and adds a line naming the recipes it measured.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"

# Short CPU budgets (env steps): the default table (3 seeds) took 59 min of processes on the shared 2-core machine at
# load average 3-7 (2026-12-02); less with a core to itself (halfcheetah-sac's three seeds took 183-339 s as the load
# varied). halfcheetah-sac, hopper-ppo and pong-dqn are two thirds of it. Recipes with a target keep their own
# budget: they solve well inside it and stop there.
DEFAULT_BUDGETS: dict[str, int] = {  # pong-dqn learns from 20k steps; halfcheetah-sac from 10k
    "cartpole-ppo": 100_000,
    "cartpole-a2c": 100_000,
    "cartpole-dqn": 100_000,
    "cartpole-rainbow": 100_000,
    "memory-recurrent-ppo": 30_000,
    "pendulum-ppo": 65_536,
    "pendulum-sac": 20_000,
    "pendulum-td3": 20_000,
    "pendulum-ddpg": 20_000,
    "halfcheetah-sac": 14_000,
    "hopper-ppo": 40_960,
    "pong-dqn": 20_480,
    "breakout-ppo": 4_096,
    "cartpole-reinforce": 100_000,
    "cartpole-npg": 100_000,
    "cartpole-trpo": 100_000,
    "pendulum-redq": 20_000,
    "cartpole-iqn": 100_000,
    "cartpole-fqf": 100_000,
    "pendulum-bdq": 30_000,
}

# The budget the recipe is meant for, as docs/envs.md gives it (on a GPU for the Atari games and halfcheetah-sac).
FULL_COMMANDS: dict[str, str] = {
    "halfcheetah-sac": "pickaxe train halfcheetah-sac --trainer.total-steps 1000000 --device cuda",
    "hopper-ppo": "pickaxe train hopper-ppo --trainer.total-steps 1000000",  # a 64x64 MLP on 1 env: CPU is fine
    "pong-dqn": (
        "pickaxe train pong-dqn --trainer.total-steps 10000000 --algo.learning-starts 80000 "
        "--algo.buffer-size 100000 --trainer.eval-every 250000 --device cuda"
    ),
    "breakout-ppo": (
        "pickaxe train breakout-ppo --trainer.total-steps 10000000 --trainer.eval-every 250000 --device cuda"
    ),
}

# Mean score of uniformly random play (the usual Atari reference, e.g. the DQN Nature paper's table): a final eval
# median below reference + margin is reported as random level.
RANDOM_PLAY: dict[str, tuple[float, float]] = {"pong-dqn": (-20.7, 2.0), "breakout-ppo": (1.7, 2.0)}


@dataclass
class SeedRecord:
    """One training run, as read back from its run folder."""

    seed: int
    steps: int
    """Env steps trained (the last metrics record)."""
    final_return: float | None
    best_return: float | None
    untrained_return: float | None
    solved_step: int | None
    """First evaluated step whose eval return reached the target; None if none did (or no target)."""
    wall_s: float | None
    """Training wall seconds (``time/elapsed_s`` of the last record)."""
    process_s: float | None = None
    """Wall seconds of the whole child process (interpreter start, untrained eval and construction included;
    None for a run read back with --reuse)."""
    state: str = "finished"
    started: float | None = None
    """Unix time the child process started training (after the untrained eval)."""
    load_average: float | None = None
    """The machine's 1-minute load average then."""


@dataclass
class RecipeResult:
    """Per-recipe summary over seeds."""

    recipe: str
    budget: int
    target: float | None
    full_command: str
    seeds: list[SeedRecord] = field(default_factory=list)


def median_or_inf(values: list[float | None]) -> float:
    """Median where None (not reached) counts as infinitely slow."""
    return statistics.median([math.inf if v is None else float(v) for v in values])


def spread(values: list[float | None]) -> tuple[float, float, float] | None:
    """(median, min, max) of the values that exist; None if there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return statistics.median(present), min(present), max(present)


def _ret(x: float) -> str:
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def fmt_spread(values: list[float | None]) -> str:
    """``median [min-max]`` of eval returns, or ``-``."""
    s = spread(values)
    if s is None:
        return "-"
    med, low, high = s
    return _ret(med) if len(values) == 1 else f"{_ret(med)} [{_ret(low)} to {_ret(high)}]"


def fmt_steps(value: float | None) -> str:
    """Env steps with thousands separators, or ``not reached``."""
    return "not reached" if value is None or math.isinf(value) else f"{int(value):,}"


def fmt_seconds(value: float | None) -> str:
    """Seconds: one decimal below 10 s, whole seconds above."""
    return "-" if value is None else f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def summarize(result: RecipeResult) -> dict[str, Any]:
    """The figures of one recipe (JSON-ready: infinity as None)."""
    seeds = result.seeds
    solved = [r.solved_step for r in seeds]
    med_solved = median_or_inf(solved) if result.target is not None and seeds else None
    walls = [r.wall_s for r in seeds]
    final = spread([r.final_return for r in seeds])
    best = spread([r.best_return for r in seeds])
    untrained = spread([r.untrained_return for r in seeds])
    out: dict[str, Any] = {
        "budget": result.budget,
        "target": result.target,
        "seeds": [r.seed for r in seeds],
        "solved_steps": solved if result.target is not None else None,
        "solved_median": None if med_solved is None or math.isinf(med_solved) else med_solved,
        "reached": sum(s is not None for s in solved) if result.target is not None else None,
        "final_median": final[0] if final else None,
        "final_min": final[1] if final else None,
        "final_max": final[2] if final else None,
        "best_median": best[0] if best else None,
        "best_min": best[1] if best else None,
        "best_max": best[2] if best else None,
        "untrained_median": untrained[0] if untrained else None,
        "wall_s": walls,
        "wall_median_s": statistics.median(timed) if (timed := [w for w in walls if w is not None]) else None,
        "states": [r.state for r in seeds],
        "full_command": result.full_command,
    }
    return out


def note(result: RecipeResult, summary: dict[str, Any]) -> str:
    """Remarks: runs that did not finish, Atari returns at random level."""
    parts = []
    bad = [f"seed {r.seed} {r.state}" for r in result.seeds if r.state != "finished"]
    if bad:
        parts.append(", ".join(bad))
    if result.recipe in RANDOM_PLAY and summary["final_median"] is not None:
        ref, margin = RANDOM_PLAY[result.recipe]
        level = "random level" if summary["final_median"] < ref + margin else "above random level"
        parts.append(f"{level} at this budget (random play ~{ref:g}); learning needs the full budget")
    return "; ".join(parts)


def build_table(results: list[RecipeResult]) -> str:
    """The markdown table, one row per recipe."""
    lines = [
        "| recipe | budget (env steps) | target | env steps to target: median (per seed) "
        "| final eval: median [min to max] | best eval | untrained eval | training wall s: median (per seed) "
        "| full budget | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        s = summarize(result)
        if result.target is None:
            to_target = "no target"
        else:
            per_seed = " / ".join(fmt_steps(v) for v in s["solved_steps"])
            to_target = f"{fmt_steps(s['solved_median'])} ({per_seed}; {s['reached']}/{len(result.seeds)} reached)"
        walls = " / ".join(fmt_seconds(w) for w in s["wall_s"])
        wall = "-" if s["wall_median_s"] is None else f"{fmt_seconds(s['wall_median_s'])} ({walls})"
        lines.append(
            f"| `{result.recipe}` | {result.budget:,} | {'-' if result.target is None else f'{result.target:g}'} "
            f"| {to_target} | {fmt_spread([r.final_return for r in result.seeds])} "
            f"| {fmt_spread([r.best_return for r in result.seeds])} "
            f"| {fmt_spread([r.untrained_return for r in result.seeds])} | {wall} | `{result.full_command}` "
            f"| {note(result, s) or '-'} |"
        )
    return "\n".join(lines)


class MarkerError(ValueError):
    """FILE lacks the results markers."""


def replace_block(text: str, block: str, markers: tuple[str, str] = (BEGIN, END)) -> str:
    """``text`` with everything between the ``markers`` (default: the results markers) replaced by ``block`` (the
    markers stay)."""
    first, last = markers
    begin, end = text.find(first), text.find(last)
    if begin < 0 or end < 0 or end < begin:
        raise MarkerError(
            f"no '{first}' ... '{last}' block; fix: put both markers, in that order, where the table goes"
        )
    return text[: begin + len(first)] + "\n" + block.rstrip("\n") + "\n" + text[end:]


def current_block(text: str) -> str:
    """What lies between the results markers of ``text`` (empty without them)."""
    begin, end = text.find(BEGIN), text.find(END)
    return text[begin + len(BEGIN) : end] if 0 <= begin < end else ""


def merge_block(old: str, table: str, line: str) -> str:
    """``--merge``: the old block's table with the rows of the recipes just measured replaced (new recipes appended
    after the old rows), its "Generated by" lines kept but for a "Rows ...:" line all of whose recipes were measured
    again (it describes no row left), and ``line`` (naming the recipes it measured) added."""
    head = table.splitlines()[:2]
    measured = [t for t in table.splitlines()[2:] if t.startswith("| `")]
    again = {t.split("`")[1] for t in measured}
    rows: dict[str, str] = {}
    notes: list[str] = []
    for text in old.splitlines():
        if text.startswith("| `"):
            rows[text.split("`")[1]] = text
        elif text.startswith("Rows "):
            if not set(text.split(":", 1)[0].split("`")[1::2]) <= again:
                notes.append(text)
        elif text.startswith("Generated by"):
            notes.append(text)
    for text in measured:
        rows[text.split("`")[1]] = text
    names = ", ".join(f"`{t.split('`')[1]}`" for t in measured)
    return "\n".join([*head, *rows.values()]) + "\n\n" + "\n\n".join([*notes, f"Rows {names}: {line}"])


def shown_command(argv: list[str], script: str = "benchmarks/results.py") -> str:
    """The command line of ``script``, less the options that only decide where things are stored or how a table is
    written (--root, --write with their values; --reuse, --merge)."""
    shown, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--root", "--write"):
            skip = True
        elif a not in ("--reuse", "--merge") and not a.startswith(("--root=", "--write=")):
            shown.append(a)
    return shlex.join(["python", script, *shown])


def machine_line(argv: list[str], threads: int, results: list[RecipeResult]) -> str:
    """The command, when the runs were measured and on what machine (nproc, load average, torch threads)."""
    runs = [r for result in results for r in result.seeds if r.started is not None]
    nproc = os.cpu_count()
    if runs:
        first, last = min(r.started for r in runs), max(r.started for r in runs)  # type: ignore[type-var]
        loads = [r.load_average for r in runs if r.load_average is not None]
        when = f"{_utc(first, '%Y-%m-%d %H:%M')} to {_utc(last, '%H:%M')} UTC"
        load = f"load average (1 min) {min(loads):.2f} to {max(loads):.2f} at the runs' starts" if loads else ""
    else:
        when, avg = _utc(time.time(), "%Y-%m-%d %H:%M UTC"), os.getloadavg()
        load = f"load average {avg[0]:.2f} / {avg[1]:.2f} / {avg[2]:.2f}"
    return (
        f"Generated by `{shown_command(argv)}`; runs started {when}; machine: {nproc} CPUs (nproc), {load}, "
        f"torch {threads} thread{'s' if threads != 1 else ''} per run, one run at a time."
    )


def _utc(t: float, spec: str) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(spec)


# ------------------------------------------------------------------------------------------- running
def read_run(run_dir: Path, seed: int, target: float | None, untrained: float | None) -> SeedRecord:
    """A SeedRecord from a finished (or failed) run folder."""
    from pickaxe.runs.tracking import read_metrics

    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    evals = [(int(r["step"]), float(r["eval/return_mean"])) for r in records if "eval/return_mean" in r]
    solved = next((step for step, ret in evals if target is not None and ret >= target), None)
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
    return SeedRecord(
        seed=seed,
        steps=int(records[-1]["step"]) if records else 0,
        final_return=evals[-1][1] if evals else None,
        best_return=max(ret for _, ret in evals) if evals else None,
        untrained_return=untrained,
        solved_step=solved,
        wall_s=float(records[-1]["time/elapsed_s"]) if records else None,
        state=str(status.get("state", "missing")),
    )


def run_child(recipe: str, seed: int, steps: int, run_dir: str) -> int:
    """``--one``: the untrained eval (into ``RUN_DIR.untrained.json``), then ``pickaxe train`` into ``run_dir``."""
    from pickaxe.cli import main as cli_main
    from pickaxe.recipes import get_recipe
    from pickaxe.train.build import build_trainer

    cfg = get_recipe(recipe)
    cfg.seed, cfg.device, cfg.trainer.total_steps = seed, "cpu", steps
    trainer = build_trainer(cfg)
    untrained = trainer.evaluate()["eval/return_mean"]
    trainer.close()
    del trainer
    args = ["train", recipe, "--seed", str(seed), "--device", "cpu", "--trainer.total-steps", str(steps)]
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    started = {"time": time.time(), "load_average": os.getloadavg()[0], "nproc": os.cpu_count()}
    Path(f"{run_dir}.untrained.json").write_text(json.dumps({"untrained_return": untrained, **started}))
    return cli_main([*args, "--run-dir", run_dir, "--no-progress", "--overwrite"])


def started_of(run_dir: Path) -> dict[str, Any]:
    """What the child wrote next to its run folder: the untrained eval return, start time and load average."""
    path = Path(f"{run_dir}.untrained.json")
    return json.loads(path.read_text()) if path.is_file() else {}


def spawn(recipe: str, seed: int, steps: int, target: float | None, root: Path, reuse: bool = False) -> SeedRecord:
    """One run in a fresh interpreter (nothing else of this script's runs at the same time).

    ``reuse``: a finished run of the same budget already in ``root`` is read back instead of trained again."""
    run_dir = root / f"{recipe}-s{seed}-{steps}"
    started = started_of(run_dir) if reuse else {}
    if started:
        record = read_run(run_dir, seed, target, started.get("untrained_return"))
        if record.state == "finished":
            record.started, record.load_average = started.get("time"), started.get("load_average")
            return record
    cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{recipe}:{seed}:{steps}:{run_dir}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    started = started_of(run_dir)
    record = read_run(run_dir, seed, target, started.get("untrained_return"))
    record.process_s = time.perf_counter() - t0
    record.started, record.load_average = started.get("time"), started.get("load_average")
    if out.returncode != 0:
        record.state = f"exit {out.returncode}"
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  {recipe} seed {seed} failed (exit {out.returncode}): {tail}", file=sys.stderr, flush=True)
    return record


def parse_budgets(items: list[str], recipes: list[str]) -> dict[str, int]:
    """``RECIPE=STEPS`` options over the defaults."""
    budgets = dict(DEFAULT_BUDGETS)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.replace("_", "").isdigit() or int(value) < 1:
            raise ValueError(f"--budget {item!r} is not RECIPE=STEPS; fix: e.g. --budget hopper-ppo=40960")
        if name not in recipes:
            raise ValueError(f"--budget names {name!r}, which is not among the recipes run; fix: one of {recipes}")
        budgets[name] = int(value)
    return budgets


def main(argv: list[str] | None = None) -> int:
    """Run every recipe's seeds one at a time, print the table and the JSON line, optionally --write it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default="", help="comma-separated classic recipes (default: all of them)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--budget", action="append", default=[], metavar="RECIPE=STEPS", help="env steps of a recipe")
    parser.add_argument("--write", metavar="FILE", help="replace the block between the results markers in FILE")
    parser.add_argument(
        "--merge", action="store_true", help="with --write: replace only the measured recipes' rows, keep the others"
    )
    parser.add_argument("--root", help="where the run folders go (default: a temporary folder, removed after)")
    parser.add_argument("--reuse", action="store_true", help="read back finished runs already in --root")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # RECIPE:SEED:STEPS:RUN_DIR, run by the parent
    args = parser.parse_args(argv)
    if args.one:
        recipe, seed, steps, run_dir = args.one.split(":", 3)
        return run_child(recipe, int(seed), int(steps), run_dir)

    from pickaxe.recipes import get_recipe
    from pickaxe.recipes.classic import CLASSIC_RECIPES

    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()] or list(CLASSIC_RECIPES)
    unknown = [r for r in recipes if r not in CLASSIC_RECIPES]
    if unknown:
        parser.error(f"unknown classic recipe(s) {', '.join(unknown)}; choose from {', '.join(CLASSIC_RECIPES)}")
    try:
        budgets = parse_budgets(args.budget, recipes)
    except ValueError as e:
        parser.error(str(e))
    if args.seeds < 1:
        parser.error(f"--seeds takes a whole number >= 1, got {args.seeds}")
    if args.write and not Path(args.write).is_file():
        parser.error(f"--write: {args.write} is not a file; fix: give the markdown file that holds the markers")
    if args.write and BEGIN not in Path(args.write).read_text():  # fail before an hour of training, not after
        print(f"results.py: error: {args.write} has no '{BEGIN}' marker; fix: add the markers", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    print(f"Classic recipes, seeds 0-{args.seeds - 1}, one run at a time; {os.cpu_count()} CPUs, load {load:.2f}")
    results: list[RecipeResult] = []
    threads = 1
    with tempfile.TemporaryDirectory(prefix="pickaxe-results-") as tmp:
        root = Path(args.root or tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name in recipes:
            cfg = get_recipe(name)
            threads = cfg.torch_threads
            budget = budgets.get(name, cfg.trainer.total_steps)
            full = FULL_COMMANDS.get(name, f"pickaxe train {name} --trainer.total-steps {cfg.trainer.total_steps}")
            result = RecipeResult(name, budget, cfg.trainer.target_return, full)
            for seed in range(args.seeds):
                record = spawn(name, seed, budget, result.target, root, args.reuse and bool(args.root))
                result.seeds.append(record)
                print(
                    f"  {name} seed {seed}: {record.steps:,} steps, final {record.final_return}, best "
                    f"{record.best_return}, untrained {record.untrained_return}, solved {record.solved_step}, "
                    f"{record.wall_s} s training / {record.process_s} s process ({record.state})",
                    file=sys.stderr,
                    flush=True,
                )
            results.append(result)
    table = build_table(results)
    print()
    print(table)
    if args.write:
        path = Path(args.write)
        try:
            text, line = path.read_text(), machine_line(argv, threads, results)
            block = merge_block(current_block(text), table, line) if args.merge else table + "\n\n" + line
            path.write_text(replace_block(text, block))
        except MarkerError as e:
            print(f"results.py: error: {path}: {e}", file=sys.stderr)
            return 2
        print(f"\nwrote the table into {path}")
    summary = {r.recipe: {**summarize(r), "runs": [asdict(s) for s in r.seeds]} for r in results}
    machine = {"nproc": os.cpu_count(), "load_average": list(os.getloadavg()), "torch_threads": threads}
    print(json.dumps({"recipes": summary, "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
