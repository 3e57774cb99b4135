"""``ToolEnv``: a multi-turn episode with tools, at the level of messages.

An episode: the system and user messages, then model turns; a turn that calls tools gets their results back as
``tool`` messages and the model speaks again; a turn with no call is the final answer, which the prompt
environment's rewards score. Turns are limited (``max_turns``) and so is the whole trajectory's length in tokens
(``max_tokens``, enforced by the rollout, :class:`pickaxe.rollout.agent.AgentRollout`, which also turns messages
into tokens). The env never sees token ids: it decides what the conversation says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pickaxe.envs.agents.parsing import JsonTagParser, ParsedTurn, ToolCall, ToolCallParser
from pickaxe.envs.agents.tools import ToolBox, ToolResult
from pickaxe.envs.text.example import Example
from pickaxe.envs.text.prompt_env import TRAJECTORY_KEY, PromptEnv, score_examples
from pickaxe.envs.text.rewards import RewardScores

Message = dict[str, Any]


def tool_use(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """1.0 when the episode called a tool and every call of it was well-formed, else 0.0."""
    t = metadata.get(TRAJECTORY_KEY) or {}
    return float(t.get("calls", 0) > 0 and t.get("malformed", 0) == 0)


def turns(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """The number of model turns of the episode (weighted by ``-turn_cost`` when that is set)."""
    return float((metadata.get(TRAJECTORY_KEY) or {}).get("turns", 0))


def _expression(example: Example) -> str:
    """The expression of an arithmetic prompt ``a*b=``."""
    return example.prompt.strip().rstrip("=").strip()


def calculator_demo(example: Example, parser: ToolCallParser) -> list[str]:
    """A demonstration for an arithmetic prompt ``a*b=``: call the calculator on ``a*b``, then say its result."""
    return [parser.format_call(ToolCall("calculator", {"expression": _expression(example)})), str(example.answer)]


def python_demo(example: Example, parser: ToolCallParser) -> list[str]:
    """A demonstration for an arithmetic prompt ``a*b=``: print ``a*b`` with the python tool, then say its output."""
    return [parser.format_call(ToolCall("python", {"code": f"print({_expression(example)})"})), str(example.answer)]


DEMOS: dict[str, Callable[[Example, ToolCallParser], list[str]]] = {
    "calculator": calculator_demo,
    "python": python_demo,
}
"""Built-in demonstrations by name (``--agent.demo``)."""


class ToolEnv:
    """Prompts and rewards (a :class:`~pickaxe.envs.text.prompt_env.PromptEnv`) plus tools, a tool-call format and
    limits: what an agent run's collector and evaluator talk to.

    ``prompts`` serves the training and held-out examples and its rewards score the final answer (the text of the
    last turn, ``""`` when the episode ended without one). Two per-episode terms follow them: ``tool_use`` (1 when
    the episode called a tool with only well-formed calls) weighted ``format_weight``, and ``turns`` weighted
    ``-turn_cost``; at weight 0 (the default) they are logged, not trained on. The first reward stays the
    correctness check. ``system_prompt`` opens every conversation; with ``describe_tools`` the tools' names,
    descriptions and the call format are appended to it when the chat template does not render ``tools`` itself
    (off for a small model that learns the format from demonstrations instead).
    ``demo(example, parser)`` returns the model turns of a demonstration (for an SFT warm start; the tools are
    really called on them).
    """

    def __init__(
        self,
        prompts: PromptEnv,
        tools: ToolBox,
        parser: ToolCallParser | None = None,
        system_prompt: str | None = None,
        max_turns: int = 4,
        max_tokens: int = 256,
        format_weight: float = 0.0,
        turn_cost: float = 0.0,
        demo: Callable[[Example, ToolCallParser], list[str]] | None = None,
        describe_tools: bool = True,
    ) -> None:
        if max_turns < 1 or max_tokens < 2:
            raise ValueError(f"ToolEnv needs max_turns >= 1 and max_tokens >= 2, got {max_turns} and {max_tokens}")
        self.prompts = prompts
        self.tools = tools
        self.parser: ToolCallParser = parser or JsonTagParser()
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.demo = demo
        self.describe_tools = describe_tools
        self._terms = [
            *((name, fn, w) for name, (fn, w) in zip(prompts.reward_names, prompts.rewards, strict=True)),
            ("tool_use", tool_use, float(format_weight)),
            ("turns", turns, -float(turn_cost)),
        ]
        self.reward_names: list[str] = [name for name, _, _ in self._terms]
        """The rewards' names: the prompt env's, then ``tool_use`` and ``turns``."""
        self.rewards: list[tuple[Any, float]] = [(fn, w) for _, fn, w in self._terms]
        """``(reward, weight)`` pairs in the order of ``reward_names``."""

    def sample(self, n: int) -> list[Example]:
        """``n`` training examples (the prompt env's stream)."""
        return self.prompts.sample(n)

    def eval_examples(self, n: int | None = None) -> list[Example]:
        """The held-out examples (the prompt env's)."""
        return self.prompts.eval_examples(n)

    def messages(self, example: Example, describe_tools: bool = False) -> list[Message]:
        """The conversation an episode starts with: the system message (when there is one, or ``describe_tools``)
        and the prompt as the user's message."""
        system = self.system_prompt or ""
        if describe_tools:
            listing = "\n".join(f"- {t.name}: {t.description}" for t in self.tools.tools.values())
            example_call = self.parser.format_call(ToolCall("NAME", {"ARG": "VALUE"}))
            system = f"{system}\n\nTools:\n{listing}\nCall one as {example_call}".strip()
        out: list[Message] = [{"role": "system", "content": system}] if system else []
        return [*out, {"role": "user", "content": example.prompt}]

    def parse(self, text: str) -> ParsedTurn:
        """A model turn's calls, malformed calls and answer."""
        return self.parser.parse(text)

    def observation(self, turn: ParsedTurn, results: Sequence[ToolResult]) -> list[Message]:
        """The ``tool`` messages answering ``turn``: one per call (``results`` in the order of ``turn.calls``), then
        one per malformed call saying what was wrong."""
        out = [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(turn.calls, results, strict=True)]
        return out + [{"role": "tool", "content": f"error: {e}"} for e in turn.errors]

    def demonstration(self, example: Example) -> list[tuple[str, list[Message]]]:
        """A demonstration episode for ``example``: ``(model turn, tool messages after it)`` pairs, the tools really
        called; raises ``ValueError`` when the env has no ``demo``."""
        if self.demo is None:
            raise ValueError("this ToolEnv has no demonstrations (demo=None); give it one for an SFT warm start")
        out = []
        for text in self.demo(example, self.parser):
            turn = self.parse(text)
            results = self.tools.call_many([(c.name, c.arguments) for c in turn.calls]) if turn.calls else []
            out.append((text, [] if turn.final else self.observation(turn, results)))
        return out

    def score_batch(
        self,
        examples: Sequence[Example],
        completions: Sequence[str],
        infos: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> RewardScores:
        """Every reward of every episode: ``completions[i]`` is episode ``i``'s final answer and ``infos[i]`` its
        counts (under the metadata's ``trajectory`` key, which the per-episode terms read)."""
        return score_examples(self._terms, examples, completions, infos)

    def state_dict(self) -> dict[str, Any]:
        """The prompt stream's state (tools hold none)."""
        return self.prompts.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.prompts.load_state_dict(state)

    def close(self) -> None:
        """Stop the tools' worker threads."""
        self.tools.close()
