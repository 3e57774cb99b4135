"""``RECIPE --key.sub VALUE ...`` -> a validated run config plus the run options: what ``pickaxe train`` parses.

The CLI, ``pickaxe sweep`` and ``pickaxe queue add`` (which checks ``pickaxe train`` commands before queueing
them) all use :func:`parse_train`, so a command is judged the same way wherever it is written. Torch-free.

Checks, each one ``ConfigError`` line naming the flag: an unknown key (with the closest one), a value of the
wrong type, a value outside the field's declared range (``pickaxe.config_keys.check_field``), a malformed
``--device``; then tyro parses the flags into the dataclasses and the config's own ``__post_init__`` checks
run. Cross-field checks that need the environment registry or torch (``cfg.check()``) run in ``train()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from pickaxe.argparsing import merge_repeated, run_tyro, wants_help
from pickaxe.config_keys import check_field, leaf_fields, parse_value, ranged
from pickaxe.errors import ConfigError, PickaxeError

KWARGS_KEY = "env.kwargs"
"""A ``dict`` config field set as JSON (``--env.kwargs '{"a": 1}'``) or one key at a time (``--env.kwargs.a 1``)."""

_KWARGS_HELP = (
    "keyword arguments for the env's constructor as a JSON object, e.g. '{\"max_episode_steps\": 50}'; "
    "or one at a time: --env.kwargs.KEY VALUE (VALUE read as JSON, else as a string)"
)


@dataclass
class RunOptions:
    """How ``pickaxe train`` runs the config (none of these change a run's numbers)."""

    run_dir: str | None = None
    """Run folder (default runs/<recipe>-<timestamp>)."""
    overwrite: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Move a run already in --run-dir aside and start a new one there (without it such a folder is refused)."""
    save_every: int | None = ranged(None, ge=0)
    """Same as --trainer.save-every: env steps between checkpoints."""
    max_restarts: int | None = ranged(None, ge=0)
    """Supervise training in a child process and resume it from its checkpoint after a crash, at most N times."""
    no_progress: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """No live progress view; print one JSON summary line at the end."""
    track: tuple[Literal["wandb", "mlflow"], ...] = ()
    """Also send metrics to these trackers."""
    prometheus_port: int | None = ranged(None, ge=1, le=65_535)
    """Serve metrics for Prometheus on 127.0.0.1:PORT."""


RUN_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(RunOptions))


def _flag(key: str) -> str:
    return key.replace("_", "-")


def _pop_kwargs(args: list[str]) -> tuple[list[str], dict[str, Any] | None]:
    """Take ``--env.kwargs JSON`` and ``--env.kwargs.KEY VALUE`` out of ``args``; their merged dict (None: absent)."""
    rest: list[str] = []
    kwargs: dict[str, Any] | None = None
    flag = "--" + _flag(KWARGS_KEY)
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, inline = a.partition("=")
        name = name.replace("_", "-") if name.startswith("--") else name
        if name == flag or name.startswith(flag + "."):
            if eq:
                value = inline
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 1
            else:
                raise ConfigError(f"{name} needs a value, e.g. {flag} '{{\"max_episode_steps\": 50}}'")
            kwargs = {} if kwargs is None else kwargs
            if name == flag:
                try:
                    parsed = json.loads(value)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{flag} takes a JSON object, got {value!r} ({e.msg})") from None
                if not isinstance(parsed, dict):
                    raise ConfigError(
                        f"{flag} takes a JSON object such as '{{\"max_episode_steps\": 50}}', got {value!r}"
                    )
                kwargs.update(parsed)
            else:
                key = a[len(flag) + 1 :].partition("=")[0]
                try:
                    kwargs[key] = json.loads(value)
                except json.JSONDecodeError:
                    kwargs[key] = value  # a bare word is a string
        else:
            rest.append(a)
        i += 1
    return rest, kwargs


def _values(args: list[str], i: int, inline: str | None) -> list[str]:
    if inline is not None:
        return [inline]
    out = []
    for a in args[i + 1 :]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def validate_flags(cfg: Any, args: list[str], prog: str) -> None:
    """One-line errors for unknown keys, badly typed values and values outside their field's range."""
    leaves = {_flag(k): v for k, v in leaf_fields(cfg).items()}
    for key, (owner, name, hint) in list(leaves.items()):
        if hint is bool:  # tyro's --x.no-flag form
            head, _, last = key.rpartition(".")
            leaves[f"{head}.no-{last}" if head else f"no-{last}"] = (owner, name, hint)
    hints = typing.get_type_hints(RunOptions)
    options = {_flag(n): (RunOptions, n, hints[n]) for n in RUN_OPTION_FIELDS}
    known = {**leaves, **options}
    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg == "--help":
            continue
        flag, eq, inline = arg[2:].partition("=")
        flag = flag.replace("_", "-")
        if flag not in known:
            close = difflib.get_close_matches(flag, list(known), n=1, cutoff=0.4)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ConfigError(f"unknown config key --{flag}{hint} ({prog} --help lists all keys)")
        owner, name, hint_type = known[flag]
        texts = _values(args, i, inline if eq else None)
        base = typing.get_args(hint_type)[0] if typing.get_origin(hint_type) is typing.Annotated else hint_type
        if base is bool and not texts:
            continue  # a flag
        if not texts:
            raise ConfigError(f"--{flag} needs a value")
        if _is_tuple(base):
            elem = next((a for a in typing.get_args(_strip_none(base)) if a is not Ellipsis), str)
            value: Any = tuple(parse_value("--" + flag, elem, t) for t in texts)
        else:
            value = parse_value("--" + flag, base, texts[0])
        check_field(owner, name, value, "--" + flag)


def _bool_words_to_flags(cfg: Any, args: list[str]) -> list[str]:
    """``--algo.flag False`` / ``--algo.flag=true`` -> tyro's ``--algo.no-flag`` / ``--algo.flag``."""
    bools = {_flag(k) for k, (_, _, hint) in leaf_fields(cfg).items() if hint is bool}
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, inline = a[2:].partition("=") if a.startswith("--") else ("", "", "")
        flag = flag.replace("_", "-")
        word = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        if flag in bools and word.lower() in ("true", "false"):
            head, _, last = flag.rpartition(".")
            out.append(f"--{flag}" if word.lower() == "true" else (f"--{head}.no-{last}" if head else f"--no-{last}"))
            i += 1 if eq else 2
            continue
        out.append(a)
        i += 1
    return out


def _strip_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _is_tuple(hint: Any) -> bool:
    return typing.get_origin(_strip_none(hint)) is tuple


def _concrete_type(cfg: Any) -> type:
    """A subclass of ``type(cfg)`` that tyro can read: ``Any``-typed config fields (``algo``) carry their value's
    type, and the ``env.kwargs`` dict is left out (it is parsed as JSON beforehand)."""
    hints = typing.get_type_hints(type(cfg))
    special: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cfg):
        value, hint = getattr(cfg, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            sub = _concrete_type(value)
            if hint is Any or sub is not type(value):
                special.append((f.name, sub, dataclasses.field(default_factory=sub)))
        elif typing.get_origin(hint) is dict:  # parsed beforehand (_pop_kwargs); shown in --help as JSON text
            shown = Annotated[str, tyro.conf.arg(metavar="JSON", help=_KWARGS_HELP)]
            special.append((f.name, shown, dataclasses.field(default=json.dumps(value))))
    if not special:
        return type(cfg)
    # the real config class checks the parsed values (_from_cli); this stand-in only carries them
    namespace = {"__post_init__": _no_check, "__doc__": type(cfg).__doc__}
    return dataclasses.make_dataclass(type(cfg).__name__, special, bases=(type(cfg),), namespace=namespace)


def _no_check(self: Any) -> None:
    """The CLI stand-in of a config class skips the config's checks."""


def _to_cli(cli_type: type, cfg: Any) -> Any:
    """``cfg`` as an instance of its CLI type (nested configs converted too)."""
    kwargs = {}
    hints = typing.get_type_hints(cli_type, include_extras=True)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        target = hints.get(f.name)
        if dataclasses.is_dataclass(value) and isinstance(target, type) and target is not type(value):
            value = _to_cli(target, value)
        elif isinstance(value, dict):
            value = json.dumps(value)
        kwargs[f.name] = value
    return cli_type(**kwargs)


def _from_cli(template: Any, parsed: Any) -> Any:
    """The parsed CLI instance back as the config's own types (template: the recipe's config)."""
    kwargs = {}
    for f in dataclasses.fields(template):
        value = getattr(parsed, f.name)
        if dataclasses.is_dataclass(value):
            value = _from_cli(getattr(template, f.name), value)
        elif isinstance(getattr(template, f.name), dict):
            value = dict(getattr(template, f.name))
        kwargs[f.name] = value
    return type(template)(**kwargs)


def _with_options(cli_type: type) -> type:
    """``cli_type`` plus the :class:`RunOptions` fields, so ``--help`` lists them with the config keys."""
    hints = typing.get_type_hints(RunOptions, include_extras=True)
    extra = [(f.name, hints[f.name], field(default=f.default)) for f in dataclasses.fields(RunOptions)]
    namespace = {"__post_init__": _no_check, "__doc__": cli_type.__doc__}
    return dataclasses.make_dataclass(cli_type.__name__, extra, bases=(cli_type,), namespace=namespace)


SHAPE_FLAGS = ("--model.arch", "--model.hidden", "--model.layers", "--model.heads", "--model.kv-heads",
               "--model.intermediate")  # fmt: skip
"""The flags a named ``--model.shape`` sets (``LMConfig.SHAPE_FIELDS``)."""


def check_shape_flags(args: list[str]) -> None:
    """``--model.shape`` sets the tiny model's shape fields: one of them given too is a one-line ``ConfigError``."""
    names = [a.partition("=")[0].replace("_", "-") for a in args if a.startswith("--")]
    if "--model.shape" not in names:
        return
    clash = next((n for n in names if n in SHAPE_FLAGS), None)
    if clash is not None:
        raise ConfigError(f"--model.shape sets {clash[2:]}; drop {clash} (or --model.shape to set the fields yourself)")


def parse_train(recipe: str, args: list[str], command: str = "train") -> tuple[Any, RunOptions]:
    """The config of ``recipe`` with the flags in ``args`` applied, and the run options.

    ``--help`` prints every config key and run option and raises ``SystemExit(0)``. User errors raise
    ``ConfigError``/``PickaxeError`` with one line, named as ``pickaxe COMMAND RECIPE`` (``train``, ``plan``).
    """
    from pickaxe.recipes import get_recipe

    return parse_config(get_recipe(recipe), args, f"pickaxe {command} {recipe}")


def parse_config(cfg: Any, args: list[str], prog: str) -> tuple[Any, RunOptions]:
    """``cfg`` (a run config, not changed) with the flags in ``args`` applied, and the run options: what
    :func:`parse_train` does to a recipe's config, and ``pickaxe.train`` to a config or recipe with overrides. ``prog``
    names the command in messages."""
    recipe = cfg.recipe
    args, kwargs = _pop_kwargs(list(args))
    args = merge_repeated(args, "--track")
    if not wants_help(args):
        validate_flags(cfg, args, prog)
        check_shape_flags(args)
        args = _bool_words_to_flags(cfg, args)
    base = _concrete_type(cfg)
    cli_type = _with_options(base)
    as_cli = _to_cli(base, cfg)
    default = cli_type(
        **{f.name: getattr(as_cli, f.name) for f in dataclasses.fields(cfg)},
        **{n: getattr(RunOptions(), n) for n in RUN_OPTION_FIELDS},
    )
    try:
        parsed = run_tyro(cli_type, args, prog, default=default)
        options = RunOptions(**{n: getattr(parsed, n) for n in RUN_OPTION_FIELDS})
        cfg = _from_cli(cfg, parsed)
        if options.save_every is not None:
            cfg.trainer.save_every = options.save_every
        if kwargs is not None:
            if not hasattr(getattr(cfg, "env", None), "kwargs"):
                raise ConfigError(
                    f"recipe {recipe!r} has no --{_flag(KWARGS_KEY)} (its env takes no keyword arguments)"
                )
            cfg.env.kwargs = {**cfg.env.kwargs, **kwargs}
            cfg.env.__post_init__()
    except (TypeError, ValueError) as e:
        if isinstance(e, PickaxeError):
            raise
        raise ConfigError(f"{prog}: {e}") from None
    return cfg, options


def check_train_command(argv: list[str]) -> bool:
    """If ``argv`` is a ``pickaxe train RECIPE ...`` command line (``pickaxe`` or ``python -m pickaxe.cli``),
    check it as ``pickaxe train`` would (raising one ``ConfigError`` line) and return True; else False."""
    words = list(argv)
    if len(words) >= 3 and words[1] == "-m" and words[2] in ("pickaxe.cli", "pickaxe"):
        words = words[3:]
    elif words and Path(words[0]).name == "pickaxe":
        words = words[1:]
    else:
        return False
    if not words or words[0] != "train":
        return False
    if len(words) < 2 or words[1].startswith("-"):
        raise ConfigError("pickaxe train needs a recipe name, e.g. `pickaxe train cartpole-ppo` (`pickaxe recipes`)")
    parse_train(words[1], words[2:])
    return True


def load_run_config(run_dir: str | Path) -> Any:
    """A run folder's config (``config.json``) as its config type, without importing torch."""
    from pickaxe.train.config import TrainConfig
    from pickaxe.train.llm_config import LLMTrainConfig

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise PickaxeError(f"{run_dir} is not a run directory: {path} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PickaxeError(f"cannot read {path}: {e}") from None
    kinds = {"classic": TrainConfig, "llm": LLMTrainConfig}
    kind = data.get("kind", "classic") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ConfigError(f"unknown config kind {kind!r} in {path}; known: {sorted(kinds)}")
    return kinds[kind].from_dict(data)
