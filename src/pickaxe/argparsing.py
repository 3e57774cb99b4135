"""How every ``pickaxe`` subcommand parses its options: tyro on a dataclass, each user error one line.

A subcommand declares its options as a dataclass (docstrings become the ``--help`` text); :func:`parse`
checks the flags against the dataclass first (an unknown flag gets the closest known one), then lets tyro
parse and serve ``--help``. tyro's boxed error report becomes one ``ConfigError`` line. Torch-free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import io
import re
import types
import typing
from collections.abc import Iterable
from typing import Any, TypeVar

from pickaxe.config_keys import check_field
from pickaxe.errors import ConfigError

T = TypeVar("T")

HELP_FLAGS = ("-h", "--help")


def wants_help(args: Iterable[str]) -> bool:
    """Whether ``-h`` or ``--help`` is among ``args`` (before any ``--``)."""
    for a in args:
        if a == "--":
            return False
        if a in HELP_FLAGS:
            return True
    return False


def option_flags(cls: type) -> list[str]:
    """The ``--flags`` tyro makes for the (non-positional) fields of dataclass ``cls`` (a nested dataclass field
    ``section`` as ``--section.field``)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    flags: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if _is_positional(hint):
            continue
        flag = "--" + f.name.replace("_", "-")
        if dataclasses.is_dataclass(_base(hint)):  # a nested section: --section.field
            flags += [flag + "." + sub.removeprefix("--") for sub in option_flags(_base(hint))]
            continue
        flags.append(flag)
        if _base(hint) is bool and not _pairs_off(hint):
            flags.append("--no-" + f.name.replace("_", "-"))
    return flags


def _base(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _markers(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()


def _is_positional(hint: Any) -> bool:
    return any("Positional" in repr(m) for m in _markers(hint))


def _pairs_off(hint: Any) -> bool:
    return any("FlagCreatePairsOff" in repr(m) for m in _markers(hint))


def check_flags(args: Iterable[str], known: Iterable[str], prog: str) -> None:
    """Raise one ``ConfigError`` line for the first ``--flag`` in ``args`` that is not in ``known``."""
    known = list(known)
    for a in args:
        if a == "--":
            return
        if not a.startswith("--") or a == "--help":
            continue
        flag = a.partition("=")[0]
        if flag not in known:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}?" if close else f"options: {', '.join(known) or 'none'}"
            raise ConfigError(f"unknown option {flag} for {prog}; {hint} ({prog} --help)")


def reflow(text: str) -> str:
    """A docstring as ``--help`` shows it: each paragraph one line (its indentation and single line breaks gone),
    blank lines between paragraphs and lines opening a ``- `` or ``* `` list item kept."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(text)):
        lines: list[str] = []
        for line in paragraph.split("\n"):
            line = line.strip()
            if lines and not line.startswith(("- ", "* ")):
                lines[-1] += " " + line
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _reflow_help(tyro: Any) -> None:
    """Have tyro show docstrings through :func:`reflow`: its own line joining keeps every break before a line that
    does not open with a letter, which is each line of an indented docstring but the first. Left as it is if a
    tyro version lacks the hook."""
    strings = getattr(tyro, "_strings", None)
    if strings is not None and hasattr(strings, "remove_single_line_breaks"):
        strings.remove_single_line_breaks = reflow


def run_tyro(cls: Any, args: list[str], prog: str, default: Any = None, description: str | None = None) -> Any:
    """``tyro.cli`` whose error report becomes one ``ConfigError`` line; ``--help`` exits 0 as tyro does."""
    import tyro

    _reflow_help(tyro)

    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            return tyro.cli(
                cls, args=args, prog=prog, default=default, description=description, registry=_optional_registry()
            )
    except SystemExit as e:
        if e.code in (0, None):
            raise
        lines = [re.sub(r"[│╭╮╰╯─]|-{3,}", "", ln).strip() for ln in buf.getvalue().splitlines()]
        skip = ("for full helptext", "argument help", "usage:")
        text = " ".join(ln for ln in lines if ln and not ln.lower().startswith(skip))
        # a config's own __post_init__ check reaches tyro as "Value error Error parsing SECTION: MESSAGE"
        text = re.sub(r"Value error (Error parsing [\w.-]+: )?", "", text).strip()
        raise ConfigError(f"{prog}: {text}" if text else f"{prog}: could not parse {' '.join(args)}") from None


def _optional_registry() -> Any:
    """A tyro registry that shows an optional option (``X | None``) by its value's metavar: ``--out STR``, not
    tyro's ``--out {None}|STR`` (``--state [STR [STR ...]]``, not ``{None}|{[STR [STR ...]]}``). The word ``None``
    is still accepted where a field's help offers it (e.g. ``--algo.value-clip None``: no value clipping)."""
    from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec, PrimitiveTypeInfo

    registry = ConstructorRegistry()

    @registry.primitive_rule
    def optional_rule(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
        if typing.get_origin(info.type) not in (typing.Union, types.UnionType):
            return None
        options = typing.get_args(info.type)
        values = [t for t in options if t is not type(None)]
        if len(values) != 1 or len(options) != 2:
            return None
        inner = ConstructorRegistry.get_primitive_spec(PrimitiveTypeInfo.make(values[0], info.markers))
        if not isinstance(inner, PrimitiveConstructorSpec) or inner.nargs not in (1, "*") or inner._action is not None:
            return None  # a fixed count of several words could not also take the one word None
        return PrimitiveConstructorSpec(
            nargs=inner.nargs,
            metavar=inner.metavar,
            instance_from_str=lambda s: None if s == ["None"] else inner.instance_from_str(s),
            is_instance=lambda x: True if x is None else inner.is_instance(x),
            str_from_instance=lambda x: ["None"] if x is None else inner.str_from_instance(x),
            choices=None if inner.choices is None else (*inner.choices, "None"),
        )

    return registry


def parse(cls: type[T], args: list[str], prog: str, description: str | None = None) -> T:
    """Parse ``args`` into dataclass ``cls`` (a subcommand's options): unknown flags, bad values and values
    outside a field's declared range raise one ``ConfigError`` line; ``--help`` prints the usage and raises
    ``SystemExit(0)``."""
    if not wants_help(args):
        check_flags(args, option_flags(cls), prog)
    parsed = run_tyro(cls, list(args), prog, description=description)
    for f in dataclasses.fields(cls):  # the declared ranges (config_keys.ranged) of the options
        if "range" in f.metadata:
            check_field(cls, f.name, getattr(parsed, f.name), "--" + f.name.replace("_", "-"))
    return parsed


def merge_repeated(args: list[str], flag: str, choices: str = "") -> list[str]:
    """``--flag a --flag b`` (or ``--flag=a``) -> ``--flag a b`` at the end: tyro takes a tuple option once. A
    ``--flag`` followed by no value is a one-line ``ConfigError`` (``choices`` says what it takes), never the
    option left out."""
    values: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] == flag:
            i += 1
            start = len(values)
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
            if len(values) == start:
                takes = f": {choices}" if choices else ""
                raise ConfigError(f"{flag} needs at least one value{takes}; give one or leave {flag} out")
            continue
        if args[i].startswith(flag + "="):
            values.append(args[i].split("=", 1)[1])
        else:
            rest.append(args[i])
        i += 1
    return [*rest, flag, *values] if values else rest
