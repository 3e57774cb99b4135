"""The agents' tools: exact calculator answers, lookups, and a ToolBox that turns every model mistake or tool
failure into a result instead of an exception, running calls concurrently in order."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pickaxe.envs.agents import tools
from pickaxe.envs.agents.sandbox import SandboxLimits, SandboxResult
from pickaxe.envs.agents.tools import (
    TOOL_NAMES,
    Calculator,
    Lookup,
    PythonTool,
    ToolBox,
    ToolResult,
    make_tools,
    tool_schema,
)

# ---------------------------------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("987654321*123456789", "121932631112635269"),
        ("123456789123456789 * 987654321987654321", "121932631356500531347203169112635269"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-2 ** 2", "-4"),  # ** binds tighter than unary minus, as in Python
        ("2 ** 3 ** 2", "512"),  # right-associative
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("1 / 4", "0.25"),  # terminating decimals print exactly
        ("-7 / 8", "-0.875"),
        ("0.1 + 0.2", "0.3"),  # decimal literals are exact, not binary floats
        ("2 ** -2", "0.25"),
        ("6 / 3", "2"),
        ("1 / 3", "1/3 (≈ 0.333333333333)"),  # other fractions: reduced p/q and a 12-digit decimal
        ("22 / 7", "22/7 (≈ 3.14285714286)"),
        ("4 / 6", "2/3 (≈ 0.666666666667)"),
    ],
)
def test_calculator_exact_answers(expression: str, answer: str) -> None:
    assert Calculator()({"expression": expression}) == ToolResult(answer, True)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("9**9**9", "result too large"),
        ("10 ** 100000", "result too large"),
        ("__import__('os')", "function calls are not supported"),
        ("abs(-2)", "function calls are not supported"),
        ("x + 1", "unknown name 'x'"),
        ("(1).__class__", "unsupported syntax"),
        ("2 ^ 3", "write powers as a ** b"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 0.5", "whole-number exponents"),
        ("'a' * 3", "only numbers"),
        ("3 -", "not a valid expression"),
        ("1" * 3000, "expression too long"),
    ],
)
def test_calculator_errors_are_results(expression: str, reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []  # the size in bits of every value the calculator made and then checked

    def check_size(x: Fraction) -> Fraction:
        built.append(max(abs(x.numerator).bit_length(), x.denominator.bit_length()))
        return size_check(x)

    size_check = tools._check_size
    monkeypatch.setattr(tools, "_check_size", check_size)
    result = Calculator()({"expression": expression})
    assert all(bits <= 4 * tools.MAX_DIGITS for bits in built), built  # refused, not computed first
    assert not result.ok and result.error == "math_error"
    assert result.text.startswith("error: ") and reason in result.text


# -------------------------------------------------------------------------------------------------------- lookup

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "New Zealand": "Wellington"}


def test_lookup_hit_and_miss() -> None:
    lookup = Lookup(CAPITALS)
    assert lookup({"key": "Japan"}) == ToolResult("Tokyo", True)
    assert lookup({"key": "  new   zealand "}) == ToolResult("Wellington", True)  # case and spacing
    miss = lookup({"key": "Frnace"})
    assert (miss.ok, miss.error) == (False, "not_found")
    assert miss.text == "no entry for 'Frnace'; closest keys: 'France'"
    assert lookup({"key": "Mars"}).text == "no entry for 'Mars'"


def test_lookup_file_formats(tmp_path: Path) -> None:
    as_json = tmp_path / "capitals.json"
    as_json.write_text(json.dumps({**CAPITALS, "numbers": [1, 2]}))
    as_jsonl = tmp_path / "capitals.jsonl"
    as_jsonl.write_text("\n".join(json.dumps({"key": k, "value": v}) for k, v in CAPITALS.items()) + "\n\n")
    assert Lookup(as_json)({"key": "France"}).text == "Paris"
    assert Lookup(str(as_json))({"key": "numbers"}).text == "[1, 2]"
    assert Lookup(as_jsonl)({"key": "New Zealand"}).text == "Wellington"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("list.json", "[1, 2]", "must hold a JSON object"),
        ("broken.json", "{", "is not valid JSON"),
        ("rows.jsonl", '{"k": 1}', "line 1: each row must be"),
        ("table.csv", "a,b", "must end in .json or .jsonl"),
    ],
)
def test_lookup_bad_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        Lookup(path)
    with pytest.raises(ValueError, match="does not exist"):
        Lookup(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------------------- toolbox


class Broken:
    """A tool that raises."""

    name = "broken"
    description = "always fails"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        raise RuntimeError("disk on fire\nsecond line")


@pytest.fixture
def box() -> ToolBox:
    return ToolBox([Calculator(), Lookup(CAPITALS), Broken()])


@pytest.mark.parametrize(
    ("name", "arguments", "error", "text"),
    [
        (
            "calc",
            {"expression": "1"},
            "unknown_tool",
            "unknown tool 'calc'; available tools: calculator, lookup, broken",
        ),
        (None, {}, "unknown_tool", "unknown tool None"),
        ("calculator", [1], "bad_arguments", "arguments must be a JSON object, got list"),
        ("calculator", "{oops", "bad_arguments", "arguments are not valid JSON"),
        ("calculator", {}, "bad_arguments", "missing argument 'expression'"),
        ("calculator", {"expression": "1", "x": 2}, "bad_arguments", "unknown argument 'x'"),
        ("calculator", {"expression": 12}, "bad_arguments", "argument 'expression' must be a string, got int"),
        ("broken", {}, "tool_error", "tool error: RuntimeError: disk on fire second line"),
    ],
)
def test_toolbox_never_raises(box: ToolBox, name: Any, arguments: Any, error: str, text: str) -> None:
    result = box.call(name, arguments)
    assert (result.ok, result.error) == (False, error)
    assert result.text.startswith(text) and "\n" not in result.text
    if error == "bad_arguments":  # the model is shown how to call it
        assert result.text.endswith('call calculator with arguments like {"expression": "..."}')


def test_toolbox_accepts_json_text_arguments(box: ToolBox) -> None:
    result = box.call("calculator", '{"expression": "6 * 7"}')
    assert (result.text, result.ok) == ("42", True)
    assert result.duration_s > 0


def test_schemas(box: ToolBox) -> None:
    schemas = box.schemas()
    assert [s["function"]["name"] for s in schemas] == ["calculator", "lookup", "broken"]
    calc = tool_schema(Calculator())
    assert calc["type"] == "function"
    assert calc["function"]["parameters"]["required"] == ["expression"]
    assert calc["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    json.dumps(schemas)  # plain JSON, as chat templates need


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        ToolBox([Calculator(), Calculator()])


class Rendezvous:
    """An Executor whose calls return only once ``parties`` of them are running at the same time (a barrier), so
    calls made one after the other fail (the barrier breaks after its 60 s safety timeout) instead of echoing."""

    def __init__(self, parties: int) -> None:
        self.threads: set[int] = set()
        self.barrier = threading.Barrier(parties, timeout=60)

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        self.threads.add(threading.get_ident())
        self.barrier.wait()
        return SandboxResult(code + "\n", "", 0, "ok", 0.3, False)


def test_call_many_keeps_order_and_overlaps() -> None:
    executor = Rendezvous(4)
    with ToolBox([PythonTool(executor), Calculator()], max_workers=4) as box:
        calls = [("python", {"code": f"c{i}"}) for i in range(4)] + [("calculator", {"expression": "2+2"})]
        results = box.call_many(calls)
    assert [r.text for r in results] == ["c0", "c1", "c2", "c3", "4"]  # the four python calls ran at once
    assert len(executor.threads) == 4 and all(r.duration_s > 0 for r in results)


def _running_sandbox_folders(root: Path) -> set[str]:
    """The sandbox folders under ``root`` named by the command lines of this test's live descendant processes."""
    import re

    import psutil

    named = re.compile(re.escape(str(root)) + r"/(pickaxe-sandbox-[A-Za-z0-9_]+)")
    folders: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                folders.update(named.findall(" ".join(child.cmdline())))
        except psutil.Error:  # gone meanwhile
            continue
    return folders


