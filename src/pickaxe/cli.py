"""The ``pickaxe`` command: one entry point dispatching to subcommands, each parsed by tyro.

User errors (unknown recipe, command, config key, value type or range, env id) exit with status 2 and one
line on stderr that names the problem and the closest valid choice; there is no traceback for them.
``--help`` on any subcommand prints its usage and exits 0. Commands that do not train (``recipes``,
``plan``, ``set``, ``queue``, ``compare``, ``runs``, ``--help``, ``--version``) never import torch.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from pickaxe.argparsing import merge_repeated, parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.offline.fqe_config import FQEConfig
from pickaxe.subprocesses import NOT_CRASHES

USAGE = """usage: pickaxe COMMAND ...   (pickaxe COMMAND --help for a command's options; pickaxe --version)

commands:
  train RECIPE [--key.sub VALUE ...] [--run-dir DIR] [--overwrite] [--save-every N] [--max-restarts N]
               [--no-progress] [--track wandb|mlflow] [--prometheus-port P]
                                       train a recipe (pickaxe train RECIPE --help lists every key)
  plan RECIPE [--key.sub VALUE ...] [--prompt-tokens N] [--device-gib G] [--json]
                                       per-device memory of an LLM run (weights, gradients, optimizer, activations)
  resume RUN_DIR [--restart] [--no-progress] [--track T] [--prometheus-port P]
                                       continue a run from its newest good checkpoint to its original budget
  eval RUN_DIR [--checkpoints all|best|latest|final|STEP...] [--episodes N] [--device D]
        [--fqe [--fqe.steps N] [--no-env]]
                                       score a run's model, or every kept checkpoint with 95% CIs, alarms, best
                                       (--fqe: also by fitted Q evaluation on the run's dataset, no env needed)
  collect RUN_DIR --episodes N --out DIR [--checkpoint final|best|latest|STEP] [--epsilon E | --noise S]
                                       a Minari dataset of a classic run's policy (offline RL: --data.dataset DIR)
  export RUN_DIR [--out DIR] [--checkpoint final|best|latest|STEP] [--overwrite] [--device D]
                                       an LLM run's policy as a transformers folder for the next stage
  set RUN_DIR KEY=VALUE ...            change a mutable hyper-parameter of a running run (e.g. algo.lr=1e-4)
  runs [DIR]                           list the runs under DIR (default runs) with their state
  sweep RECIPE --key v1,v2 ... [--seeds N] [--workers N] [--sweep-dir DIR] [--backend queue|ray]
                                       grid x seeds through the job queue (or as Ray tasks), then compare
  pipeline NAME [--pipeline-dir DIR] [--seed S] [--workers N] [-- TRAIN FLAGS]
                                       chained stages (rlhf-synthetic: SFT -> RM -> PPO/DPO/...) via the queue
  compare RUN_OR_SWEEP_DIR... [--metric M] [--out DIR] [--min-seeds N]
                                       IQM, bootstrap CIs, probability of improvement, curves
  queue add|list|cancel|retry ...      the persistent job queue
  worker [--slots N] [--until-empty]   run queued jobs
  recipes                              list the recipes
  algos [NAME] [--kind classic|llm]    list the algorithms, their configs and recipes; NAME: its config keys
  ui [RUNS_DIR] [--port P] [--host H]  the local web app: runs, queue, checkpoints, playground, arena
  arena RUN_DIR [--checkpoints STEP...|all] [--prompts N]
                                       generate the blind arena's responses of an LLM run's checkpoints"""

COMMANDS = (
    "train",
    "plan",
    "resume",
    "eval",
    "collect",
    "export",
    "set",
    "runs",
    "sweep",
    "pipeline",
    "compare",
    "queue",
    "worker",
    "recipes",
    "algos",
    "ui",
    "arena",
)


def version() -> str:
    """The installed package's version (``importlib.metadata``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("pickaxe")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(f"pickaxe {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    handlers = {
        "train": _train,
        "plan": _plan,
        "resume": _resume,
        "eval": _eval,
        "collect": _collect,
        "export": _export,
        "set": _set,
        "runs": _runs,
        "sweep": _sweep,
        "pipeline": _pipeline,
        "compare": _compare,
        "queue": _queue,
        "worker": _worker,
        "recipes": _recipes,
        "algos": _algos,
        "ui": _ui,
        "arena": _arena,
    }
    try:
        handler = handlers.get(command)
        if handler is None:
            close = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.0)
            raise PickaxeError(f"unknown command {command!r}; did you mean {close[0]!r}? (pickaxe --help)")
        code = handler(rest)
        sys.stdout.flush()  # a reader that left shows here (handled below), not as a traceback at exit
        return code
    except PickaxeError as e:
        print(f"pickaxe: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # tyro after printing --help
        if e.code in (0, None):
            return 0
        raise
    except BrokenPipeError:  # the reader of stdout left (`pickaxe runs | head`): stop quietly, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return 1
    except KeyboardInterrupt as e:
        if not getattr(e, "reported", False):  # the Trainer already printed where its checkpoint is
            print("pickaxe: interrupted", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------------------ train
TRAIN_USAGE = """usage: pickaxe train RECIPE [--key.sub VALUE ...] [run options]

Train a recipe (`pickaxe recipes` lists them); `pickaxe train RECIPE --help` lists every config key of that
recipe with its default, and the run options: --run-dir DIR, --overwrite, --save-every N, --max-restarts N,
--no-progress, --track wandb|mlflow, --prometheus-port P. --dry-run prints the run's memory plan (`pickaxe plan`)
and exits without training."""


def _train(args: list[str]) -> int:
    from pickaxe.recipes.args import parse_train

    if not args or args[0].startswith("-"):
        if args and args[0] in ("-h", "--help"):
            print(TRAIN_USAGE)
            return 0
        raise PickaxeError("pickaxe train needs a recipe name, e.g. `pickaxe train cartpole-ppo` (`pickaxe recipes`)")
    name = args[0]
    if "--dry-run" in args[1:]:  # the memory plan instead of the run: `pickaxe plan` with the same flags
        return _plan([name, *(a for a in args[1:] if a != "--dry-run")])
    cfg, opts = parse_train(name, args[1:])
    cfg.check()  # every input and value, before torch and the builders are imported (and before a supervisor forks)
    from pickaxe.recipes.datasets import ensure_dataset

    ensure_dataset(cfg)  # an offline recipe given no --data.dataset: its --data.make dataset, made once and cached
    if opts.max_restarts is not None:
        from pickaxe.runs.run import default_run_dir

        run_dir = opts.run_dir or str(default_run_dir(name))
        child = _without_option(args, "--max-restarts")
        child = _without_option(child, "--run-dir")
        return _supervise([*child, "--run-dir", run_dir], Path(run_dir), opts.max_restarts, opts.no_progress)

    from pickaxe.train.build import train

    result, run = train(
        cfg,
        run_dir=opts.run_dir,
        progress=not opts.no_progress,
        track=opts.track,
        prometheus_port=opts.prometheus_port,
        overwrite=opts.overwrite,
        checked=True,
    )
    _print_result(result, run, opts.no_progress)
    return 0


def _without_option(args: list[str], name: str) -> list[str]:
    """``args`` without ``name VALUE`` / ``name=VALUE``."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def _print_result(result: Any, run: Any, quiet: bool) -> None:
    if quiet:  # machine-readable summary; the progress view prints a table instead
        summary = {
            "run_dir": str(run.path),
            "steps": result.steps,
            "wall_s": round(result.wall_s, 2),
            "eval_return": result.eval_return,
        }
        print(json.dumps(summary))


def _supervise(train_args: list[str], run_dir: Path, max_restarts: int, no_progress: bool) -> int:
    """Run training in a child process; restart it from its newest good checkpoint when it crashes.

    Exit status 0 (done), 2 (a user error, or a deliberate stop) and 130 (interrupted by the user: Ctrl-C or
    SIGTERM, after the child checkpointed) end supervision; any other status, a signal included, is a crash
    and costs one of ``max_restarts`` restarts. A restart runs ``pickaxe resume RUN_DIR --restart``, which
    starts over when the crash came before the first checkpoint. A Ctrl-C in the terminal reaches the child
    too; the supervisor waits for it to checkpoint and exit instead of killing it.
    """
    import subprocess

    command = [sys.executable, "-m", "pickaxe.cli", "train", *train_args]
    restarts = 0
    while True:
        child = subprocess.Popen(command)
        with _forward_sigterm(child):
            while True:
                try:
                    code = child.wait()
                    break
                except KeyboardInterrupt:
                    continue  # the child got the same Ctrl-C: it checkpoints and exits 130
        if code in NOT_CRASHES:  # done, user error, or stopped after (or before) checkpointing
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
            from pickaxe.runs.run import Run

            Run.open(run_dir).event(message, restart=restarts, exit_status=code)
        else:
            print(f"pickaxe: {message}", file=sys.stderr)
        command = [sys.executable, "-m", "pickaxe.cli", "resume", str(run_dir), "--restart"]
        command += ["--no-progress"] if no_progress else []


@contextlib.contextmanager
def _forward_sigterm(child: Any) -> Iterator[None]:
    """While supervising, a SIGTERM to the supervisor goes to the child, which checkpoints and exits 130."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------------- plan
PLAN_USAGE = """usage: pickaxe plan RECIPE [--key.sub VALUE ...] [--prompt-tokens N] [--device-gib G] [--json]

The memory an LLM run needs per device and per host, from its config alone (torch is not imported, no model is
loaded): weights, gradients and AdamW state (exact), activations of one micro-batch with and without gradient
checkpointing, the frozen models, FSDP's gathered units and rank 0's unsharded policy, the KV cache of colocated
generation. It reads the flags `pickaxe train RECIPE` takes (--model.shape, --model.path DIR, --dist.learners N,
--dist.shard fsdp, --dist.offload, --model.lora.r, --algo.micro-batch-size, ...) and:
  --prompt-tokens N   prompt length counted in every sequence (default 256; + engine.max_new_tokens)
  --device-gib G      say whether every rank fits a device of G GiB (an "80 GB" H100 has 80 GiB)
  --json              print one JSON object (bytes as integers) instead of the table
Named shapes for --model.shape: {shapes}."""


def _plan(args: list[str]) -> int:
    from pickaxe.models.shapes import SHAPES

    if not args or any(a in ("-h", "--help") for a in args):
        print(PLAN_USAGE.format(shapes=", ".join(SHAPES)))
        if args and not args[0].startswith("-"):
            print(f"`pickaxe train {args[0]} --help` lists the recipe's config keys.")
        return 0 if args else 2
    if args[0].startswith("-"):
        raise PickaxeError("pickaxe plan needs a recipe name, e.g. `pickaxe plan arith-grpo` (`pickaxe recipes`)")
    from pickaxe.recipes.args import parse_train
    from pickaxe.train.plan import plan_memory

    rest, prompt_tokens, device_gib, as_json = plan_options(args[1:])
    cfg, _ = parse_train(args[0], rest, "plan")  # run options (--run-dir, ...) are read and change nothing here
    plan = plan_memory(cfg, prompt_tokens=prompt_tokens, device_gib=device_gib)
    print(json.dumps(plan.to_dict()) if as_json else plan.render())
    return 0


def plan_options(args: list[str]) -> tuple[list[str], int, float | None, bool]:
    """``(the train flags, --prompt-tokens, --device-gib, --json)`` of a ``pickaxe plan`` command line; a missing or
    bad value is a one-line ``ConfigError``."""
    rest: list[str] = []
    prompt_tokens, device_gib, as_json = 256, None, False
    i = 0
    while i < len(args):
        name, eq, inline = args[i].partition("=")
        if name == "--json":
            as_json = True
        elif name in ("--prompt-tokens", "--device-gib"):
            text = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if eq else 1
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if name == "--prompt-tokens":
                if value < 1 or value != int(value):
                    raise ConfigError(f"--prompt-tokens takes a whole number of tokens >= 1, got {text!r}")
                prompt_tokens = int(value)
            else:
                if not 0 < value < float("inf"):
                    raise ConfigError(f"--device-gib takes a device's memory in GiB (> 0, e.g. 80), got {text!r}")
                device_gib = value
        else:
            rest.append(args[i])
        i += 1
    return rest, prompt_tokens, device_gib, as_json


# ----------------------------------------------------------------------------------------------- resume
@dataclass
class ResumeArgs:
    """Continue a run from its newest good checkpoint to its original budget."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    restart: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Start the run over if it has no checkpoint yet (what --max-restarts and queue retries use); without it that is
    an error."""
    no_progress: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """No live progress view; print one JSON summary line at the end."""
    track: tuple[Literal["wandb", "mlflow"], ...] = ()
    """Also send metrics to these trackers."""
    prometheus_port: int | None = ranged(None, ge=1, le=65_535)
    """Serve metrics for Prometheus on 127.0.0.1:PORT."""
    learners: int | None = ranged(None, ge=1, le=4096)
    """Continue on this many data-parallel learners instead of the run's own (a sharded checkpoint is cut into the
    new learners' rows; one learner trains unsharded); recorded in the run's config.json."""
    shard: Literal["none", "fsdp"] | None = None
    """Continue with this --dist.shard instead of the run's own (fsdp needs --learners 2 or more)."""


def _needs_run_dir(args: list[str], command: str) -> None:
    if not wants_help(args) and (not args or args[0].startswith("-")):
        raise PickaxeError(f"pickaxe {command} needs a run directory first, e.g. `pickaxe {command} runs/my-run`")


def _resume(args: list[str]) -> int:
    _needs_run_dir(args, "resume")
    opts = parse(ResumeArgs, args, "pickaxe resume")
    from pickaxe.train.build import resume

    result, run = resume(
        opts.run_dir,
        progress=not opts.no_progress,
        track=opts.track,
        prometheus_port=opts.prometheus_port,
        allow_no_checkpoint=opts.restart,
        learners=opts.learners,
        shard=opts.shard,
    )
    _print_result(result, run, opts.no_progress)
    return 0


# ------------------------------------------------------------------------------------------------- eval
@dataclass
class EvalArgs:
    """Evaluate a run's deterministic policy on fresh eval envs (LLM runs: its held-out prompts).

    By default with the run's own evaluation settings: trainer.eval_episodes episodes, or the LLM run's
    eval.prompts prompts. Without --checkpoints the final model is scored and one JSON line printed; with
    --checkpoints (or --checkpoint) every named checkpoint is scored with 95% CIs into a table,
    RUN_DIR/eval/checkpoints.json, .csv and plots/, cached per checkpoint digest."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    checkpoints: tuple[str, ...] = ()
    """Which kept weights: all, best (the run's selection rule), latest, final, or env steps (several allowed)."""
    checkpoint: str | None = None
    """The same as --checkpoints with one value (kept for older scripts)."""
    episodes: int | None = ranged(None, ge=1)
    """Episodes (LLM runs: prompts) to evaluate; default: the run's own evaluation size."""
    samples: int | None = ranged(None, ge=0)
    """LLM runs: sampled completions per prompt (pass@k, sampled rewards, KL, entropy); default: the run's."""
    pass_k: int | None = ranged(None, ge=1)
    """LLM runs: the k of pass@k; default: the run's."""
    device: str | None = None
    """Device to evaluate on (default: the run's)."""
    no_cache: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Evaluate again even when RUN_DIR/eval/cache holds the results of the same weights and settings."""
    fqe: FQEConfig = field(default_factory=FQEConfig)
    """With --fqe (classic runs, with --checkpoints): also score each checkpoint by fitted Q evaluation on the run's
    dataset (eval/fqe_value, no env needed), with its rank agreement with the online return. Any --fqe.* implies
    --fqe."""
    no_env: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """With --fqe: leave the online evaluation out (FQE alone, as when the env cannot be built here)."""
    select_metric: str | None = None
    """The metric the best checkpoint of this evaluation is picked by (e.g. eval/fqe_value); default: the run's."""


def _eval(args: list[str]) -> int:
    _needs_run_dir(args, "eval")
    args = merge_repeated(args, "--checkpoints", "all, best, latest, final or env steps")
    use_fqe = "--fqe" in args or any(a.startswith("--fqe.") for a in args)
    args = [a for a in args if a != "--fqe"]
    opts = parse(EvalArgs, args, "pickaxe eval")
    from pickaxe.exp.checkpoint_eval import parse_choices  # torch-free, like a fully cached evaluation
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.config import TrainConfig

    choices = None
    if opts.checkpoints or opts.checkpoint is not None:
        choices = parse_choices(opts.checkpoints, "--checkpoints") if opts.checkpoints else []
        if opts.checkpoint is not None:
            choices += parse_choices([opts.checkpoint], "--checkpoint")
    run_dir = Path(opts.run_dir)
    cfg = load_run_config(run_dir)
    if opts.device is not None:
        cfg.device = opts.device
    if isinstance(cfg, TrainConfig):
        if opts.samples is not None or opts.pass_k is not None:
            raise ConfigError(
                f"{run_dir} is a classic run: --samples and --pass-k are for LLM runs (classic runs take --episodes)"
            )
    else:
        cfg.eval.samples = cfg.eval.samples if opts.samples is None else opts.samples
        cfg.eval.pass_k = cfg.eval.pass_k if opts.pass_k is None else opts.pass_k
        if cfg.eval.pass_k > max(cfg.eval.samples, 1) and (opts.samples is not None or opts.pass_k is not None):
            raise ConfigError(f"--pass-k {cfg.eval.pass_k} needs at least as many --samples, got {cfg.eval.samples}")
    multiagent = getattr(type(getattr(cfg, "algo", None)), "multiagent", False)
    if multiagent and use_fqe:
        raise ConfigError(
            f"{run_dir} is a multi-agent run: --fqe scores single-agent policies on a dataset; leave --fqe out "
            "(--checkpoints evaluates every agent and the total in the env)"
        )
    if use_fqe or opts.no_env:
        if choices is None:
            raise ConfigError("--fqe and --no-env score kept checkpoints: add --checkpoints all (or steps)")
        if not use_fqe:
            raise ConfigError("--no-env leaves only an FQE estimate: add --fqe (or leave --no-env out)")
        if not isinstance(cfg, TrainConfig):
            raise ConfigError(f"{run_dir} is an LLM run: --fqe scores classic runs' policies from their dataset")
    if opts.select_metric is not None and choices is None:
        raise ConfigError("--select-metric picks among kept checkpoints: add --checkpoints all (or steps)")
    if choices is not None:
        from pickaxe.exp.checkpoint_eval import main as checkpoints_main

        return checkpoints_main(run_dir, cfg, choices, opts.episodes, cache=not opts.no_cache,
                                fqe=opts.fqe if use_fqe else None, env=not opts.no_env,
                                select_metric=opts.select_metric)  # fmt: skip
    try:
        if not isinstance(cfg, TrainConfig):  # an LLM run: held-out prompts instead of episodes
            from pickaxe.train.llm import evaluate_llm_run

            metrics = evaluate_llm_run(cfg, run_dir, prompts=opts.episodes)
            print(json.dumps({"run_dir": str(run_dir), "checkpoint": "final", **metrics}))
            return 0
        import numpy as np

        episodes = opts.episodes or cfg.trainer.eval_episodes
        if multiagent:
            print(json.dumps(_multiagent_eval(cfg, run_dir, episodes)))
            return 0
        from pickaxe.train.build import evaluate_run

        returns, lengths = evaluate_run(cfg, run_dir, episodes)
    except FileNotFoundError as e:
        raise PickaxeError(str(e)) from None
    out = {
        "run_dir": str(run_dir),
        "checkpoint": "final",
        "episodes": episodes,
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
        "length_mean": float(np.mean(lengths)),
    }
    print(json.dumps(out))
    return 0


def _multiagent_eval(cfg: Any, run_dir: Path, episodes: int) -> dict[str, Any]:
    """``pickaxe eval RUN`` of a multi-agent run: the final model's total return and each agent's, each mean with its
    95% CI (the run's own eval episodes: its last evaluation's numbers when ``episodes`` is the run's)."""
    from pickaxe.train.build import evaluate_multiagent_samples
    from pickaxe.train.multiagent import multiagent_estimates

    values = evaluate_multiagent_samples(cfg, run_dir, episodes)
    out: dict[str, Any] = {"run_dir": str(run_dir), "checkpoint": "final", "episodes": episodes}
    for name, e in multiagent_estimates(values).items():
        if name.endswith("_iqm"):
            continue
        key = name.removeprefix("eval/")
        out.update({key: e.mean, f"{key}_ci_low": e.low, f"{key}_ci_high": e.high})
    out["return_std"] = float(values["return"].std())
    return out


# ---------------------------------------------------------------------------------------------- collect
@dataclass
class CollectArgs:
    """Write a Minari dataset of episodes played by a kept policy of a classic run (expert: the policy as it is;
    medium: an earlier step or --epsilon/--noise; random: --epsilon 1), with the policy's provenance and sha256 and
    the random/expert references of normalised scores in its metadata. Train on it with --data.dataset DIR."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    episodes: int = 100
    """Episodes to write."""
    out: str = ""
    """The dataset folder to write (must not exist, or be empty)."""
    checkpoint: str = "final"
    """Which weights act: final, best, latest, or an env step (a checkpoint or a kept policy)."""
    epsilon: float = 0.0
    """Probability of a uniformly random action instead of the policy's, per step (1: the random dataset)."""
    noise: float = 0.0
    """Box actions: std of Gaussian noise added to the policy's actions, relative to the half-range."""
    seed: int | None = None
    """Seed of the episodes and the noise (default: the run's eval seed)."""
    envs: int = 8
    """Envs played side by side."""
    ref_episodes: int = 10
    """Episodes of the random and expert (the run's best kept policy) references."""
    ref_min: float | None = None
    """The random reference score, instead of measuring it."""
    ref_max: float | None = None
    """The expert reference score, instead of measuring it."""
    device: str = "cpu"


def _collect(args: list[str]) -> int:
    _needs_run_dir(args, "collect")
    opts = parse(CollectArgs, args, "pickaxe collect")
    if not opts.out:
        raise ConfigError("pickaxe collect needs --out DIR, the dataset folder to write")
    if opts.epsilon and opts.noise:
        raise ConfigError("--epsilon and --noise are alternatives: give one")
    if opts.envs < 1 or opts.ref_episodes < 1:
        raise ConfigError("--envs and --ref-episodes must be at least 1")
    from pickaxe.train.collect import collect

    summary = collect(
        opts.run_dir,
        opts.out,
        opts.episodes,
        checkpoint=opts.checkpoint,
        epsilon=opts.epsilon,
        noise=opts.noise,
        seed=opts.seed,
        envs=opts.envs,
        ref_episodes=opts.ref_episodes,
        ref_min=opts.ref_min,
        ref_max=opts.ref_max,
        device=opts.device,
    )
    print(json.dumps(summary))
    return 0


# ----------------------------------------------------------------------------------------------- export
@dataclass
class ExportArgs:
    """Write an LLM run's policy as a standard transformers folder (weights, config, tokenizer) that a later stage
    loads by path (--model.path DIR); LoRA adapters are merged. pickaxe_source.json in it names the run, the
    checkpoint and its env step."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    out: str | None = None
    """Folder to write, completely or not at all (default: RUN_DIR/export, the run's own export, replaced)."""
    checkpoint: str = "final"
    """Which weights: final (model.safetensors), best, latest, or a checkpoint's env step."""
    overwrite: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Replace an earlier export in the --out folder (a folder holding anything else is never replaced)."""
    device: str = "cpu"
    """Device to load the weights on while exporting."""


def _export(args: list[str]) -> int:
    _needs_run_dir(args, "export")
    opts = parse(ExportArgs, args, "pickaxe export")
    if opts.checkpoint not in ("final", "best", "latest") and not opts.checkpoint.isdigit():
        raise ConfigError(f"--checkpoint must be final, best, latest or an env step, got {opts.checkpoint!r}")
    checkpoint: str | int = int(opts.checkpoint) if opts.checkpoint.isdigit() else opts.checkpoint
    run_dir = Path(opts.run_dir)
    if not (run_dir / "config.json").is_file():
        raise PickaxeError(f"{run_dir} is not a run directory (no config.json); pass the folder of an LLM run")
    from pickaxe.models.export import read_export_source
    from pickaxe.train.export import export_run

    try:
        out = export_run(run_dir, opts.out, checkpoint, overwrite=opts.overwrite, device=opts.device)
    except FileNotFoundError as e:
        raise PickaxeError(str(e)) from None
    source = read_export_source(out) or {}
    summary = {"run_dir": str(run_dir), "out": str(out), "checkpoint": opts.checkpoint, "step": source.get("step")}
    print(json.dumps({**summary, "lora_merged": source.get("lora_merged", False)}))
    return 0


# -------------------------------------------------------------------------------------------------- set
@dataclass
class SetArgs:
    """Change mutable hyper-parameters of a running run; it applies them at its next update boundary."""

    run_dir: tyro.conf.Positional[str]
    """The run folder."""
    changes: tyro.conf.Positional[tuple[str, ...]]
    """KEY=VALUE assignments, e.g. algo.lr=1e-4."""


def _set(args: list[str]) -> int:
    if not wants_help(args) and (len(args) < 2 or args[0].startswith("-")):
        raise PickaxeError("usage: pickaxe set RUN_DIR KEY=VALUE [KEY=VALUE ...], e.g. pickaxe set runs/x algo.lr=1e-4")
    opts = parse(SetArgs, args, "pickaxe set")
    from pickaxe.recipes.args import load_run_config
    from pickaxe.train.overrides import mutable_keys, parse_changes, request

    cfg = load_run_config(opts.run_dir)
    changes = parse_changes(list(opts.changes), mutable_keys(cfg.algo))
    path = request(opts.run_dir, changes)
    print(
        f"pickaxe: {', '.join(f'{k}={v!r}' for k, v in changes.items())} queued for {opts.run_dir} "
        f"({path.name}); the run applies it at its next update boundary"
    )
    return 0


# ------------------------------------------------------------------------------------------------- runs
@dataclass
class RunsArgs:
    """List the runs under a folder: state, progress, last eval."""

    dir: tyro.conf.Positional[str] = "runs"
    """Folder holding run folders."""


def _runs(args: list[str]) -> int:
    opts = parse(RunsArgs, args, "pickaxe runs")
    from pickaxe.runs.listing import format_runs, list_runs

    print(format_runs(list_runs(Path(opts.dir))))
    return 0


# ------------------------------------------------------------------------------------- experiments
def _sweep(args: list[str]) -> int:
    from pickaxe.exp.sweep import main_sweep

    return main_sweep(args)


def _pipeline(args: list[str]) -> int:
    from pickaxe.exp.pipeline import main_pipeline

    return main_pipeline(args)


def _compare(args: list[str]) -> int:
    from pickaxe.exp.compare import main_compare

    return main_compare(args)


def _queue(args: list[str]) -> int:
    from pickaxe.exp.queue_cli import main_queue

    return main_queue(args)


def _worker(args: list[str]) -> int:
    from pickaxe.exp.queue_cli import main_worker

    return main_worker(args)


@dataclass
class RecipesArgs:
    """List the recipes (named, complete configs), one per line with a description."""


def _recipes(args: list[str]) -> int:
    parse(RecipesArgs, args, "pickaxe recipes")
    from pickaxe.recipes import RECIPES

    width = max(len(name) for name in RECIPES)
    for recipe in RECIPES.values():
        print(f"{recipe.name:<{width}}  {recipe.description}")
    return 0


@dataclass
class AlgosArgs:
    """List every algorithm (classic and LLM) with its config and the recipes that use it; with NAME, the config
    keys of that algorithm (``--algo.KEY VALUE`` on top of a recipe that uses it) and their defaults."""

    name: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="[NAME]")]] = ""
    """An algorithm's name (e.g. ppo, dqn, grpo); none: list them all."""
    kind: Literal["all", "classic", "llm"] = "all"
    """Only the classic (gymnasium) or only the LLM algorithms."""


def _flag_value(value: Any) -> str:
    """A config default as it is written after its flag (``0.001``, ``True``, ``None``, ``64 64``)."""
    if isinstance(value, tuple | list):
        return " ".join(str(v) for v in value)
    return json.dumps(value) if isinstance(value, dict) else str(value)


def _algos(args: list[str]) -> int:
    parsed = parse(AlgosArgs, args, "pickaxe algos")
    from pickaxe.recipes.algos import algo_catalog

    entries = [e for e in algo_catalog() if parsed.kind in ("all", e.kind)]
    if not parsed.name:
        width = max(len(e.name) for e in entries)
        cwidth = max(len(e.config.__name__) for e in entries)
        for e in entries:
            used = ", ".join(e.recipes) if e.recipes else "(no recipe: pick one of its kind and change --algo.*)"
            print(f"{e.kind:<7}  {e.name:<{width}}  {e.config.__name__:<{cwidth}}  {e.summary}")
            print(f"{'':<7}  {'':<{width}}  {'':<{cwidth}}  recipes: {used}")
        return 0
    chosen = [e for e in entries if e.name == parsed.name]
    if not chosen:
        names = sorted({e.name for e in entries})
        close = difflib.get_close_matches(parsed.name, names, n=1, cutoff=0.0)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise PickaxeError(f"unknown algorithm {parsed.name!r}{hint} (`pickaxe algos` lists all)")
    for e in chosen:
        print(f"{e.name} ({e.kind}, {e.config.__name__}): {e.summary}")
        print(f"  recipes: {', '.join(e.recipes) or '(none)'}")
        for key, default in e.fields():
            print(f"  --algo.{key.replace('_', '-')} {_flag_value(default)}")
    return 0


# ------------------------------------------------------------------------------------------------- ui, arena
def _ui(args: list[str]) -> int:
    from pickaxe.ui.command import main as ui_main

    return ui_main(args)


def _arena(args: list[str]) -> int:
    from pickaxe.ui.arena_command import main as arena_main

    return arena_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
