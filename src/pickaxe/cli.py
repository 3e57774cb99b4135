"""The ``pickaxe`` command: ``train``, ``recipes``, ``eval``.

User errors (unknown recipe, config key, value type, env id) exit with status 2 and one line on stderr
that names the problem and the closest valid choice; there is no traceback for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tyro

from pickaxe.config_keys import check_value, flat_fields
from pickaxe.errors import ConfigError, PickaxeError

T = TypeVar("T")

USAGE = """usage: pickaxe COMMAND ...

commands:
  train RECIPE [--key.sub VALUE ...] [--run-dir DIR] [--seed N] [--device auto|cpu|cuda] [--no-progress]
               [--save-every N] [--max-restarts N] [--track wandb|mlflow] [--prometheus-port P]
  resume RUN_DIR [--no-progress] [--track T] [--prometheus-port P]
                                       continue a run from its newest good checkpoint to its original budget
  set RUN_DIR KEY=VALUE ...            change a mutable hyper-parameter of a running run (e.g. algo.lr=1e-4)
  sweep RECIPE --key v1,v2 ... [--seeds N] [--workers N] [--sweep-dir DIR]
                                       grid x seeds through the job queue, then compare
  compare RUN_OR_SWEEP_DIR... [--metric M] [--out DIR]
                                       IQM, bootstrap CIs, probability of improvement, curves
  queue add|list|cancel|retry ...      the persistent job queue (pickaxe queue --help)
  worker [--slots N] [--until-empty]   run queued jobs
  recipes                              list the recipes
  eval RUN_DIR [--episodes N]          evaluate a finished run's model (LLM runs: N held-out prompts)

`pickaxe train RECIPE --help` lists every config key of a recipe."""

COMMANDS = ("train", "resume", "set", "sweep", "compare", "queue", "worker", "recipes", "eval")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command == "train":
            return _train(rest)
        if command == "resume":
            return _resume(rest)
        if command == "set":
            return _set(rest)
        if command == "sweep":
            return _sweep(rest)
        if command == "compare":
            from pickaxe.exp.compare import main_compare

            return main_compare(rest)
        if command == "queue":
            from pickaxe.exp.queue import main_queue

            return main_queue(rest)
        if command == "worker":
            from pickaxe.exp.worker import main_worker

            return main_worker(rest)
        if command == "recipes":
            return _recipes()
        if command == "eval":
            return _eval(rest)
        close = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.0)
        raise PickaxeError(f"unknown command {command!r}; did you mean {close[0]!r}? (pickaxe --help)")
    except PickaxeError as e:
        print(f"pickaxe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pickaxe: interrupted", file=sys.stderr)
        return 130


def _pop_option(args: list[str], name: str, takes_value: bool = True) -> tuple[list[str], str | None]:
    """Remove ``--name VALUE`` / ``--name=VALUE`` (or a flag) from ``args``; return the rest and the value."""
    out, value, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a == name:
            if not takes_value:
                value = "true"
            elif i + 1 >= len(args):
                raise ConfigError(f"{name} needs a value")
            else:
                value, i = args[i + 1], i + 1
        elif takes_value and a.startswith(name + "="):
            value = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, value


def _validate_overrides(cfg: Any, args: list[str], prog: str) -> None:
    """One-line errors for unknown keys and badly typed scalar values, before tyro sees the arguments."""
    fields = flat_fields(cfg)
    by_flag = {k.replace("_", "-"): k for k in fields}
    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg in ("--help",):
            continue
        flag, _, inline = arg[2:].partition("=")
        key = by_flag.get(flag.replace("_", "-"))
        if key is None:
            close = difflib.get_close_matches(flag.replace("_", "-"), list(by_flag), n=1, cutoff=0.4)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ConfigError(f"unknown config key --{flag}{hint} ({prog} --help lists all keys)")
        hint_type, _ = fields[key]
        value = inline or (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None)
        if value is None:
            if hint_type is not bool:
                raise ConfigError(f"--{flag} needs a value")
            continue
        if not isinstance(fields[key][1], tuple):
            check_value(flag, hint_type, value)


def _tyro(fn: Callable[..., T] | type[T], args: list[str], prog: str, default: Any = None) -> T:
    """Run tyro, turning its boxed error report into one ``ConfigError`` line."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(fn, args=args, prog=prog, default=default)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        lines = [re.sub(r"[│╭╮╰╯─]", "", ln).strip() for ln in buf.getvalue().splitlines()]
        text = " ".join(ln for ln in lines if ln and not ln.lower().startswith(("for full helptext", "argument help")))
        raise ConfigError(text or f"could not parse arguments {' '.join(args)}") from None


