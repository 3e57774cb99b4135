"""``PairCollector``: batches of preference pairs for reward-model and DPO runs, with an exactly resumable state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pickaxe.data.batch import Batch
from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.rollout.pairs import pack_pairs

__all__ = ["PairCollector"]


class PairCollector:
    """``collect()`` returns the next ``pairs_per_batch`` pairs of ``pairs`` as a ``pack_pairs`` Batch (two rows a
    pair, so a batch counts ``2 * pairs_per_batch`` steps), cycling through the data in an order reshuffled every
    epoch by ``seed``. Each pair's id is its index in ``pairs`` (DPO caches reference log-probs under it). The
    state is the shuffling RNG and the rest of the current epoch's order: a resumed run sees the same batches."""

    def __init__(
        self,
        pairs: Sequence[PreferencePair],
        tokenizer: Any,
        pairs_per_batch: int,
        seed: int = 0,
        device: str | torch.device = "cpu",
        margin_key: str | None = None,
    ) -> None:
        if not pairs:
            raise ValueError("PairCollector needs at least one preference pair")
        if pairs_per_batch < 1:
            raise ValueError(f"pairs_per_batch must be >= 1, got {pairs_per_batch}")
        self.pairs = list(pairs)
        self.tokenizer = tokenizer
        self.pairs_per_batch = pairs_per_batch
        self.device = torch.device(device)
        self.margin_key = margin_key
        self.rng = np.random.default_rng(seed)
        self._order: list[int] = []
        self.epochs = 0
        self.total_steps = 0
        self._tokens = 0

    def _next(self) -> int:
        if not self._order:
            self._order = [int(i) for i in self.rng.permutation(len(self.pairs))][::-1]
            self.epochs += 1
        return self._order.pop()

    def collect(self) -> Batch:
        """The next batch of pairs (it may span the end of an epoch)."""
        idx = [self._next() for _ in range(self.pairs_per_batch)]
        if len(set(idx)) < len(idx):  # a batch wider than the data set: keep each pair once
            idx = list(dict.fromkeys(idx))
        batch = pack_pairs([self.pairs[i] for i in idx], self.tokenizer, idx, self.margin_key)
        self.total_steps += batch.numel()
        self._tokens = int(batch["loss_mask"].sum())
        return batch.to(self.device)

    def metrics(self) -> dict[str, float]:
        """Response tokens in the last batch and the data epoch."""
        return {"rollout/target_tokens": float(self._tokens), "rollout/data_epoch": float(self.epochs)}

    def state_dict(self) -> dict[str, Any]:
        """Shuffling RNG, the rest of the epoch's order, counters."""
        return {
            "rng": self.rng.bit_generator.state,
            "order": list(self._order),
            "epochs": self.epochs,
            "steps": self.total_steps,
        }

    def load_state_dict(self, state: dict[str, Any], reseed: int | None = None) -> None:
        """Restore what ``state_dict`` returned (exactly; ``reseed`` is unused, the state is complete)."""
        self.rng.bit_generator.state = state["rng"]
        self._order = [int(i) for i in state["order"]]
        self.epochs = int(state["epochs"])
        self.total_steps = int(state["steps"])

    def state_support(self) -> str:
        """The data order's state is captured completely."""
        return "exact"
