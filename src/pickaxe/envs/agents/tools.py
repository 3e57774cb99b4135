"""Tools an LLM agent can call: a calculator, a key-value lookup, a sandboxed Python interpreter, and the ToolBox
that validates a model's calls, runs them (several at once in threads) and turns every mistake into a result the
model can read instead of an exception."""

from __future__ import annotations

import ast
import decimal
import difflib
import importlib
import json
import math
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

from pickaxe.envs.agents.sandbox import Executor, ProcessSandbox, SandboxLimits
from pickaxe.supplied import resolve, supplied

TOOL_NAMES: tuple[str, ...] = ("calculator", "lookup", "python")


@dataclass
class ToolResult:
    """What one call gives back. ``text`` goes to the model; ``error`` is a short kind when ``ok`` is False
    (``"unknown_tool"``, ``"bad_arguments"``, ``"tool_error"``, ``"not_found"``, ``"math_error"``, or a sandbox
    status such as ``"timeout"`` and ``"blocked"``)."""

    text: str
    ok: bool
    error: str | None = None
    duration_s: float = field(default=0.0, compare=False)  # timing is not part of what a result says


class Tool(Protocol):
    """A callable tool: ``parameters`` is the JSON schema of its arguments object."""

    name: str
    description: str
    parameters: dict[str, Any]

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Run with already validated arguments."""
        ...


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The tool in the OpenAI function format that ``tokenizer.apply_chat_template(tools=...)`` takes."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def _object_schema(**properties: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k: {"type": t, "description": d} for k, (t, d) in properties.items()},
        "required": list(properties),
        "additionalProperties": False,
    }


# ----------------------------------------------------------------------------------------------------- calculator

MAX_DIGITS = 4000  # below Python's default int-to-str limit (4300 digits), so every result can be printed
MAX_EXPRESSION_CHARS = 2000
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is shown to the model."""


def _digits(x: Fraction) -> int:
    """Upper bound on the decimal digits of the numerator and denominator (bit length x log10(2), rounded up)."""
    return max(abs(x.numerator).bit_length(), x.denominator.bit_length()) * 30103 // 100000 + 1