def _concrete_type(cfg: Any) -> type:
    """A subclass of ``type(cfg)`` whose ``Any``-typed dataclass fields (e.g. ``algo``) carry their value's type.

    tyro builds ``--algo.*`` flags from type hints, so the concrete algorithm config type must be visible.
    """
    hints = typing.get_type_hints(type(cfg))
    special = [
        (f.name, type(v), dataclasses.field(default_factory=type(v)))
        for f in dataclasses.fields(cfg)
        if hints[f.name] is Any and dataclasses.is_dataclass(v := getattr(cfg, f.name))
    ]
    return dataclasses.make_dataclass(type(cfg).__name__, special, bases=(type(cfg),)) if special else type(cfg)


def _parse_train(name: str, rest: list[str]) -> tuple[Any, dict[str, Any]]:
    """A recipe's config with the command-line overrides applied, plus the run options (not config)."""
    from pickaxe.recipes import get_recipe

    cfg = get_recipe(name)
    rest, run_dir = _pop_option(rest, "--run-dir")
    rest, no_progress = _pop_option(rest, "--no-progress", takes_value=False)
    rest, max_restarts = _pop_option(rest, "--max-restarts")
    rest, sinks = _pop_sink_options(rest)
    if max_restarts is not None:
        check_value("max-restarts", int, max_restarts)
    rest = [
        "--trainer.save-every" if a == "--save-every" else a.replace("--save-every=", "--trainer.save-every=")
        for a in rest
    ]
    prog = f"pickaxe train {name}"
    _validate_overrides(cfg, rest, prog)
    cli_type = _concrete_type(cfg)
    default = cli_type(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    parsed = _tyro(cli_type, rest, prog, default=default)
    cfg = type(cfg)(**{f.name: getattr(parsed, f.name) for f in dataclasses.fields(cfg)})
    options = {"run_dir": run_dir, "no_progress": bool(no_progress), "max_restarts": max_restarts, **sinks}
    return cfg, options


def validate_train_args(recipe: str, args: list[str]) -> Any:
    """Check ``pickaxe train RECIPE ARGS...`` without running it; returns the resolved config."""
    return _parse_train(recipe, list(args))[0]


def _train(args: list[str]) -> int:
    from pickaxe.train.build import train

    if not args or args[0].startswith("-"):
        if args and args[0] in ("-h", "--help"):
            print(USAGE)
            return 0
        raise PickaxeError("pickaxe train needs a recipe name, e.g. `pickaxe train cartpole-ppo` (`pickaxe recipes`)")
    name = args[0]
    cfg, opts = _parse_train(name, args[1:])
    run_dir, no_progress, max_restarts = opts["run_dir"], opts["no_progress"], opts["max_restarts"]
    if max_restarts is not None:
        from pickaxe.runs.run import default_run_dir

        run_dir = run_dir or str(default_run_dir(name))
        child = [a for a in args if a not in ("--max-restarts", max_restarts) and not a.startswith("--max-restarts=")]
        return _supervise([*child, "--run-dir", run_dir], Path(run_dir), int(max_restarts))
    result, run = train(
        cfg, run_dir=run_dir, progress=not no_progress, track=opts["track"], prometheus_port=opts["prometheus_port"]
    )
    _print_result(result, run, no_progress)
    return 0


def _pop_sink_options(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``--track NAME`` (repeatable) and ``--prometheus-port P``: where metrics go besides the run dir."""
    track: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == "--track" and i + 1 < len(args):
            track.append(args[i + 1])
            i += 2
            continue
        if args[i].startswith("--track="):
            track.append(args[i].split("=", 1)[1])
        else:
            rest.append(args[i])
        i += 1
    rest, port = _pop_option(rest, "--prometheus-port")
    if port is not None:
        check_value("prometheus-port", int, port)
    return rest, {"track": tuple(track), "prometheus_port": int(port) if port is not None else None}


def _print_result(result: Any, run: Any, quiet: bool) -> None:
    if quiet:  # machine-readable summary; the progress view prints a table instead
        summary = {
            "run_dir": str(run.path),
            "steps": result.steps,
            "wall_s": round(result.wall_s, 2),
            "eval_return": result.eval_return,
        }
        print(json.dumps(summary))


def _resume(args: list[str]) -> int:
    from pickaxe.train.build import resume

    rest, no_progress = _pop_option(args, "--no-progress", takes_value=False)
    rest, sinks = _pop_sink_options(rest)
    if len(rest) != 1 or rest[0].startswith("-"):
        raise PickaxeError("usage: pickaxe resume RUN_DIR [--no-progress] [--track T] [--prometheus-port P]")
    result, run = resume(rest[0], progress=not no_progress, **sinks)
    _print_result(result, run, no_progress)
    return 0


def _sweep(args: list[str]) -> int:
    from pickaxe.exp.sweep import run_sweep

    if not args or args[0].startswith("-"):
        raise PickaxeError(
            "usage: pickaxe sweep RECIPE --algo.lr 1e-3,3e-4 [--seeds N] [--workers N] [--sweep-dir DIR]"
        )
    return run_sweep(args[0], args[1:])


def _set(args: list[str]) -> int:
    from pickaxe.runs.run import Run
    from pickaxe.train.build import config_from_dict
    from pickaxe.train.overrides import mutable_keys, parse_changes, request

    if len(args) < 2 or args[0].startswith("-"):
        raise PickaxeError("usage: pickaxe set RUN_DIR KEY=VALUE [KEY=VALUE ...], e.g. pickaxe set runs/x algo.lr=1e-4")
    run = Run.open(args[0])
    cfg = config_from_dict(run.config())
    changes = parse_changes(args[1:], mutable_keys(cfg.algo))
    path = request(run.path, changes)
    print(
        f"pickaxe: {', '.join(f'{k}={v!r}' for k, v in changes.items())} queued for {run.path} "
        f"({path.name}); the run applies it at its next update boundary"
    )
    return 0


def _supervise(train_args: list[str], run_dir: Path, max_restarts: int) -> int:
    """Run training in a child process; restart it from its newest good checkpoint when it crashes.

    Exit status 0 (done) and 2 (a user error, or a deliberate stop) end supervision; any other status,
    a signal included, is a crash and costs one of ``max_restarts`` restarts.
    """
    import subprocess

    from pickaxe.runs.run import Run

    command = [sys.executable, "-m", "pickaxe.cli", "train", *train_args]
    restarts = 0
    while True:
        code = subprocess.call(command)
        if code in (0, 2):
            return code
        if restarts >= max_restarts:
            print(
                f"pickaxe: error: training crashed (exit {code}) and {max_restarts} restarts are used up; "
                f"`pickaxe resume {run_dir}` continues it",
                file=sys.stderr,
            )
            return 1
        restarts += 1
        message = f"restart {restarts}/{max_restarts} after exit status {code}: resuming from the newest checkpoint"
        if (run_dir / "config.json").is_file():
            Run.open(run_dir).event(message, restart=restarts, exit_status=code)
        else:
            print(f"pickaxe: {message}", file=sys.stderr)
        command = [
            sys.executable,
            "-m",
            "pickaxe.cli",
            "resume",
            str(run_dir),
            *(["--no-progress"] if "--no-progress" in train_args else []),
        ]


def _recipes() -> int:
    from pickaxe.recipes import RECIPES

    width = max(len(name) for name in RECIPES)
    for recipe in RECIPES.values():
        print(f"{recipe.name:<{width}}  {recipe.description}")
    return 0


def _eval(args: list[str]) -> int:
    def eval_command(run_dir: tyro.conf.Positional[str], episodes: int = 10, device: str | None = None) -> None:
        """Evaluate the deterministic policy of a finished run on fresh eval envs."""

    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
        raise PickaxeError("pickaxe eval needs a run directory, e.g. `pickaxe eval runs/cartpole-ppo-...`")
    _tyro(eval_command, args, "pickaxe eval")  # validates and serves --help
    rest, episodes_text = _pop_option(args[1:], "--episodes")
    rest, device = _pop_option(rest, "--device")
    return _evaluate_run(Path(args[0]), int(episodes_text or 10), device)


def _evaluate_run(run_dir: Path, episodes: int, device: str | None) -> int:
    import numpy as np

    from pickaxe.runs.run import Run
    from pickaxe.train.build import config_from_dict, evaluate_run
    from pickaxe.train.config import TrainConfig

    if not (run_dir / "config.json").is_file():
        raise PickaxeError(f"{run_dir} is not a run directory: {run_dir / 'config.json'} is missing")
    cfg = config_from_dict(Run.open(run_dir).config())
    if device is not None:
        cfg.device = device
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    try:
        if not isinstance(cfg, TrainConfig):  # an LLM run: held-out prompts instead of episodes
            from pickaxe.train.llm import evaluate_llm_run

            metrics = evaluate_llm_run(cfg, run_dir, prompts=episodes)
            print(json.dumps({"run_dir": str(run_dir), "prompts": episodes, **metrics}))
            return 0
        returns, lengths = evaluate_run(cfg, run_dir, episodes)
    except FileNotFoundError as e:
        raise PickaxeError(str(e)) from None
    out = {
        "run_dir": str(run_dir),
        "episodes": episodes,
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "length_mean": float(np.mean(lengths)),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
