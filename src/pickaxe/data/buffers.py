"""Buffers: a uniform replay buffer (off-policy) and rollout storage with GAE (on-policy)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict

from pickaxe.data.batch import Batch, minibatches
from pickaxe.data.returns import gae


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions with uniform sampling.

    Storage is allocated once, on the first ``extend``, from that batch's keys and shapes; later batches
    are written in place. Sampling draws from the buffer's own generator so the data stream is a
    function of ``seed`` alone (and can be saved and restored).
    """

    def __init__(self, capacity: int, seed: int = 0, device: str | torch.device = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self._storage: TensorDict | None = None
        self._pos = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, batch: Batch) -> None:
        """Append every transition of ``batch`` (any batch shape; it is flattened), overwriting the oldest."""
        flat = batch.reshape(-1)
        n = flat.batch_size[0]
        if n > self.capacity:
            flat, n = flat[-self.capacity :], self.capacity
        if self._storage is None:
            self._storage = flat[:1].expand(self.capacity).clone().to(self.device)
        idx = (torch.arange(n) + self._pos) % self.capacity
        self._storage[idx.to(self.device)] = flat.to(self.device)
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)

    def sample(self, n: int) -> Batch:
        """Draw ``n`` transitions uniformly with replacement."""
        if self._storage is None or self._size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer; extend it first")
        idx = torch.randint(self._size, (n,), generator=self.generator)
        return self._storage[idx.to(self.device)]

    def state_dict(self) -> dict[str, Any]:
        """Contents, write position and sampling RNG."""
        storage = None if self._storage is None else self._storage[: self._size].to_dict()
        return {"storage": storage, "pos": self._pos, "size": self._size, "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._pos, self._size = int(state["pos"]), int(state["size"])
        if state["storage"] is not None:
            data = TensorDict(state["storage"], batch_size=[self._size])
            self._storage = data[:1].expand(self.capacity).clone().to(self.device)
            self._storage[: self._size] = data.to(self.device)
        self.generator.set_state(state["rng"])


class RolloutBuffer:
    """On-policy storage: takes one ``[T, N]`` rollout, computes GAE, and yields shuffled minibatches.

    ``next_value`` must be V of each step's real next observation (``next_obs``), so truncated episodes
    bootstrap from their final observation and terminated ones do not.
    """

    def __init__(self, gamma: float, gae_lambda: float) -> None:
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.data: Batch | None = None

    def add(self, batch: Batch, next_value: torch.Tensor) -> Batch:
        """Store ``batch`` with ``advantage`` and ``return`` filled in; returns the flattened batch."""
        adv, ret = gae(
            batch["reward"],
            batch["value"],
            next_value,
            batch["terminated"],
            batch["truncated"],
            self.gamma,
            self.gae_lambda,
        )
        batch.set("advantage", adv)
        batch.set("return", ret)
        self.data = batch.reshape(-1)
        return self.data

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator[Batch]:
        """One epoch of shuffled minibatches over the stored rollout."""
        if self.data is None:
            raise RuntimeError("RolloutBuffer is empty: call add() first")
        return minibatches(self.data, size, generator)
