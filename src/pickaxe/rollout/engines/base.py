"""The rollout ``Engine`` interface: token ids in, completions with per-token sampler log-probs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

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
