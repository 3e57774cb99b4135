"""The ``Batch``: one ``tensordict.TensorDict`` for all data, with the keys listed in DESIGN.md."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tensordict import TensorDict

Batch = TensorDict
"""Alias: every batch in pickaxe is a ``TensorDict`` (classic keys ``obs``, ``action``, ``reward``,
``terminated``, ``truncated``, ``next_obs``, ``logprob``, ``value``, ``advantage``, ``return``, ``weight``)."""


def minibatches(
    batch: Batch, size: int, generator: torch.Generator | None = None, drop_last: bool = False
) -> Iterator[Batch]:
    """Yield shuffled minibatches of a flat (1-D batch size) ``Batch``; the permutation uses ``generator``."""
    n = batch.batch_size[0]
    perm = torch.randperm(n, generator=generator).to(batch.device)
    stop = n - n % size if drop_last else n
    for start in range(0, stop, size):
        yield batch[perm[start : start + size]]