@pytest.mark.skipif(sys.platform != "linux", reason="the process sandbox is Linux-only")
def test_call_many_runs_sandboxed_python_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four sandboxed programs are seen running at the same time: each waits for a go that this test gives only
    once the processes it started run four sandbox folders together (calls run one after the other never get
    there). The folders are told apart by the command lines of this test's own child processes: a sandbox's folder
    may be a tmpfs that only its program sees, so a mark written there would not show from here."""
    root = tmp_path / "sandboxes"  # this test's sandboxes make their folders here
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    limits = SandboxLimits(cpu_s=2, memory_mb=128, wall_s=120)
    code = f"import os, time\nwhile not os.path.exists({str(root / 'go')!r}):\n    time.sleep(0.01)\nprint({{}})\n"
    results: list[ToolResult] = []
    with make_tools(["python"], limits=limits) as box:
        calls = [("python", {"code": code.replace("{}", str(i))}) for i in range(4)]
        run = threading.Thread(target=lambda: results.extend(box.call_many(calls)))
        run.start()
        try:
            deadline = time.monotonic() + 60  # a safety net, not the property tested
            while len(together := _running_sandbox_folders(root)) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            (root / "go").touch()  # releases them (and, if the test failed, every call still to come)
            run.join(timeout=600)
    assert len(together) == 4, f"only {len(together)} sandboxed calls were running at once"
    assert [r.text for r in results] == ["0", "1", "2", "3"]
    assert all(r.ok for r in results)


@pytest.mark.skipif(sys.platform != "linux", reason="the process sandbox is Linux-only")
def test_python_tool_reports_sandbox_status() -> None:
    tool = PythonTool(limits=SandboxLimits(cpu_s=1, memory_mb=128, wall_s=60))  # 60 s: room for a loaded machine
    assert tool({"code": "print(sum(range(10)))"}) == ToolResult("45", True)
    assert tool({"code": "x = 1"}).text == "(no output: use print() to show results)"
    one_second = PythonTool(limits=SandboxLimits(cpu_s=1, memory_mb=128, wall_s=1))
    stopped = one_second({"code": "import time\ntime.sleep(60)"})
    assert (stopped.ok, stopped.error, stopped.text) == (False, "timeout", "[killed: wall time limit 1s]")


# ---------------------------------------------------------------------------------------------------- make_tools


def test_make_tools(tmp_path: Path) -> None:
    corpus = tmp_path / "facts.json"
    corpus.write_text(json.dumps(CAPITALS))
    box = make_tools(list(TOOL_NAMES), corpus=str(corpus), limits=SandboxLimits(wall_s=2))
    assert list(box.tools) == ["calculator", "lookup", "python"]
    assert box.call("lookup", {"key": "France"}).text == "Paris"
    python = box.tools["python"]
    assert isinstance(python, PythonTool) and python.limits.wall_s == 2
    box.close()


def test_make_tools_errors() -> None:
    with pytest.raises(ValueError, match="unknown tool 'search'; choose from calculator, lookup, python"):
        make_tools(["calculator", "search"])
    with pytest.raises(ValueError, match=r"needs a corpus: set --agent\.corpus"):
        make_tools(["lookup"])
