"""What pickaxe's multi-agent recipes reach at their budgets: docs/multi-agent.md's "What the recipes reach" table.

For every multi-agent recipe (``simple-spread-mappo``, ``-ippo``, ``-idqn``, ``-mappo-continuous`` and
``simple-adversary-mappo``; ``--recipes a,b`` for a subset) and seeds ``0..N-1``, one training run at the recipe's
own budget (``--budget STEPS`` overrides it for every recipe, for a quick look), each in a fresh Python process with
torch on one thread, one at a time, so no two runs overlap. In the child: the same seeded run is built and its
untrained (greedy) policy evaluated with the recipe's eval settings, then ``pickaxe train RECIPE --seed S --device
cpu --run-dir DIR`` runs (through ``pickaxe.cli.main``) with the wall and process CPU seconds taken around it (run
construction, training, evaluations and checkpoints). Everything else is read back from the run's
``metrics.jsonl``: the last evaluation's team total (``eval/return_mean``, the episode return summed over the
agents) with its 95% bootstrap CI, and each agent's return (``eval/agent/<name>/return_mean``).

The random reference of each env: uniform random actions (Discrete: each action equally likely; Box: uniform within
the bounds) for ``--random-episodes`` episodes (default 200) on the recipe's eval envs as seed 0's run seeds them
(``rollout.multiagent.play_episodes``, the evaluator's own episode loop).

Usage::

    python benchmarks/multiagent.py --seeds 3 --write docs/multi-agent.md
    python benchmarks/multiagent.py --recipes simple-spread-idqn --seeds 1 --budget 2000   # a quick look

``--write FILE`` replaces the block between ``<!-- multiagent:begin -->`` and ``<!-- multiagent:end -->`` in FILE
with the table and a line naming the command, the UTC times, the load average and the machine. The last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import MarkerError, fmt_seconds, replace_block
from results import shown_command as results_command

MARKERS = ("<!-- multiagent:begin -->", "<!-- multiagent:end -->")

RECIPES: tuple[str, ...] = (
    "simple-spread-mappo",
    "simple-spread-ippo",
    "simple-spread-idqn",
    "simple-spread-mappo-continuous",
    "simple-adversary-mappo",
)


@dataclass
class RunRecord:
    """One training run, as read back from its run folder and the child's timing file."""

    seed: int
    steps: int = 0
    """Env steps trained (joint steps of all agents; the last metrics record)."""
    final: float | None = None
    """The last evaluation's team total (``eval/return_mean``)."""
    final_low: float | None = None
    final_high: float | None = None
    agents: dict[str, float] = field(default_factory=dict)
    """Each agent's return at the last evaluation."""
    untrained: float | None = None
    wall_s: float | None = None
    cpu_s: float | None = None
    started: float | None = None
    """Unix time training started (after the untrained eval)."""
    load_average: float | None = None
    """The 1-minute load average then."""
    state: str = "finished"


@dataclass
class RecipeResult:
    """One recipe over seeds, with its env's random reference."""

    recipe: str
    budget: int
    random: float | None = None
    """Uniform random actions' mean team total, with its 95% CI (``random_low``, ``random_high``)."""
    random_low: float | None = None
    random_high: float | None = None
    random_agents: dict[str, float] = field(default_factory=dict)
    """Uniform random actions' mean return per agent."""
    runs: list[RunRecord] = field(default_factory=list)


def fmt_return(x: float | None) -> str:
    """A return: one decimal below 100 in size, whole numbers above; ``-`` for none."""
    if x is None:
        return "-"
    return f"{x:.1f}" if abs(x) < 100 else f"{x:.0f}"


def agents_text(agents: dict[str, float]) -> str:
    """Per-agent returns: bare values when the agents are ``agent_0..``, else each named."""
    if not agents:
        return "-"
    plain = all(name.startswith("agent_") for name in agents)
    return ", ".join(fmt_return(v) if plain else f"{name} {fmt_return(v)}" for name, v in agents.items())


