"""Multi-turn episodes as token-in/token-out trajectories: :class:`AgentRollout` runs a
:class:`~pickaxe.envs.agents.tool_env.ToolEnv` through any rollout ``Engine``; :class:`ChatFormat` turns the env's
messages into the tokens appended between turns; :class:`AgentDemoCollector` makes SFT batches of demonstrations
laid out exactly as the rollout lays out episodes.

A trajectory is the prompt's tokens, then each model turn's tokens exactly as the engine sampled them (``loss_mask``
1, the sampler's log-probs kept), then the tokens the env appends (tool results and the chat template's text
around them: ``loss_mask`` 0), and so on. Earlier turns are never re-tokenised: the next turn's prompt is the
trajectory so far plus the appended tokens, and every turn checks that it extends the previous one exactly
(:class:`TrajectoryError` names the turn otherwise). The appended tokens come from the tokenizer's chat template:
the text the template writes after a closed assistant turn for the new messages (checked to be an extension of
the conversation it renders without them, so a template that rewrites earlier turns is caught), plus whatever of
the template's end-of-turn text the model's own end-of-turn token did not already say.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from pickaxe.data.batch import Batch
from pickaxe.envs.agents.tool_env import Message, ToolEnv
from pickaxe.envs.agents.tools import ToolResult
from pickaxe.envs.text.example import Example
from pickaxe.errors import PickaxeError
from pickaxe.models.tokenizer import SIMPLE_CHAT_TEMPLATE
from pickaxe.rollout.engines.base import Completion, Engine, SamplingParams
from pickaxe.rollout.text_collector import DemoCollector, pack


class TrajectoryError(PickaxeError):
    """A multi-turn trajectory that broke the token-in/token-out contract (a turn that does not extend the
    previous one, a chat template that rewrites earlier turns)."""


_MARK = "\x00pickaxe-turn\x00"
"""Stand-in content of an assistant turn while finding the template's text around it (never tokenised)."""


