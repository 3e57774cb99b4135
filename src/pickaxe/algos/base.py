"""The ``Algorithm`` interface: owns networks and optimizers, learns from Batches."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from pickaxe.data.batch import Batch
from pickaxe.errors import NonFiniteError
from pickaxe.models.policy import Policy


def first_nonfinite(named: Any, grads: bool = False) -> str | None:
    """Name of the first parameter (or its gradient) holding NaN/Inf, if any."""
    for name, p in named:
        t = p.grad if grads else p
        if t is not None and not torch.isfinite(t).all():
            return f"{'gradient of ' if grads else 'parameter '}{name}"
    return None


def guarded_step(
    loss: torch.Tensor, module: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, name: str = "loss"
) -> torch.Tensor:
    """Backward, clip and step, refusing (``NonFiniteError``) a non-finite loss, gradient or parameter.

    Checks happen before ``optimizer.step()``, so a bad update never reaches the weights. Returns the
    gradient norm before clipping.
    """
    if not torch.isfinite(loss):
        raise NonFiniteError(first_nonfinite(module.named_parameters()) or f"{name} = {loss.item()}")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
    if not torch.isfinite(grad_norm):
        raise NonFiniteError(first_nonfinite(module.named_parameters(), grads=True) or "gradient norm")
    optimizer.step()
    return grad_norm


class Algorithm(ABC):
    """Base class of every learner.

    ``policy`` is what the collector acts with (exploration included) and what evaluation calls with
    ``deterministic=True``. ``update`` takes the freshly collected ``Batch`` and returns scalar metrics;
    on-policy algorithms learn from it directly, off-policy ones store it in their replay buffer first,
    so the Trainer's loop is the same for both.
    """

    policy: Policy

    def set_progress(self, step: int, total_steps: int) -> None:  # noqa: B027 - optional hook
        """Called before each collect with env steps so far, for schedules (learning rate, epsilon, ...)."""

    @abstractmethod
    def update(self, batch: Batch) -> dict[str, float]:
        """Learn from one collected batch; return metrics (namespaced, e.g. ``loss/policy``)."""

    @abstractmethod
    def networks(self) -> dict[str, nn.Module]:
        """The modules whose weights make the model checkpoint, by name."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue learning exactly (networks, optimizers, buffers, counters)."""
        return {name: net.state_dict() for name, net in self.networks().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        for name, net in self.networks().items():
            net.load_state_dict(state[name])