def spread_text(values: list[float | None]) -> str:
    """``median [min to max]`` of the values that exist (the median alone for one value)."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    med = fmt_return(statistics.median(present))
    return med if len(present) == 1 else f"{med} [{fmt_return(min(present))} to {fmt_return(max(present))}]"


def random_text(r: RecipeResult) -> str:
    """The random reference: the total with its CI, and each agent's where they are not all ``agent_0..``."""
    if r.random is None:
        return "-"
    text = f"{fmt_return(r.random)} [{fmt_return(r.random_low)}, {fmt_return(r.random_high)}]"
    named = r.random_agents and not all(name.startswith("agent_") for name in r.random_agents)
    return f"{text} ({agents_text(r.random_agents)})" if named else text


def build_table(results: list[RecipeResult]) -> str:
    """The markdown table: one row per recipe."""
    lines = [
        "| recipe | final eval total, per seed [95% CI] | median [min to max] | per agent (seed 0) "
        "| untrained (per seed) | random [95% CI] | training wall s (per seed) | training CPU s (per seed) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        finals = " / ".join(
            "-" if x.final is None else f"{fmt_return(x.final)} [{fmt_return(x.final_low)}, {fmt_return(x.final_high)}]"
            for x in r.runs
        )
        seed0 = next((x for x in r.runs if x.seed == 0), r.runs[0] if r.runs else None)
        bad = [f"seed {x.seed} {x.state}" for x in r.runs if x.state != "finished"]
        lines.append(
            f"| `{r.recipe}` | {finals or '-'}{' (' + ', '.join(bad) + ')' if bad else ''} "
            f"| {spread_text([x.final for x in r.runs])} | {agents_text(seed0.agents) if seed0 else '-'} "
            f"| {' / '.join(fmt_return(x.untrained) for x in r.runs)} | {random_text(r)} "
            f"| {' / '.join(fmt_seconds(x.wall_s) for x in r.runs)} "
            f"| {' / '.join(fmt_seconds(x.cpu_s) for x in r.runs)} |"
        )
    return "\n".join(lines)


def shown_command(argv: list[str], script: str = "benchmarks/multiagent.py") -> str:
    """The command line of ``script`` as the docs show it (:func:`results.shown_command`)."""
    return results_command(argv, script)