def _check_size(x: Fraction) -> Fraction:
    if _digits(x) > MAX_DIGITS + 1:
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    return x


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("only whole-number exponents are supported (exact arithmetic: no roots)")
    e = exponent.numerator
    if base == 0 and e < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if abs(base.numerator) > 1 or base.denominator > 1:
        if abs(e) * max(math.log10(abs(base.numerator) or 1), math.log10(base.denominator)) > MAX_DIGITS:
            raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")
    elif abs(e) > 10**9:  # 1, -1 and 0 to a huge power: cheap, but keep the exponent sane
        raise CalculatorError("exponent too large")
    return _check_size(base**e)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"unsupported value {value!r}: only numbers")
        if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
            raise CalculatorError("number out of range")
        # repr of a float literal is its shortest round-trip text: 0.1 stays 1/10, not the binary double
        return _check_size(Fraction(value) if isinstance(value, int) else Fraction(repr(value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        x = _evaluate(node.operand)
        return -x if isinstance(node.op, ast.USub) else x
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("'^' is not supported: write powers as a ** b")
        if isinstance(node.op, ast.Pow):
            return _power(_evaluate(node.left), _evaluate(node.right))
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"unsupported operator {type(node.op).__name__}: use + - * / // % ** and brackets")
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        return _check_size(Fraction(fn(left, right)))
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name {node.id!r}: only numbers and + - * / // % ** ( )")
    if isinstance(node, ast.Call):
        raise CalculatorError("function calls are not supported: only numbers and + - * / // % ** ( )")
    raise CalculatorError(f"unsupported syntax ({type(node).__name__}): only numbers and + - * / // % ** ( )")


def calculate(expression: str) -> Fraction:
    """Evaluate an arithmetic expression exactly; raises ``CalculatorError`` with a one-line reason."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression too long ({len(expression)} > {MAX_EXPRESSION_CHARS} characters)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:  # ValueError: an integer literal over Python's digit limit
        raise CalculatorError(f"not a valid expression: {getattr(e, 'msg', e)}") from None
    try:
        return _evaluate(tree)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(x: Fraction) -> str:
    """Integers as integers; a fraction whose decimal expansion ends as that exact decimal (``0.25``); any other
    fraction as ``p/q`` reduced, followed by a 12-significant-digit decimal (``1/3 (≈ 0.333333333333)``)."""
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    twos = fives = 0
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d == 1:  # terminating: scale to an integer over 10**places
        places = max(twos, fives)
        scaled = abs(x.numerator) * 10**places // x.denominator
        digits = str(scaled).rjust(places + 1, "0")
        return ("-" if x < 0 else "") + digits[:-places] + "." + digits[-places:]
    with decimal.localcontext() as ctx:
        ctx.prec = 12
        approx = decimal.Decimal(x.numerator) / decimal.Decimal(x.denominator)
    return f"{x.numerator}/{x.denominator} (≈ {approx})"


class Calculator:
    """Exact arithmetic on integers and fractions (``+ - * / // % **``, unary minus, brackets); no names or calls.

    Results: see ``format_number``. Limits: numbers up to ``MAX_DIGITS`` digits (so ``9**9**9`` is refused at once
    rather than computed), whole-number exponents only, expressions up to ``MAX_EXPRESSION_CHARS`` characters.
    """

    name = "calculator"
    description = (
        "Exact arithmetic. Supports + - * / // % ** and parentheses on integers and decimals; "
        "fractions are kept exact (1/3 stays 1/3)."
    )
    parameters = _object_schema(expression=("string", "the arithmetic expression, e.g. (12 + 7) * 3 / 4"))

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Evaluate ``arguments["expression"]``."""
        try:
            return ToolResult(format_number(calculate(str(arguments["expression"]))), True)
        except CalculatorError as e:
            return ToolResult(f"error: {e}", False, "math_error")


# ---------------------------------------------------------------------------------------------------------- lookup


def load_corpus(path: str | Path) -> dict[str, str]:
    """Read a lookup corpus: a ``.json`` object of key -> value, or ``.jsonl`` rows ``{"key": ..., "value": ...}``.
    Non-string values are stored as their JSON text."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"lookup corpus {path} does not exist; pass a .json or .jsonl file")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"lookup corpus {path} must hold a JSON object of key -> value")
            return {str(k): _as_text(v) for k, v in data.items()}
        if path.suffix == ".jsonl":
            corpus: dict[str, str] = {}
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or "key" not in row or "value" not in row:
                    raise ValueError(f"lookup corpus {path} line {n}: each row must be {{'key': ..., 'value': ...}}")
                corpus[str(row["key"])] = _as_text(row["value"])
            return corpus
    except json.JSONDecodeError as e:
        raise ValueError(f"lookup corpus {path} is not valid JSON ({e}); fix the file") from None
    raise ValueError(f"lookup corpus {path} must end in .json or .jsonl")


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _normal(key: str) -> str:
    return " ".join(key.casefold().split())


class Lookup:
    """Look a key up in a corpus (a mapping, or a .json / .jsonl path, see ``load_corpus``).

    An exact key wins; otherwise a key equal up to case and spacing. A miss is ``ok=False`` with text naming the
    key and up to three close keys (close-key suggestions only for corpora up to 50,000 keys, to stay fast).
    Values are cut to ``max_chars``.
    """

    name = "lookup"
    description = "Look up the entry for a key in a reference table."
    parameters = _object_schema(key=("string", "the key to look up"))

    def __init__(self, corpus: Mapping[str, str] | str | Path, max_chars: int = 2000) -> None:
        self.corpus: dict[str, str] = (
            load_corpus(corpus) if isinstance(corpus, (str, Path)) else {str(k): _as_text(v) for k, v in corpus.items()}
        )
        self.max_chars = max_chars
        self._normalised = {}
        for k in self.corpus:
            self._normalised.setdefault(_normal(k), k)

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Return the value stored under ``arguments["key"]``."""
        key = str(arguments["key"])
        found = key if key in self.corpus else self._normalised.get(_normal(key))
        if found is not None:
            value = self.corpus[found]
            if len(value) > self.max_chars:
                value = value[: self.max_chars] + f"\n[... truncated at {self.max_chars} characters]"
            return ToolResult(value, True)
        close = difflib.get_close_matches(key, list(self.corpus), n=3) if len(self.corpus) <= 50_000 else []
        hint = "; closest keys: " + ", ".join(repr(k) for k in close) if close else ""
        return ToolResult(f"no entry for {key!r}{hint}", False, "not_found")


# ---------------------------------------------------------------------------------------------------------- python


class PythonTool:
    """Run a Python program through an ``Executor`` (default: a ``ProcessSandbox``) under ``limits``; the text is
    what the program printed, plus the end of its traceback and a status note when it failed or was stopped."""

    name = "python"
    description = (
        "Run a Python 3 program (standard library only, no network, no files outside its own folder) "
        "and return what it prints. Use print() to see results."
    )
    parameters = _object_schema(code=("string", "the complete Python program to run"))

    def __init__(self, executor: Executor | None = None, limits: SandboxLimits | None = None) -> None:
        self.executor: Executor = executor if executor is not None else ProcessSandbox()
        self.limits = limits if limits is not None else SandboxLimits()

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        """Run ``arguments["code"]``."""
        result = self.executor.run(str(arguments["code"]), self.limits)
        text = result.text() or "(no output: use print() to show results)"
        ok = result.status == "ok"
        return ToolResult(text, ok, None if ok else result.status, result.duration_s)


# --------------------------------------------------------------------------------------------------------- toolbox

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict, Mapping),
}


def _example(tool: Tool) -> str:
    props = tool.parameters.get("properties", {})
    return json.dumps({k: "..." if v.get("type") == "string" else 0 for k, v in props.items()})


def _check_arguments(tool: Tool, arguments: Any) -> tuple[dict[str, Any] | None, str]:
    """The arguments as a dict, or None and a one-line reason the model can act on."""
    usage = f"call {tool.name} with arguments like {_example(tool)}"
    if isinstance(arguments, (str, bytes)):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as e:
            return None, f"arguments are not valid JSON ({e}); {usage}"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}; {usage}"
    schema = tool.parameters
    props: Mapping[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return None, f"missing argument {', '.join(repr(k) for k in missing)}; {usage}"
    if schema.get("additionalProperties", True) is False:
        extra = [k for k in arguments if k not in props]
        if extra:
            return None, f"unknown argument {', '.join(repr(str(k)) for k in extra)}; {usage}"
    for key, value in arguments.items():
        kind = props.get(key, {}).get("type")
        types = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        if types is None:
            continue
        wrong = not isinstance(value, types) or (kind in ("integer", "number") and isinstance(value, bool))
        if wrong:
            return None, f"argument {key!r} must be a {kind}, got {type(value).__name__}; {usage}"
    return dict(arguments), ""


class ToolBox:
    """The tools of one environment, by name. ``call`` never raises for a model's mistake (unknown tool, arguments
    that are not an object, missing / extra / wrongly typed arguments) nor for a tool that raises: each becomes
    ``ok=False`` with one line of text the model can learn from. ``call_many`` runs calls in a thread pool of
    ``max_workers`` (the python tool's work happens in child processes, so threads are enough)."""

    def __init__(self, tools: Sequence[Tool], max_workers: int = 8) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}; pass a positive number of threads")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; give each tool a distinct name")
            self.tools[tool.name] = tool
        self.max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's ``tool_schema``, in order (for ``apply_chat_template(tools=...)``)."""
        return [tool_schema(t) for t in self.tools.values()]

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Run one call; ``arguments`` may be a mapping or its JSON text. Never raises."""
        start = time.perf_counter()
        result = self._call(name, arguments)
        result.duration_s = time.perf_counter() - start
        return result

    def _call(self, name: Any, arguments: Any) -> ToolResult:
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            choices = ", ".join(self.tools) or "none"
            return ToolResult(f"unknown tool {name!r}; available tools: {choices}", False, "unknown_tool")
        checked, reason = _check_arguments(tool, arguments)
        if checked is None:
            return ToolResult(reason, False, "bad_arguments")
        try:
            result = tool(checked)
        except Exception as e:  # a broken tool must not stop training; the model sees one line
            message = " ".join(str(e).split())[:300]
            return ToolResult(f"tool error: {type(e).__name__}: {message}", False, "tool_error")
        if not isinstance(result, ToolResult):
            return ToolResult(f"tool error: {name} returned {type(result).__name__}", False, "tool_error")
        return result

    def call_many(self, calls: Sequence[tuple[str, Any]]) -> list[ToolResult]:
        """Run the calls concurrently; results in the order of ``calls``, each with its own ``duration_s``."""
        if len(calls) <= 1 or self.max_workers == 1:
            return [self.call(name, args) for name, args in calls]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="pickaxe-tools")
        futures = [self._pool.submit(self.call, name, args) for name, args in calls]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the thread pool (a later ``call_many`` starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> ToolBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_tools(
    names: Sequence[str],
    corpus: str | None = None,
    limits: SandboxLimits | None = None,
    max_workers: int = 8,
    extra: Mapping[str, Tool] | None = None,
) -> ToolBox:
    """A ToolBox from config names (``TOOL_NAMES``, or a name of ``extra``: the user's own tools, by name);
    ``lookup`` needs ``corpus`` (a .json / .jsonl path)."""
    tools: list[Tool] = []
    extra = extra or {}
    for name in names:
        if name in extra:
            tools.append(extra[name])
        elif name not in TOOL_NAMES:
            raise ValueError(f"unknown tool {name!r}; choose from {', '.join(TOOL_NAMES)}")
        if name == "calculator":
            tools.append(Calculator())
        elif name == "lookup":
            if not corpus:
                raise ValueError("the lookup tool needs a corpus: set --agent.corpus to a .json or .jsonl file")
            tools.append(Lookup(corpus))
        else:
            tools.append(PythonTool(limits=limits))
    return ToolBox(tools, max_workers=max_workers)


# ---------------------------------------------------------------------------------------------------- user tools


def check_tool(tool: Any) -> str:
    """The name of a user-written tool, checked to be one (``name``, ``description``, a ``parameters`` object schema
    and ``__call__``); a one-line ``ValueError`` naming what is missing otherwise."""
    missing = [a for a in ("name", "description", "parameters") if not hasattr(tool, a)]
    if missing or not callable(tool):
        what = ", ".join(missing + ([] if callable(tool) else ["__call__"]))
        raise ValueError(
            f"{tool!r} is not a tool: it needs {what} (see pickaxe.envs.agents.tools.Tool: name, description, a JSON "
            "schema `parameters` and __call__(arguments) -> ToolResult)"
        )
    if tool.name in TOOL_NAMES:
        raise ValueError(f"tool name {tool.name!r} is a built-in tool's; name yours otherwise")
    if not isinstance(tool.parameters, dict) or tool.parameters.get("type") != "object":
        raise ValueError(
            f"tool {tool.name!r}: parameters must be a JSON schema of an object ({{'type': 'object', ...}})"
        )
    return str(tool.name)


def supplied_tools(tools: Mapping[str, Tool]) -> AbstractContextManager[None]:
    """Within the block, runs built here find ``agent.python_tools`` among these (name -> tool)."""
    return supplied("tool", tools)


def python_tools(records: Sequence[str]) -> dict[str, Tool]:
    """Each ``NAME=MODULE:QUALNAME`` record of ``agent.python_tools``: the tool passed again, or imported by that path
    (a class is instantiated with no arguments)."""

    def load(path: str) -> Tool:
        module, _, qualname = path.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj() if isinstance(obj, type) else obj

    return resolve("tool", records, load, "tools")
