"""The ``Policy`` protocol: what a collector needs from a model."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Policy(Protocol):
    """Maps a batch of observations to actions.

    ``act`` returns the actions and a dict of per-step extras stored alongside them in the ``Batch``
    (e.g. ``logprob`` and ``value`` for PPO). ``deterministic=True`` is the evaluation policy.
    """

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Choose actions for ``obs`` (``[B, *obs_shape]``)."""
        ...
