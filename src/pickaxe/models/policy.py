"""The ``Policy`` protocol: what a collector needs from a model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

ActFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""``act(obs, deterministic=False) -> (actions, extras)``."""


@runtime_checkable
class Policy(Protocol):
    """Maps a batch of observations to actions.

    ``act`` returns the actions and a dict of per-step extras stored alongside them in the ``Batch``
    (e.g. ``logprob`` and ``value`` for PPO). ``deterministic=True`` is the evaluation policy.
    """

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Choose actions for ``obs`` (``[B, *obs_shape]``)."""
        ...


def rollout_act(policy: Policy) -> ActFn:
    """The ``act`` to call in a loop during which the policy's weights do not change (one collect, one evaluation):
    the policy's ``frozen_act()`` where it offers one (same values, prepared once for the loop), else ``act``."""
    frozen = getattr(policy, "frozen_act", None)
    return frozen() if frozen is not None else policy.act
