"""The ``Algorithm`` interface: owns networks and optimizers, learns from Batches."""

from __future__ import annotations

import math
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


def all_finite(tensors: Any) -> bool:
    """Whether every tensor of ``tensors`` is free of NaN/Inf, in one host read (not one per tensor)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return not flags or bool(torch.stack([f.to(flags[0].device) for f in flags]).all())


def clip_and_step(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    max_grad_norm: float,
    loss: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
    name: str = "loss",
) -> list[float]:
    """Clip ``module``'s gradients to ``max_grad_norm`` and step, refusing a non-finite ``loss`` or gradient first.

    The step's one host synchronisation reads, together: the total gradient norm (which clipping needs anyway, and
    which is NaN/Inf exactly when some gradient is), ``loss`` (the step's summed loss) and ``extra`` (any metric
    tensors the caller wants read at the same time). On a bad value the gradients are dropped and
    ``NonFiniteError`` names the first non-finite parameter or gradient (or ``name = value``), before clipping
    (which would spread a NaN to every gradient) and before ``optimizer.step()``, so weights and optimizer state
    stay as they were. Returns ``[grad_norm, loss (if given), *extra]`` as floats, the norm before clipping.
    """
    params = [p for p in module.parameters() if p.grad is not None]
    total_norm = nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
    parts = [total_norm.detach().float().reshape(1)]
    parts += [t.detach().float().reshape(-1).to(total_norm.device) for t in (loss, extra) if t is not None]
    values = torch.cat(parts).tolist()
    what = None
    if loss is not None and not math.isfinite(values[1]):
        what = first_nonfinite(module.named_parameters()) or f"{name} = {values[1]}"
    elif not math.isfinite(values[0]):
        what = first_nonfinite(module.named_parameters(), grads=True) or f"gradient norm = {values[0]}"
    if what is not None:
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(what)
    if params:
        nn.utils.clip_grads_with_norm_(params, max_grad_norm, total_norm)
    optimizer.step()
    return values


def guarded_step(
    loss: torch.Tensor, module: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, name: str = "loss"
) -> torch.Tensor:
    """Backward, clip and step, refusing (``NonFiniteError``) a non-finite loss or gradient before
    ``optimizer.step()`` (see :func:`clip_and_step`: one host read per step), so a bad update never reaches the
    weights. Returns the gradient norm before clipping (a CPU tensor)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return torch.tensor(clip_and_step(module, optimizer, max_grad_norm, loss, name=name)[0])


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
