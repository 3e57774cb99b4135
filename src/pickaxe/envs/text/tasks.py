"""Verifiable tasks generated on the fly from a seed: arithmetic, digit reversal/sorting, countdown.

Every task splits its problem space into train and held-out by a stable hash of the prompt, so a held-out
problem is never trained on, whatever the seeds. ``verify`` is the task's reward function.
"""

from __future__ import annotations

import ast
import hashlib
from abc import ABC, abstractmethod
from collections import Counter
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from pickaxe.envs.text.example import Example

Split = Literal["train", "heldout"]


class GeneratedTask(ABC):
    """A task whose problems are drawn from a seeded RNG; a ``heldout_fraction`` of the problem space (by a
    hash of the prompt) is reserved for evaluation."""

    name: str = "task"

    def __init__(self, heldout_fraction: float = 0.1) -> None:
        if not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.heldout_fraction = heldout_fraction

    @abstractmethod
    def generate(self, rng: np.random.Generator) -> Example:
        """One random problem (either split)."""

    @abstractmethod
    def verify(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        """1.0 for a correct completion, else 0.0."""

    def split_of(self, prompt: str) -> Split:
        """Which split a prompt belongs to (a stable hash: the same on every machine and run)."""
        h = int.from_bytes(hashlib.blake2b(f"{self.name}|{prompt}".encode(), digest_size=8).digest(), "little")
        return "heldout" if h / 2**64 < self.heldout_fraction else "train"

    def sample(self, rng: np.random.Generator, split: Split = "train") -> Example:
        """A random problem of ``split``."""
        for _ in range(10_000):
            ex = self.generate(rng)
            if self.split_of(ex.prompt) == split:
                return ex
        raise RuntimeError(f"{self.name}: could not draw a {split} problem; the problem space is too small")

    def heldout(self, n: int, seed: int) -> list[Example]:
        """``n`` distinct held-out problems (fewer if the held-out space is smaller), fixed by ``seed``."""
        rng = np.random.default_rng(seed)
        seen: dict[str, Example] = {}
        misses = 0
        while len(seen) < n and misses < 50 * n + 1000:
            ex = self.sample(rng, "heldout")
            if ex.prompt in seen:
                misses += 1
            else:
                seen[ex.prompt] = ex
        return list(seen.values())


def _exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


class Arithmetic(GeneratedTask):
    """``a+b=`` (or ``a*b=``) with operands of up to ``digits`` digits; the answer is the decimal result."""

    def __init__(self, digits: int = 2, op: Literal["+", "*"] = "+", heldout_fraction: float = 0.1) -> None:
        super().__init__(heldout_fraction)
        if digits < 1 or op not in "+*":
            raise ValueError(f"Arithmetic needs digits >= 1 and op '+' or '*', got {digits}, {op!r}")
        self.digits, self.op = digits, op
        self.name = f"{'addition' if op == '+' else 'multiplication'}-{digits}"

    def generate(self, rng: np.random.Generator) -> Example:
        """Operands uniform in ``[0, 10**digits)``."""
        a, b = (int(x) for x in rng.integers(0, 10**self.digits, size=2))
        result = a + b if self.op == "+" else a * b
        return Example(f"{a}{self.op}{b}=", str(result), {"a": a, "b": b})

    def verify(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        """Exact match with the decimal result."""
        return _exact(completion, str(metadata["answer"]))


class DigitTask(GeneratedTask):
    """``rev 4821=`` -> ``1284`` (reverse) or ``sort 4821=`` -> ``1248`` (sort), strings of ``min_len..max_len``
    digits."""

    def __init__(
        self, mode: Literal["reverse", "sort"] = "reverse", min_len: int = 3, max_len: int = 6, heldout_fraction=0.1
    ) -> None:
        super().__init__(heldout_fraction)
        if mode not in ("reverse", "sort") or not 1 <= min_len <= max_len:
            raise ValueError(f"DigitTask needs mode reverse|sort and 1 <= min_len <= max_len, got {mode}, {min_len}")
        self.mode, self.min_len, self.max_len = mode, min_len, max_len
        self.name = f"{mode}-{min_len}-{max_len}"

    def generate(self, rng: np.random.Generator) -> Example:
        """A uniform random digit string of uniform random length."""
        length = int(rng.integers(self.min_len, self.max_len + 1))
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, size=length))
        answer = digits[::-1] if self.mode == "reverse" else "".join(sorted(digits))
        word = "rev" if self.mode == "reverse" else "sort"
        return Example(f"{word} {digits}=", answer, {"digits": digits})

    def verify(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        """Exact match."""
        return _exact(completion, str(metadata["answer"]))


def Reverse(min_len: int = 3, max_len: int = 6, heldout_fraction: float = 0.1) -> DigitTask:
    """Digit-string reversal."""
    return DigitTask("reverse", min_len, max_len, heldout_fraction)


def SortDigits(min_len: int = 3, max_len: int = 6, heldout_fraction: float = 0.1) -> DigitTask:
    """Digit-string sorting."""
    return DigitTask("sort", min_len, max_len, heldout_fraction)


class Countdown(GeneratedTask):
    """``use 3 5 7 make 22=``: write an expression with ``+ - * /`` and parentheses that uses each given number
    exactly once and equals the target. Targets are built from a random expression, so one always exists."""

    name = "countdown"

    def __init__(self, numbers: int = 3, max_number: int = 9, heldout_fraction: float = 0.1) -> None:
        super().__init__(heldout_fraction)
        if numbers < 2 or max_number < 1:
            raise ValueError(f"Countdown needs numbers >= 2 and max_number >= 1, got {numbers}, {max_number}")
        self.numbers, self.max_number = numbers, max_number
        self.name = f"countdown-{numbers}-{max_number}"

    def generate(self, rng: np.random.Generator) -> Example:
        """Numbers uniform in ``1..max_number``; the target is a random left-to-right expression of them
        (``+ - *``) with a non-negative value."""
        while True:
            nums = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.numbers)]
            order = [int(i) for i in rng.permutation(self.numbers)]
            expr = str(nums[order[0]])
            for i in order[1:]:
                op = "+-*"[int(rng.integers(0, 3))]
                expr = (
                    f"({expr}){op}{nums[i]}" if op == "*" and any(c in expr for c in "+-") else f"{expr}{op}{nums[i]}"
                )
            target = evaluate_expression(expr)
            if target is not None and target >= 0 and target.denominator == 1:
                break
        prompt = f"use {' '.join(map(str, nums))} make {int(target)}="
        return Example(prompt, expr, {"numbers": nums, "target": int(target)})

    def verify(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        """1 when the completion is an expression using each number exactly once and equal to the target."""
        expr = completion.strip()
        value = evaluate_expression(expr)
        if value is None or value != metadata["target"]:
            return 0.0
        used = Counter(int(n) for n in _numbers_in(expr))
        return float(used == Counter(int(n) for n in metadata["numbers"]))


def _numbers_in(expr: str) -> list[int]:
    return [node.value for node in ast.walk(ast.parse(expr, mode="eval")) if isinstance(node, ast.Constant)]


def evaluate_expression(expr: str) -> Fraction | None:
    """The exact value of an arithmetic expression of integers, ``+ - * /`` and parentheses; ``None`` for anything
    else (names, calls, floats, division by zero, syntax errors). Never evaluates code."""
    if not expr or len(expr) > 200:
        return None
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ZeroDivisionError
            return left / right
        raise ValueError(f"not allowed: {type(node).__name__}")

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


TASKS = ("addition", "multiplication", "reverse", "sort", "countdown")
"""Task names a config can use (``--task.name``)."""


def make_task(name: str, digits: int = 2, min_len: int = 3, max_len: int = 6, heldout_fraction: float = 0.1):
    """A task by config name: ``addition``/``multiplication`` (``digits``), ``reverse``/``sort`` (``min_len``..
    ``max_len`` digits), ``countdown`` (``digits`` numbers of 1..9)."""
    if name == "addition":
        return Arithmetic(digits, "+", heldout_fraction)
    if name == "multiplication":
        return Arithmetic(digits, "*", heldout_fraction)
    if name in ("reverse", "sort"):
        return DigitTask(name, min_len, max_len, heldout_fraction)
    if name == "countdown":
        return Countdown(max(digits, 2), 9, heldout_fraction)
    raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
