"""The rollout ``Engine`` interface: token ids in, completions with per-token sampler log-probs out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions. The learner must use the same ``temperature``/``top_k``/``top_p`` for its
    log-probs, so the two agree token for token."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    """0 means greedy (log-probs then come from the unscaled logits)."""
    top_k: int = 0
    """Keep the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the smallest set of tokens with this much probability (1: all)."""
    n: int = 1
    """Completions per prompt (a GRPO group)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.n < 1:
            raise ValueError(f"max_new_tokens and n must be >= 1, got {self.max_new_tokens} and {self.n}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(
                f"bad sampling params: temperature={self.temperature} (>= 0), top_p={self.top_p} (in (0, 1]), "
                f"top_k={self.top_k} (>= 0)"
            )

    @property
    def greedy(self) -> bool:
        """True when sampling is argmax."""
        return self.temperature == 0


@dataclass
class Completion:
    """One sampled continuation of prompt ``prompt_index``: its tokens (EOS included when it stopped) and the
    sampler's log-prob of each token under the processed distribution it was drawn from."""

    prompt_index: int
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    """True when the completion ended with EOS; False when it hit ``max_new_tokens``."""
    version: int | None = None
    """Policy version of the weights that generated it, when the engine says (engine workers do; an engine in the
    learner's process leaves None and the collector tags the batch with the version it synced)."""
    ref_logprobs: list[float] | None = None
    """The frozen reference's log-prob of each token, when the engine scored them (engine workers holding the
    reference, in pipelined and async modes); None: the collector computes them."""
    loss_mask: list[bool] | None = None
    """Per token: True where the model generated it, False where the env appended it (a multi-turn episode's tool
    results and chat-template text, :class:`~pickaxe.rollout.agent.AgentRollout`); None: every token is the
    model's. ``logprobs`` is 0 on the env's tokens."""
    text: str | None = None
    """What the rewards score when it is not the decoded tokens (an episode's final answer); None: the decoded
    tokens."""
    info: dict[str, float] | None = None
    """Per-episode counts of a multi-turn episode (turns, tool calls, malformed calls, ...); None otherwise."""


@runtime_checkable
class Engine(Protocol):
    """Generates completions; ``generate`` returns ``len(prompts) * params.n`` completions, prompt-major (the
    ``n`` completions of prompt 0 first)."""

    version: int
    """Policy version of the weights the engine samples with."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Complete each prompt (token ids, no padding) ``params.n`` times."""
        ...

    def sync_weights(self, policy: nn.Module, version: int) -> None:
        """Make the engine sample from ``policy``'s current weights, tagged ``version``."""
        ...


@runtime_checkable
class RequestEngine(Protocol):
    """An ``Engine`` that can run ahead of the learner (engine workers, :mod:`pickaxe.dist.llm_engines`): weights
    are published once per version, and requests are submitted now and their results taken later, in any number.

    ``submit`` generates with the weights of the newest published version (``newest=True``: with the newest
    weights the worker holds when it starts the request, which may be newer). ``result`` returns the
    completions of a ticket, prompt-major like ``generate``, each carrying the ``version`` that generated it.
    ``state_dict`` needs no request in flight (take every ticket's result first)."""

    version: int

    def publish(self, policy: nn.Module, version: int) -> None:
        """Make ``policy``'s current weights available to the workers as ``version`` (once per version)."""
        ...

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams, newest: bool = False) -> int:
        """Start generating; returns a ticket for ``result``."""
        ...

    def result(self, ticket: int) -> list[Completion]:
        """The completions of a submitted request (waits for them)."""
        ...

    def discard(self, ticket: int) -> None:
        """Forget a request whose result is no longer wanted (it still runs: the sampler state advances)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Sampler state of every worker (no request in flight)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        ...

    def metrics(self) -> dict[str, float]:
        """Weight-sync time and size of the last publish, worker restarts so far."""
        ...


def load_weights(engine: Any, state: Mapping[str, torch.Tensor], version: int) -> None:
    """Load a published (possibly partial: only the trainable tensors) state dict into ``engine`` and tag it
    ``version``: through the engine's own ``load_weights`` when it has one (``VLLMEngine``), else into its
    ``model`` (``HFEngine``; tensors not in ``state`` keep their values)."""
    if hasattr(engine, "load_weights"):
        engine.load_weights(state, version)
        return
    missing = set(state) - set(engine.model.state_dict())
    if missing:
        raise KeyError(f"published weights name tensors the engine's model lacks, e.g. {sorted(missing)[0]!r}")
    with torch.no_grad():
        engine.model.load_state_dict(dict(state), strict=False)
    engine.version = version