def utc(t: float, spec: str) -> str:
    """Unix time ``t`` formatted in UTC."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(spec)


def provenance(command: str, starts: list[tuple[float, float | None]], ended: float) -> str:
    """The command, when the runs were measured (``starts``: each run's start time and 1-minute load average then),
    the load average and the machine."""
    loads = [load for _, load in starts if load is not None]
    first = min((t for t, _ in starts), default=ended)
    load = f"load average (1 min) {min(loads):.2f} to {max(loads):.2f} at the runs' starts, " if loads else ""
    return (
        f"Generated by `{command}`; runs from {utc(first, '%Y-%m-%d %H:%M')} to {utc(ended, '%H:%M')} UTC; machine: "
        f"{os.cpu_count()} CPUs (nproc), {load}torch 1 thread per run, one run at a time."
    )


# ------------------------------------------------------------------------------------------- running
def run_child(recipe: str, seed: int, steps: int, run_dir: str, extra: list[str] | None = None) -> int:
    """``--one``: the untrained eval, then ``pickaxe train`` into ``run_dir`` timed (wall and process CPU);
    both written to ``RUN_DIR.timing.json``. ``extra``: more ``pickaxe train`` options (then no untrained eval:
    it is of the recipe as it stands)."""
    from pickaxe.cli import main as cli_main
    from pickaxe.recipes import get_recipe
    from pickaxe.train.build import build_trainer

    cfg = get_recipe(recipe)
    cfg.seed, cfg.device, cfg.trainer.total_steps = seed, "cpu", steps
    untrained = None
    if not extra:
        trainer = build_trainer(cfg)
        untrained = trainer.evaluate()["eval/return_mean"]
        trainer.close()
        del trainer
    args = [
        "train",
        recipe,
        "--seed",
        str(seed),
        "--device",
        "cpu",
        "--trainer.total-steps",
        str(steps),
        *(extra or []),
    ]
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    timing: dict[str, Any] = {"untrained": untrained, "started": time.time(), "load_average": os.getloadavg()[0]}
    wall, cpu = time.perf_counter(), time.process_time()
    code = cli_main([*args, "--run-dir", run_dir, "--no-progress", "--overwrite"])
    timing.update(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    Path(f"{run_dir}.timing.json").write_text(json.dumps(timing))
    return code


def read_run(run_dir: Path, seed: int) -> RunRecord:
    """A RunRecord from a run folder and the child's timing file next to it."""
    from pickaxe.runs.tracking import read_metrics

    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    evals = [r for r in records if "eval/return_mean" in r]
    timing_path = Path(f"{run_dir}.timing.json")
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
    last = evals[-1] if evals else {}
    prefix, suffix = "eval/agent/", "/return_mean"
    return RunRecord(
        seed=seed,
        steps=int(records[-1]["step"]) if records else 0,
        final=last.get("eval/return_mean"),
        final_low=last.get("eval/return_mean_ci_low"),
        final_high=last.get("eval/return_mean_ci_high"),
        agents={
            k[len(prefix) : -len(suffix)]: float(v)
            for k, v in last.items()
            if k.startswith(prefix) and k.endswith(suffix)
        },
        untrained=timing.get("untrained"),
        wall_s=timing.get("wall_s"),
        cpu_s=timing.get("cpu_s"),
        started=timing.get("started"),
        load_average=timing.get("load_average"),
        state=str(status.get("state", "missing")),
    )


def spawn(
    recipe: str, seed: int, steps: int, root: Path, reuse: bool = False, extra: list[str] | None = None, tag: str = ""
) -> RunRecord:
    """One run in a fresh interpreter; ``reuse``: a finished run already in ``root`` is read back instead.
    ``extra``: more ``pickaxe train`` options, ``tag`` added to the run folder's name to tell such runs apart."""
    run_dir = root / f"{recipe}{tag}-s{seed}-{steps}"
    if reuse:
        record = read_run(run_dir, seed)
        if record.state == "finished" and record.cpu_s is not None:
            return record
    cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{recipe}:{seed}:{steps}:{run_dir}"]
    cmd += ["--extra", json.dumps(extra or [])]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    record = read_run(run_dir, seed)
    if out.returncode != 0:
        record.state = f"exit {out.returncode}"
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  {recipe} seed {seed} failed (exit {out.returncode}): {tail}", file=sys.stderr, flush=True)
    return record


class RandomPolicy:
    """Uniform random actions for every agent (``act`` as the multi-agent policies have it)."""

    def __init__(self, spaces: Any, seed: int = 0) -> None:
        import torch

        self.spaces, self.generator = spaces, torch.Generator().manual_seed(seed)

    def act(self, obs: Any, state: Any = None, deterministic: bool = True) -> tuple[Any, dict[str, Any]]:
        """Actions ``[N, A]`` (Discrete) or ``[N, A, d]`` uniform within each agent's bounds (Box)."""
        import torch

        s, shape = self.spaces, obs.shape[:-1]
        if not s.continuous:
            return torch.randint(s.n_actions, shape, generator=self.generator), {}
        low, high = torch.as_tensor(s.action_low), torch.as_tensor(s.action_high)
        u = torch.rand((*shape, s.n_actions), generator=self.generator, dtype=low.dtype)
        return low + u * (high - low), {}


def random_reference(recipe: str, episodes: int) -> tuple[float, float, float, dict[str, float]]:
    """Uniform random actions over ``episodes`` episodes of the recipe's eval envs (seeded as seed 0's run seeds
    them): the mean team total, its 95% bootstrap CI (as the evaluations compute theirs) and each agent's mean."""
    from pickaxe.envs.multiagent import MultiAgentVectorEnv
    from pickaxe.recipes import get_recipe
    from pickaxe.rollout.multiagent import play_episodes
    from pickaxe.train.build import derive_seeds
    from pickaxe.train.evaluate import mean_ci

    cfg = get_recipe(recipe)
    envs = MultiAgentVectorEnv(cfg.env.id, max(cfg.env.eval_envs, 1), derive_seeds(0)["eval_env"], **cfg.env.kwargs)
    try:
        returns, _ = play_episodes(RandomPolicy(envs.spaces), envs, episodes)
        agents = list(envs.agents)
    finally:
        envs.close()
    total = np.asarray(returns).sum(1)
    low, high = mean_ci(total)
    return float(total.mean()), low, high, {a: float(returns[:, j].mean()) for j, a in enumerate(agents)}


def main(argv: list[str] | None = None) -> int:
    """Run every recipe's seeds one at a time, print the table and the JSON line, optionally --write it."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated multi-agent recipes")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--budget", type=int, help="env steps of every run (default: each recipe's own)")
    parser.add_argument("--random-episodes", type=int, default=200, help="episodes of the random reference")
    parser.add_argument("--write", metavar="FILE", help="replace the block between the multiagent markers in FILE")
    parser.add_argument("--root", help="where the run folders go (default: a temporary folder, removed after)")
    parser.add_argument("--reuse", action="store_true", help="read back finished runs already in --root")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # RECIPE:SEED:STEPS:RUN_DIR, run by the parent
    parser.add_argument("--extra", default="[]", help=argparse.SUPPRESS)  # JSON list of more train options
    args = parser.parse_args(argv)
    if args.one:
        recipe, seed, steps, run_dir = args.one.split(":", 3)
        return run_child(recipe, int(seed), int(steps), run_dir, json.loads(args.extra))
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown multi-agent recipe(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    if args.seeds < 1 or (args.budget is not None and args.budget < 1) or args.random_episodes < 1:
        parser.error("--seeds, --budget and --random-episodes take whole numbers >= 1")
    if args.write and (not Path(args.write).is_file() or MARKERS[0] not in Path(args.write).read_text()):
        parser.error(f"--write: {args.write} is not a file with the '{MARKERS[0]}' marker; fix: add the markers")

    from pickaxe.recipes import get_recipe

    print(f"Multi-agent recipes, seeds 0-{args.seeds - 1}, one run at a time; load {os.getloadavg()[0]:.2f}")
    results: list[RecipeResult] = []
    with tempfile.TemporaryDirectory(prefix="pickaxe-multiagent-") as tmp:
        root = Path(args.root or tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name in recipes:
            budget = args.budget or get_recipe(name).trainer.total_steps
            mean, low, high, agents = random_reference(name, args.random_episodes)
            result = RecipeResult(name, budget, mean, low, high, agents)
            for seed in range(args.seeds):
                record = spawn(name, seed, budget, root, args.reuse and bool(args.root))
                result.runs.append(record)
                print(f"  {name}: {json.dumps(asdict(record))}", file=sys.stderr, flush=True)
            results.append(result)
    ends = [x.started + x.wall_s for r in results for x in r.runs if x.started is not None and x.wall_s is not None]
    ended = max(ends, default=time.time())  # the last run's end (runs read back with --reuse keep their times)
    table = build_table(results)
    print()
    print(table)
    if args.write:
        path = Path(args.write)
        try:
            starts = [(x.started, x.load_average) for r in results for x in r.runs if x.started is not None]
            line = provenance(shown_command(argv), starts, ended)
            path.write_text(replace_block(path.read_text(), table + "\n\n" + line, MARKERS))
        except MarkerError as e:
            print(f"multiagent.py: error: {path}: {e}", file=sys.stderr)
            return 2
        print(f"\nwrote the table into {path}")
    machine = {"nproc": os.cpu_count(), "load_average": list(os.getloadavg()), "torch_threads": 1}
    print(json.dumps({"recipes": [asdict(r) for r in results], "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
