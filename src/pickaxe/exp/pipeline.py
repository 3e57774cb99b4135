"""Pipelines: named graphs of training stages, each stage a ``pickaxe train`` run reading earlier stages' exports.

``pickaxe pipeline rlhf-synthetic --seed 0 --workers 2`` queues SFT -> reward model -> PPO / RLOO / DPO /
best-of-n as dependent jobs in the pipeline's own SQLite queue (``<pipeline>/queue.db``), runs them with an
in-process worker of ``--workers`` slots, prints a line per finished stage and ends with a table of each
stage's state and headline metrics. A stage's flags are a template whose ``{stage}`` placeholders become that
stage's run folder (``--model.path {sft}/export``), so every stage reads the model the one before exported.

Rerunning the same command continues: the default folder (``runs/pipeline-<name>-<hash>``) is derived from the
pipeline, the seed and the extra flags; finished stages are kept, an interrupted or killed stage resumes its run
from its newest checkpoint (the queue's resume of a later attempt; a run killed before its first checkpoint starts
again from step 0), and failed or blocked stages are queued again.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import inspect
import json
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from pickaxe.argparsing import parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.runs.tracking import read_metrics

PIPELINE_FILE = "pipeline.json"
SUCCEEDED, FAILED, BAD_INPUT = 0, 1, 2


@dataclass(frozen=True)
class Stage:
    """One stage of a pipeline: a recipe trained in ``<pipeline>/<name>`` once its dependencies succeeded."""

    name: str
    """Stage name, also its run folder's name inside the pipeline folder."""
    recipe: str
    """The recipe ``pickaxe train`` runs."""
    depends_on: tuple[str, ...] = ()
    """Stages that must succeed first."""
    flags: tuple[str, ...] = ()
    """``pickaxe train`` flags; ``{stage}`` in a value becomes that stage's run folder (absolute)."""
    headline: tuple[str, ...] = ()
    """metrics.jsonl keys shown in the summary (their last logged values)."""
    per: str | None = None
    """A metrics.jsonl key that splits the headline into one group per value (best-of-n: ``bon/n``)."""


@dataclass(frozen=True)
class Pipeline:
    """A named list of stages in dependency order."""

    name: str
    description: str
    stages: tuple[Stage, ...]


