"""Reading a model turn: which tool calls it makes, which of them are malformed, and its final answer.

The default format is JSON in tags, the one Qwen2.5/Qwen3 and Hermes-style chat templates teach their models::

    <tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>

A turn with no tool call (and no malformed one) is the final answer: its text with surrounding whitespace removed.
Any other format plugs in as a :class:`ToolCallParser`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name and its arguments object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedTurn:
    """What a model turn says: its text, its well-formed ``calls``, one message per malformed call in ``errors``
    (sent back to the model), and ``answer``: the final answer when the turn makes no call at all, else None."""

    text: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    answer: str | None = None

    @property
    def final(self) -> bool:
        """True when the turn ends the episode: no call, well-formed or not."""
        return not self.calls and not self.errors


@runtime_checkable
class ToolCallParser(Protocol):
    """Turns a model turn's text into a :class:`ParsedTurn`. Must never raise on model output."""

    def parse(self, text: str) -> ParsedTurn:
        """The calls, malformed calls and final answer of ``text``."""
        ...

    def format_call(self, call: ToolCall) -> str:
        """The text of ``call`` in this format (what demonstrations show the model)."""
        ...


class JsonTagParser:
    """Tool calls as a JSON object ``{"name": ..., "arguments": {...}}`` between ``open_tag`` and ``close_tag``.

    ``arguments`` may also be a JSON string holding the object (some models write it that way). A block that is
    not closed, is not valid JSON, is not an object, lacks a string ``name`` or has non-object ``arguments`` is a
    malformed call: its error says what is wrong and how a call looks. At most ``max_calls`` calls per turn are
    kept; more are errors."""

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>", max_calls: int = 4) -> None:
        if not open_tag or not close_tag or max_calls < 1:
            raise ValueError("JsonTagParser needs non-empty tags and max_calls >= 1")
        self.open_tag, self.close_tag, self.max_calls = open_tag, close_tag, max_calls

    def _example(self) -> str:
        return f'{self.open_tag}{{"name": "TOOL", "arguments": {{...}}}}{self.close_tag}'

    def parse(self, text: str) -> ParsedTurn:
        """Every tagged block of ``text``, in order; the answer is the whole text when there is none."""
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        found = False
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                stray = text.find(self.close_tag, pos)
                if stray >= 0:
                    errors.append(
                        f"malformed tool call: {self.close_tag} without {self.open_tag}; write {self._example()}"
                    )
                break
            found = True
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            if end < 0:
                errors.append(f"malformed tool call: {self.open_tag} is never closed; write {self._example()}")
                break
            call, error = self._call(text[body_start:end])
            if error is not None:
                errors.append(f"malformed tool call: {error}; write {self._example()}")
            elif len(calls) >= self.max_calls:
                errors.append(f"too many tool calls in one turn: at most {self.max_calls}")
            else:
                assert call is not None
                calls.append(call)
            pos = end + len(self.close_tag)
        answer = text.strip() if not found and not errors else None
        return ParsedTurn(text, calls, errors, answer)

    def _call(self, body: str) -> tuple[ToolCall | None, str | None]:
        try:
            data = json.loads(body)
        except json.JSONDecodeError as e:
            return None, f"invalid JSON ({e.msg} at character {e.pos})"
        if not isinstance(data, dict):
            return None, f"the JSON is a {type(data).__name__}, not an object"
        name = data.get("name")
        if not isinstance(name, str) or not name:
            return None, 'no "name" string'
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None, '"arguments" is a string that is not a JSON object'
        if not isinstance(arguments, dict):
            return None, '"arguments" is not an object'
        return ToolCall(name, arguments), None

    def format_call(self, call: ToolCall) -> str:
        """``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (compact JSON)."""
        body = json.dumps({"name": call.name, "arguments": call.arguments}, separators=(",", ":"))
        return f"{self.open_tag}{body}{self.close_tag}"
