"""Buffers: a uniform replay buffer (off-policy) and rollout storage with GAE (on-policy)."""

from __future__ import annotations

import math
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

    def extend(self, batch: Batch) -> torch.Tensor:
        """Append every transition of ``batch`` (any batch shape; it is flattened), overwriting the oldest; returns
        the slots written (a CPU tensor, in order)."""
        flat = batch.reshape(-1)
        n = flat.batch_size[0]
        if n == 0:
            return torch.zeros(0, dtype=torch.long)
        if n > self.capacity:
            flat, n = flat[-self.capacity :], self.capacity
        if self._storage is None:
            self._storage = flat[:1].expand(self.capacity).clone().to(self.device)
        idx = (torch.arange(n) + self._pos) % self.capacity
        self._storage[idx.to(self.device)] = flat.to(self.device)
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        return idx

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
        self.batch: Batch | None = None  # the same rollout, time-major [T, N] (for sequence minibatches)

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
        self.batch = batch
        self.data = batch.reshape(-1)
        return self.data

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator[Batch]:
        """One epoch of shuffled minibatches over the stored rollout."""
        if self.data is None:
            raise RuntimeError("RolloutBuffer is empty: call add() first")
        return minibatches(self.data, size, generator)


SEQUENCE_KEYS = ("obs", "action", "logprob", "value", "advantage", "return")
"""Per-step keys a sequence minibatch carries (with ``starts`` and ``mask``)."""


def sequence_chunks(batch: Batch, seq_len: int) -> Batch:
    """Cut a time-major ``[T, N]`` rollout into ``S = ceil(T / seq_len) * N`` sequences of ``seq_len`` steps.

    Returns a Batch of batch size ``[S]``, sequence ``k * N + n`` being env ``n``'s steps ``k * seq_len ...``:
    each key of ``SEQUENCE_KEYS`` as ``[S, seq_len, ...]``; ``mask`` (False on the padding that fills the last
    chunk up to ``seq_len``); ``starts`` (True where a new episode begins inside the chunk: the step after an
    episode end); ``h0`` and ``c0``, the hidden state the sequence's first step started from (``[S, H]``).
    """
    T, N = batch.batch_size
    K = math.ceil(T / seq_len)
    pad = K * seq_len - T
    done = batch["terminated"] | batch["truncated"]
    starts = torch.zeros_like(done)
    starts[1:] = done[:-1]
    out: dict[str, torch.Tensor] = {}
    per_step = {k: batch[k] for k in SEQUENCE_KEYS}
    per_step["starts"] = starts
    per_step["mask"] = torch.ones_like(done)
    for key, x in per_step.items():
        if pad:
            x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
        # [K * L, N, ...] -> [K, L, N, ...] -> [K, N, L, ...] -> [K * N, L, ...]
        x = x.reshape(K, seq_len, N, *x.shape[2:]).transpose(1, 2)
        out[key] = x.reshape(K * N, seq_len, *x.shape[3:])
    for key in ("h0", "c0"):
        out[key] = batch[key][::seq_len].reshape(K * N, -1)
    return TensorDict(out, batch_size=[K * N], device=batch.device)