class ChatFormat:
    """The tokens of a ``ToolEnv`` conversation under ``tokenizer``'s chat template (``SIMPLE_CHAT_TEMPLATE`` when
    it has none). Tools are passed to a template that renders them (its source mentions ``tools``); for any other
    the env describes them in the system message (when its ``describe_tools`` is on)."""

    def __init__(self, tokenizer: Any, env: ToolEnv) -> None:
        self.tokenizer = tokenizer
        self.env = env
        self.template: str = getattr(tokenizer, "chat_template", None) or SIMPLE_CHAT_TEMPLATE
        self.renders_tools = "tools" in self.template
        self._schemas = env.tools.schemas() if self.renders_tools else None
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._eos_text = str(tokenizer.eos_token or "")
        self._base: list[Message] = [{"role": "user", "content": "?"}]
        closed = self.render([*self._base, {"role": "assistant", "content": _MARK}], False)
        self._closed = closed
        self._end_text = closed[closed.rindex(_MARK) + len(_MARK) :]

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        kwargs: dict[str, Any] = {"tools": self._schemas} if self._schemas else {}
        text = self.tokenizer.apply_chat_template(
            list(messages),
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=self.template,
            **kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, no special tokens added (templates write their own)."""
        # verbose off: a long tool result is not an error here (the trajectory budget ends the episode)
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]]

    def prompt(self, example: Example) -> list[int]:
        """The first prompt of an episode: the env's opening messages with the assistant's turn opened."""
        describe = self.env.describe_tools and not self.renders_tools
        return self.encode(self.render(self.env.messages(example, describe_tools=describe), True))

    def prompts(self, examples: Sequence[Example]) -> list[list[int]]:
        """:meth:`prompt` of each example."""
        return [self.prompt(ex) for ex in examples]

    def observation(self, messages: Sequence[Message], ended_with_eos: bool, turn: int = 0) -> list[int]:
        """The tokens appended after a model turn: the rest of the template's end-of-turn text (all of it when the
        turn did not end with the EOS token, or when the template does not write EOS there), ``messages``, and
        the next assistant turn opened. ``turn`` (1-based) names the turn in errors."""
        closed = self._closed
        full = self.render([*self._base, {"role": "assistant", "content": _MARK}, *messages], True)
        if not full.startswith(closed):
            raise TrajectoryError(
                f"turn {turn}: the chat template rewrites the conversation before the new messages (it is not "
                "prefix-preserving), so earlier turns would change; use a template that keeps earlier turns as "
                "they were"
            )
        end = self._end_text
        if ended_with_eos and self._eos_text and end.startswith(self._eos_text):
            end = end[len(self._eos_text) :]
        return self.encode(end + full[len(closed) :])


@dataclass
class Trajectory:
    """One episode being generated: its tokens (prompt first), which are the model's, their sampler log-probs,
    the conversation as messages and its counts."""

    prompt_index: int
    tokens: list[int]
    start: int
    messages: list[Message]
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    calls: int = 0
    malformed: int = 0
    tool_errors: int = 0
    answer: str | None = None
    done: bool = False
    version: int | None = None

    def add(self, tokens: Sequence[int], model: bool, logprobs: Sequence[float] | None = None) -> None:
        """Append tokens, the model's (with their log-probs) or the env's."""
        self.tokens.extend(tokens)
        self.mask.extend([model] * len(tokens))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(tokens))

    def info(self) -> dict[str, float]:
        """The counts the per-episode rewards and the metrics read."""
        return {
            "turns": float(self.turns),
            "calls": float(self.calls),
            "malformed": float(self.malformed),
            "tool_errors": float(self.tool_errors),
            "answered": float(self.answer is not None),
            "model_tokens": float(sum(self.mask)),
            "env_tokens": float(len(self.mask) - sum(self.mask)),
        }

    def completion(self) -> Completion:
        """The episode as a ``Completion``: every token after the prompt, the loss mask, the final answer."""
        return Completion(
            prompt_index=self.prompt_index,
            token_ids=self.tokens[self.start :],
            logprobs=list(self.logprobs),
            finished=self.answer is not None,
            version=self.version,
            loss_mask=list(self.mask),
            text=self.answer if self.answer is not None else "",
            info=self.info(),
        )


class AgentRollout:
    """Runs ``env``'s episodes through ``engine`` and is itself an ``Engine``: ``generate(prompts, params)`` takes
    the episodes' first prompts (:meth:`ChatFormat.prompts`) and returns one ``Completion`` per episode,
    prompt-major, carrying ``loss_mask``, the final answer as ``text`` and the episode's counts as ``info``.

    Episodes advance in rounds: every unfinished episode samples its next turn in one ``engine.generate`` call
    (``params`` per turn, ``n`` 1; a turn never runs past the trajectory budget ``env.max_tokens``), then the tool
    calls of the round run concurrently (``env.tools.call_many``), each bounded by its own time limit. The rounds
    keep sampling a pure function of the seed and the tools' outputs, so runs reproduce and resume exactly; the
    price is that a round waits for its slowest call (at most the python tool's wall limit).

    An episode ends with a turn that makes no tool call (its text is the final answer), after ``env.max_turns``
    turns, or when the next prompt would leave no room in ``env.max_tokens``; only the first kind is
    ``finished``. ``sync_weights``, ``version`` and the sampler state are the engine's.
    """

    def __init__(self, engine: Engine, env: ToolEnv, tokenizer: Any) -> None:
        self.engine = engine
        self.env = env
        self.tokenizer = tokenizer
        self.format = ChatFormat(tokenizer, env)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._metrics: dict[str, float] = {}

    @property
    def version(self) -> int:
        """The engine's policy version."""
        return int(self.engine.version)

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = value

    @property
    def generator(self) -> Any:
        """The engine's sampling RNG (``HFEngine``'s), which the evaluator re-seeds so that an evaluation is a pure
        function of the weights and leaves the training stream untouched; None when the engine has none here."""
        return getattr(self.engine, "generator", None)

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """The engine's ``sync_weights``."""
        self.engine.sync_weights(policy, version)

    def encode(self, examples: Sequence[Example]) -> list[list[int]]:
        """The episodes' first prompts."""
        return self.format.prompts(examples)

    def next_prompt(self, trajectory: Trajectory, appended: list[int]) -> list[int]:
        """The next turn's prompt: the trajectory's tokens with ``appended`` after them (a subclass that rebuilt it
        some other way is held to the same contract by the prefix check)."""
        return [*trajectory.tokens, *appended]

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Run ``params.n`` episodes from each prompt to their end."""
        t0 = time.perf_counter()
        generate_s = tools_s = 0.0
        calls_made = 0
        trajs = [Trajectory(i, list(p), len(p), []) for i, p in enumerate(prompts) for _ in range(params.n)]
        for t in trajs:  # a first prompt with no room left; later turns stop before filling the budget
            t.done = len(t.tokens) >= self.env.max_tokens
        for round_ in range(1, self.env.max_turns + 1):
            active = [t for t in trajs if not t.done]
            if not active:
                break
            rooms = [self.env.max_tokens - len(t.tokens) for t in active]
            turn_params = replace(params, n=1, max_new_tokens=max(1, min(params.max_new_tokens, max(rooms))))
            g0 = time.perf_counter()
            outs = self.engine.generate([t.tokens for t in active], turn_params)
            generate_s += time.perf_counter() - g0
            pending: list[tuple[Trajectory, Any, bool]] = []
            for t, c, room in zip(active, outs, rooms, strict=True):
                ids, logps = list(c.token_ids)[:room], list(c.logprobs)[:room]
                ended_with_eos = bool(ids) and ids[-1] == self.eos_token_id
                t.add(ids, True, logps)
                t.turns += 1
                if c.version is not None:
                    t.version = c.version if t.version is None else min(t.version, c.version)
                text = self.tokenizer.decode(ids[:-1] if ended_with_eos else ids, skip_special_tokens=True)
                turn = self.env.parse(text)
                t.messages.append({"role": "assistant", "content": text})
                t.calls += len(turn.calls)
                t.malformed += len(turn.errors)
                if turn.final:
                    t.answer, t.done = turn.answer, True
                elif round_ == self.env.max_turns:
                    t.done = True  # out of turns: the calls of the last turn are not run
                else:
                    pending.append((t, turn, ended_with_eos))
            calls = [(c.name, c.arguments) for _, turn, _ in pending for c in turn.calls]
            c0 = time.perf_counter()
            results: list[ToolResult] = self.env.tools.call_many(calls) if calls else []
            tools_s += time.perf_counter() - c0
            calls_made += len(calls)
            k = 0
            for t, turn, ended_with_eos in pending:
                mine = results[k : k + len(turn.calls)]
                k += len(turn.calls)
                t.tool_errors += sum(not r.ok for r in mine)
                messages = self.env.observation(turn, mine)
                t.messages.extend(messages)
                appended = self.format.observation(messages, ended_with_eos, t.turns)
                if len(t.tokens) + len(appended) >= self.env.max_tokens:
                    t.done = True  # no room left for another turn
                    continue
                nxt = self.next_prompt(t, appended)
                self._check_prefix(t, nxt)
                t.add(nxt[len(t.tokens) :], False)
        self._summarise(trajs, time.perf_counter() - t0, generate_s, tools_s, calls_made)
        return [t.completion() for t in trajs]

    @staticmethod
    def _check_prefix(t: Trajectory, nxt: Sequence[int]) -> None:
        """``nxt`` must extend the trajectory's tokens exactly."""
        n = len(t.tokens)
        if len(nxt) > n and list(nxt[:n]) == t.tokens:
            return
        diff = next((i for i, (a, b) in enumerate(zip(t.tokens, nxt, strict=False)) if a != b), min(n, len(nxt)))
        got = nxt[diff] if diff < len(nxt) else "nothing"
        raise TrajectoryError(
            f"turn {t.turns + 1} of episode {t.prompt_index}: its prompt does not extend the trajectory so far "
            f"(first difference at token {diff}: {t.tokens[diff] if diff < n else 'end'} became {got}); earlier "
            "turns must never be re-tokenised: append to the tokens instead of re-rendering the conversation"
        )

    def _summarise(
        self, trajs: list[Trajectory], total_s: float, generate_s: float, tools_s: float, calls: int
    ) -> None:
        infos = [t.info() for t in trajs]

        def mean(key: str) -> float:
            return float(np.mean([i[key] for i in infos])) if infos else 0.0

        self._metrics = {
            "rollout/agent/turns": mean("turns"),
            "rollout/agent/tool_calls": mean("calls"),
            "rollout/agent/malformed_calls": mean("malformed"),
            "rollout/agent/tool_errors": mean("tool_errors"),
            "rollout/agent/answered": mean("answered"),
            "rollout/agent/tool_use": float(np.mean([i["calls"] > 0 and i["malformed"] == 0 for i in infos]))
            if infos
            else 0.0,
            "rollout/agent/model_tokens": mean("model_tokens"),
            "rollout/agent/env_tokens": mean("env_tokens"),
            "time/agent_generate_s": generate_s,
            "time/tools_s": tools_s,
            "time/agent_other_s": max(0.0, total_s - generate_s - tools_s),
            "tools/calls": float(calls),
        }

    def metrics(self) -> dict[str, float]:
        """Counts and timings of the last ``generate`` (plus the engine's own metrics, when it has any)."""
        out = dict(self.engine.metrics()) if hasattr(self.engine, "metrics") else {}
        return {**out, **self._metrics}

    def state_dict(self) -> dict[str, Any]:
        """The engine's sampler state (the env and tools hold none of their own here)."""
        return self.engine.state_dict() if hasattr(self.engine, "state_dict") else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        if hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(state)

    def close(self) -> None:
        """Stop the engine's workers (if any) and the tools' threads."""
        if hasattr(self.engine, "close"):
            self.engine.close()
        self.env.close()


class AgentDemoCollector(DemoCollector):
    """SFT batches of demonstration episodes (``env.demonstration``), laid out as :class:`AgentRollout` lays out
    episodes: the same first prompt and appended tokens, each model turn followed by EOS, ``loss_mask`` on the
    model turns and their EOS only. Keys ``input_ids``, ``attention_mask``, ``loss_mask``, ``group``; state and
    metrics as ``DemoCollector``'s."""

    def __init__(self, env: ToolEnv, tokenizer: Any, batch_size: int = 64, device: str | torch.device = "cpu") -> None:
        super().__init__(env, tokenizer, batch_size, device)  # type: ignore[arg-type]
        self.format = ChatFormat(tokenizer, env)

    def episode(self, example: Example) -> tuple[list[int], list[int], list[bool]]:
        """``(prompt ids, the rest of the episode's ids, its loss mask)`` of ``example``'s demonstration."""
        prompt = self.format.prompt(example)
        ids: list[int] = []
        mask: list[bool] = []
        for k, (text, messages) in enumerate(self.env.demonstration(example), start=1):  # type: ignore[attr-defined]
            turn = [*self.format.encode(text), self.eos_token_id]
            ids += turn
            mask += [True] * len(turn)
            if messages:
                appended = self.format.observation(messages, True, k)
                ids += appended
                mask += [False] * len(appended)
        return prompt, ids, mask

    def collect(self) -> Batch:
        """One batch of demonstration episodes."""
        episodes = [self.episode(ex) for ex in self.env.sample(self.batch_size)]
        data = pack([e[0] for e in episodes], [e[1] for e in episodes], self.pad_token_id,
                    completion_masks=[e[2] for e in episodes])  # fmt: skip
        data["group"] = torch.arange(self.total_steps, self.total_steps + len(episodes))
        self.total_steps += len(episodes)
        self._tokens = int(data["loss_mask"].sum())
        return TensorDict(data, batch_size=[len(episodes)]).to(self.device)
