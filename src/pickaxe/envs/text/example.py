"""``Example``: one prompt with its reference answer and metadata, the unit that tasks generate, datasets load and
``PromptEnv`` serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Example:
    """One prompt with its reference answer (may be ``None`` when rewards need none) and metadata."""

    prompt: str
    answer: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def reward_metadata(self) -> dict[str, Any]:
        """What reward functions receive: the metadata plus ``answer``."""
        return {**self.metadata, "answer": self.answer}