def _flags(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_FROM_SFT = "--model.path {sft}/export --warm-start.updates 0"
_WITH_RM = f"{_FROM_SFT} --data.reward-model {{rm}}/export"
_PAIRS = "--preferences.path {rm}/preferences/train.jsonl --preferences.heldout-path {rm}/preferences/heldout.jsonl"
_RL_HEADLINE = ("eval/reward/gold", "eval/reward/proxy", "eval/kl")

RLHF_SYNTHETIC = Pipeline(
    name="rlhf-synthetic",
    description="SFT -> reward model -> PPO, RLOO, DPO and best-of-n on the synthetic sorting task (gold logged)",
    stages=(
        Stage("sft", "synthetic-sft", headline=("eval/accuracy", "eval/reward/gold")),
        Stage("rm", "synthetic-rm", ("sft",), _flags(_FROM_SFT), headline=("eval/accuracy",)),
        Stage("ppo", "synthetic-ppo", ("sft", "rm"), _flags(_WITH_RM), _RL_HEADLINE),
        Stage("rloo", "synthetic-rloo", ("sft", "rm"), _flags(_WITH_RM), _RL_HEADLINE),
        Stage("dpo", "synthetic-dpo", ("sft", "rm"), _flags(f"{_WITH_RM} {_PAIRS}"), _RL_HEADLINE),
        Stage("bon", "synthetic-bon", ("sft", "rm"), _flags(_WITH_RM), _RL_HEADLINE[:2], per="bon/n"),
    ),
)

PIPELINES: dict[str, Pipeline] = {p.name: p for p in (RLHF_SYNTHETIC,)}


@dataclass
class PipelineOptions:
    """Run a pipeline's stages through a job queue, each stage training from the previous stages' exports.

    Flags after `--` are `pickaxe train` flags applied to every stage, e.g.
    `pickaxe pipeline rlhf-synthetic --workers 2 -- --model.hidden 64`. Rerunning the same command continues the
    pipeline (same default folder): finished stages are kept, killed ones resume, failed ones are retried."""

    pipeline_dir: str | None = None
    """Pipeline folder (default runs/pipeline-<name>-<hash of the stages, seed and extra flags>)."""
    seed: int = ranged(0, ge=0)
    """Seed of every stage."""
    workers: int | None = ranged(None, ge=1)
    """Stages at a time (default: the number of cores)."""
    gpus: int | None = ranged(None, ge=0)
    """GPUs per stage (default: 1 if this machine has GPUs, else 0)."""
    dry_run: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Print the stages and their commands; queue and run nothing."""


# ----------------------------------------------------------------------------------------------- planning
def get_pipeline(name: str) -> Pipeline:
    """The pipeline called ``name``; ``ConfigError`` naming the closest one otherwise."""
    if name in PIPELINES:
        return PIPELINES[name]
    close = difflib.get_close_matches(name, PIPELINES, n=1, cutoff=0.0)
    raise ConfigError(f"unknown pipeline {name!r}; did you mean {close[0]!r}? (pipelines: {', '.join(PIPELINES)})")


def _key(flag: str) -> str:
    return flag.partition("=")[0][2:].replace("-", "_")


def _check_graph(stages: tuple[Stage, ...]) -> None:
    seen: set[str] = set()
    for s in stages:
        missing = [d for d in s.depends_on if d not in seen]
        if missing:
            raise ConfigError(f"stage {s.name} depends on {', '.join(missing)}, which is not an earlier stage")
        seen.add(s.name)


def pipeline_spec(pipeline: Pipeline, stages: tuple[Stage, ...], seed: int, extra: list[str]) -> dict[str, Any]:
    """What decides a pipeline's runs (saved in ``pipeline.json``; its hash names the default folder)."""
    return {
        "pipeline": pipeline.name,
        "seed": seed,
        "extra": list(extra),
        "stages": [
            {"name": s.name, "recipe": s.recipe, "depends_on": list(s.depends_on), "flags": list(s.flags)}
            for s in stages
        ],
    }


def default_pipeline_dir(spec: dict[str, Any], root: str | Path = "runs") -> Path:
    """``runs/pipeline-<name>-<8 hex digits>``: the same stages, seed and flags give the same folder."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return Path(root) / f"pipeline-{spec['pipeline']}-{digest}"


def stage_command(stage: Stage, pipeline_dir: Path, seed: int, extra: list[str]) -> list[str]:
    """The stage's ``python -m pickaxe.cli train`` command line, placeholders filled with absolute run folders."""
    root = pipeline_dir.absolute()
    dirs = {name: str(root / name) for name in {stage.name, *stage.depends_on}}
    try:
        flags = [f.format(**dirs) for f in stage.flags]
    except KeyError as e:
        missing = e.args[0]
        raise ConfigError(
            f"stage {stage.name}: flag placeholder {{{missing}}} is not one of its dependencies"
        ) from None
    return [
        sys.executable, "-m", "pickaxe.cli", "train", stage.recipe, *extra, *flags,
        "--seed", str(seed), "--run-dir", dirs[stage.name], "--no-progress",
    ]  # fmt: skip


def check_extra(stages: tuple[Stage, ...], extra: list[str]) -> None:
    """Refuse extra flags that the pipeline sets itself (the seed, run folders, the chaining flags)."""
    for flag in extra:
        if not flag.startswith("--"):
            continue
        key = _key(flag)
        if key in ("seed", "run_dir"):
            raise ConfigError(f"--{key.replace('_', '-')} is set by the pipeline; use `pickaxe pipeline --seed S` or "
                              "--pipeline-dir D before the --")  # fmt: skip
        owners = [s.name for s in stages if key in {_key(f) for f in s.flags if f.startswith("--")}]
        if owners:
            raise ConfigError(
                f"--{key} is set by the pipeline for stage(s) {', '.join(owners)} to chain the stages; drop it"
            )


def plan(
    pipeline: Pipeline, pipeline_dir: Path | None, seed: int, extra: list[str]
) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """Validate the pipeline folder and every stage's flags and inputs (nothing is queued or written when one is
    wrong) and build the commands. Each stage's config gets the checks its ``pickaxe train`` runs before training
    (``cfg.check``); an input that an earlier stage writes (``{sft}/export``) is checked when that stage starts.

    Returns (pipeline folder, spec, one ``{name, recipe, depends_on, run_dir, export, command}`` per stage)."""
    from pickaxe.recipes.args import parse_train

    stages = pipeline.stages
    _check_graph(stages)
    check_extra(stages, extra)
    spec = pipeline_spec(pipeline, stages, seed, extra)
    folder = pipeline_dir if pipeline_dir is not None else default_pipeline_dir(spec)
    check_pipeline_dir(folder)
    pending = [folder.absolute() / s.name for s in stages]
    entries = []
    for s in stages:
        command = stage_command(s, folder, seed, extra)
        cfg, _ = parse_train(s.recipe, command[5:])  # exactly what the stage's `pickaxe train` will parse
        try:
            cfg.check(pending)  # and what it checks before training
        except PickaxeError as e:
            raise ConfigError(f"stage {s.name}: {e}") from None
        run_dir = command[command.index("--run-dir") + 1]
        entries.append({
            "name": s.name, "recipe": s.recipe, "depends_on": list(s.depends_on),
            "run_dir": run_dir, "export": str(Path(run_dir) / "export"), "command": command,
        })  # fmt: skip
    return folder, spec, entries


def check_pipeline_dir(folder: Path) -> None:
    """A pipeline folder is new, empty, or an earlier run of a pipeline (its ``pipeline.json``); it is not a run's
    folder or inside one, and not a folder holding other things. One-line ``PickaxeError`` otherwise."""
    from pickaxe.runs.folder import holds_run

    absolute = folder.absolute()
    ours = (folder / PIPELINE_FILE).is_file()  # an earlier run of a pipeline: its own files are no run's
    for parent in [*([] if ours else [absolute]), *absolute.parents]:
        if parent.is_dir() and holds_run(parent):
            inside = "is" if parent == absolute else f"lies inside {parent}, which is"
            raise PickaxeError(f"--pipeline-dir {folder} {inside} a run's folder; a pipeline writes its queue and "
                               "stage runs into a folder of its own: choose a new or empty --pipeline-dir")  # fmt: skip
    if folder.exists() and not folder.is_dir():
        raise PickaxeError(f"--pipeline-dir {folder} is a file; choose a new or empty folder")
    if folder.is_dir() and not (folder / PIPELINE_FILE).is_file() and any(folder.iterdir()):
        raise PickaxeError(f"--pipeline-dir {folder} holds other files and no {PIPELINE_FILE}, so it is no "
                           "pipeline's folder; choose a new or empty --pipeline-dir")  # fmt: skip


# ------------------------------------------------------------------------------------------------ metrics
def _label(key: str) -> str:
    return key.removeprefix("eval/").removeprefix("reward/")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and math.isfinite(value) else str(value)


def headline(stage: Stage, run_dir: str | Path) -> str:
    """The stage's headline metrics from its metrics.jsonl, e.g. ``gold 0.41, proxy 1.2, kl 0.03``
    (best-of-n: ``n=1: gold 0.2, proxy -0.1; n=2: ...``); '' when none was logged."""
    records = read_metrics(run_dir) if (Path(run_dir) / "metrics.jsonl").is_file() else []

    def last(rows: list[dict[str, Any]]) -> str:
        values = {}
        for row in rows:
            values.update({k: row[k] for k in stage.headline if k in row})
        return ", ".join(f"{_label(k)} {_fmt(values[k])}" for k in stage.headline if k in values)

    if stage.per is None:
        return last(records)
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in records:
        if stage.per in row:
            groups.setdefault(row[stage.per], []).append(row)
    name = stage.per.rsplit("/", 1)[-1]
    return "; ".join(f"{name}={_fmt(v)}: {last(rows)}" for v, rows in groups.items())


# ------------------------------------------------------------------------------------------------ running
def main_pipeline(args: list[str]) -> int:
    """``pickaxe pipeline NAME [--pipeline-dir D] [--seed S] [--workers N] [--gpus N] [--dry-run] [-- FLAGS]``."""
    options, extra = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    if wants_help(options):
        listing = "\n".join(f"  {p.name}: {p.description}" for p in PIPELINES.values())
        about = f"{inspect.cleandoc(PipelineOptions.__doc__ or '')}\n\npipelines:\n{listing}"
        parse(PipelineOptions, ["--help"], "pickaxe pipeline NAME", description=about)
    if not options or options[0].startswith("-"):
        raise PickaxeError(
            "usage: pickaxe pipeline NAME [--pipeline-dir D] [--seed S] [--workers N] [-- train flags for every "
            f"stage] (pipelines: {', '.join(PIPELINES)})"
        )
    pipeline = get_pipeline(options[0])
    opts = parse(PipelineOptions, options[1:], f"pickaxe pipeline {pipeline.name}")
    return run_pipeline(pipeline, opts, extra)


def _previous_state(job: Any) -> str:
    """How a stage found in the queue is continued, e.g. ``killed while running (resumes its run)``: a stage whose
    run has no checkpoint yet starts its run again from step 0."""
    from pickaxe.runs.checkpoint import has_checkpoint

    started = bool(job.run_dir) and (Path(job.run_dir) / "config.json").is_file()
    resumes = " (starts again)"
    if started:
        resumes = " (resumes its run)" if has_checkpoint(job.run_dir) else " (starts its run again: no checkpoint yet)"
    if job.state == "succeeded":
        return "succeeded (kept)"
    if job.state == "queued":
        return f"interrupted{resumes}" if job.attempts else "queued"
    if job.state == "running":
        return f"killed while running{resumes}"
    if job.state == "blocked":
        return "blocked (queued again)"
    return f"{job.state}, retried{resumes}"


def run_pipeline(pipeline: Pipeline, opts: PipelineOptions, extra: list[str]) -> int:
    """Plan, queue and run the pipeline, then print its summary; returns the exit status (1 if a stage failed)."""
    from pickaxe.exp.queue_store import BAD_FOR_DEPENDENTS, JobQueue
    from pickaxe.exp.worker import detect_gpus, run_jobs

    folder, spec, entries = plan(pipeline, Path(opts.pipeline_dir) if opts.pipeline_dir else None, opts.seed, extra)
    stages = {s.name: s for s in pipeline.stages}
    if opts.dry_run:
        print(f"pickaxe: pipeline {pipeline.name} in {folder}", file=sys.stderr)
        for e in entries:
            after = f" after {', '.join(e['depends_on'])}" if e["depends_on"] else ""
            print(f"{e['name']}{after}: {' '.join(e['command'])}")
        return SUCCEEDED
    spec_path = folder / PIPELINE_FILE
    if spec_path.exists() and json.loads(spec_path.read_text()).get("spec") != spec:
        raise PickaxeError(f"{folder} holds a different pipeline ({spec_path}); use another --pipeline-dir")
    folder.mkdir(parents=True, exist_ok=True)
    if not spec_path.exists():  # before any job is queued, so a crash in between cannot mix two pipelines
        spec_path.write_text(json.dumps({"spec": spec, "stages": entries}, indent=2))
    queue = JobQueue(folder / "queue.db")
    existing = {job.name: job for job in queue.list()}
    for job in existing.values():
        if job.state == "running" and queue.worker_alive(job.worker_id):
            raise PickaxeError(f"stage {job.name} of {folder} is running under another live process (worker "
                               f"{job.worker_id}); wait for it to end or stop it first")  # fmt: skip
    gpus = opts.gpus if opts.gpus is not None else (1 if detect_gpus() else 0)
    ids: dict[str, int] = {}
    continuing = []
    for e in entries:  # dependency order: a stage's dependencies are retried before it
        job = existing.get(e["name"])
        if job is None:
            deps = [ids[d] for d in e["depends_on"]]
            ids[e["name"]] = queue.add(e["command"], name=e["name"], depends_on=deps, gpus=gpus, run_dir=e["run_dir"])
            continue
        ids[e["name"]] = job.id
        if job.state != "queued" or job.attempts:  # never-started stages simply wait their turn
            continuing.append(f"{e['name']} {_previous_state(job)}")
        if queue.get(job.id).state in BAD_FOR_DEPENDENTS:  # a retried dependency may have unblocked it already
            queue.retry(job.id)
    spec_path.write_text(
        json.dumps({"spec": spec, "stages": [{**e, "job": ids[e["name"]]} for e in entries]}, indent=2)
    )
    workers = opts.workers or os.cpu_count() or 1
    slots = f"{workers} worker{'s' * (workers != 1)}"
    print(
        f"pickaxe: pipeline {pipeline.name} ({len(entries)} stages) in {folder}, {slots}"
        + (f"; continuing: {', '.join(continuing)}" if continuing else ""),
        file=sys.stderr,
        flush=True,
    )
    names = {job_id: name for name, job_id in ids.items()}
    finished = [sum(queue.get(i).state == "succeeded" for i in ids.values())]

    def report(job: Any) -> None:
        finished[0] += 1
        took = f" in {job.wall_s:.1f} s" if job.wall_s is not None else ""
        if job.state == "succeeded":
            detail = headline(stages[job.name], job.run_dir)
            detail = f": {detail}" if detail else ""
        else:
            detail = f" ({job.reason}); log {job.log_path}"
        print(f"pickaxe: [{finished[0]}/{len(ids)}] {job.name} {job.state}{took}{detail}", file=sys.stderr, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = None
    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        previous = signal.signal(signal.SIGTERM, on_term)
    try:  # Ctrl-C or SIGTERM: the worker stops the running stages (they checkpoint) and requeues them
        run_jobs(queue, list(ids.values()), slots=workers, on_finish=report)
    except KeyboardInterrupt as e:
        print(f"pickaxe: pipeline interrupted; the same command continues it ({folder})", file=sys.stderr)
        e.reported = True  # type: ignore[attr-defined]
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return _summarize(queue, ids, names, stages, folder)


def _blocked_by(queue: Any, job: Any, names: dict[int, str]) -> str:
    """``stage rm failed``: the first dependency (transitively) that did not succeed."""
    for dep in job.depends_on:
        d = queue.get(dep)
        if d.state == "blocked":
            return _blocked_by(queue, d, names)
        if d.state != "succeeded":
            return f"stage {names.get(dep, dep)} {d.state}"
    return job.reason or "a dependency did not succeed"


def _summarize(queue: Any, ids: dict[str, int], names: dict[int, str], stages: dict[str, Stage], folder: Path) -> int:
    rows = []
    failed = []
    for name, job_id in ids.items():
        job = queue.get(job_id)
        if job.state == "succeeded":
            detail = headline(stages[name], job.run_dir)
        elif job.state == "blocked":
            detail = f"blocked: {_blocked_by(queue, job, names)}"
        else:
            detail = f"{job.reason or job.state}; log {job.log_path}"
            failed.append(job)
        rows.append((name, job.state, detail))
    width = max(len("stage"), *(len(r[0]) for r in rows))
    state_width = max(len("state"), *(len(r[1]) for r in rows))
    print(f"{'stage':<{width}}  {'state':<{state_width}}  headline")
    for name, state, detail in rows:
        print(f"{name:<{width}}  {state:<{state_width}}  {detail}")
    for job in failed:
        print(
            f"pickaxe: stage {job.name} {job.state} ({job.reason}); log: {job.log_path}; rerun the same command to "
            "retry it (it resumes its run from its newest checkpoint, or starts it again if it has none)",
            file=sys.stderr,
        )
    summary = {name: {"state": state, "headline": detail} for name, state, detail in rows}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return SUCCEEDED if all(state == "succeeded" for _, state, _ in rows) else FAILED
