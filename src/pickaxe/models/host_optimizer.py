"""AdamW with its state and its step in host memory, the parameters and gradients left on the device
(``--dist.offload optimizer``; ZeRO-Offload's split).

FSDP2 offloads parameters, gradients and optimizer state together (``CPUOffloadPolicy``: ``--dist.offload params``),
so every forward and backward pass copies each unit's shards to the device. :class:`HostAdamW` offloads only the
optimizer: the shards and their gradients stay on the device for the passes, and once per optimizer step each
learner copies its gradient shards (and its parameter shards) to pinned host buffers, runs AdamW there on the two
moments it keeps on the host, and copies the new parameter shards back. The device holds weights and gradients (2
numbers per parameter instead of 4); the host holds the moments and the staging copies.

Its ``state_dict`` is ``torch.optim.AdamW``'s, key for key (``step``, ``exp_avg``, ``exp_avg_sq``), so a checkpoint
of a run with or without the offload resumes with the other; its step is the same function (``torch.optim.adam.adam``
with decoupled weight decay), so on the same device it gives AdamW's update bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.adam import adam

from pickaxe.models.sharding import local_tensor

HOST = torch.device("cpu")


def _on_host(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (laid out like parameter ``like``) moved to host memory: a DTensor keeps its mesh and placements,
    its local piece on the host (as FSDP2's offloaded shards)."""
    local = local_tensor(value).to(HOST)
    if isinstance(like, DTensor):
        return DTensor.from_local(
            local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
        )
    return local


class HostAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` over device parameters whose moments and step live in host memory (see the module's
    docstring). Parameter groups, learning-rate and weight-decay changes, ``zero_grad`` and ``state_dict`` are
    AdamW's; ``step`` stages each parameter and gradient through a pinned host buffer (plain host memory when the
    parameters are on the CPU already). ``amsgrad``, ``maximize``, ``capturable`` and ``differentiable`` are not
    offered."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        lr: float = 1e-3,
        weight_decay: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
        self.staging: dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] = {}
        """Per parameter: the host buffers its local piece and its gradient's are copied into for the step."""

    state_device = HOST
    """Where the state lives (``load_sharded_optimizer`` reads a checkpoint's rows straight there)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """AdamW's ``load_state_dict``, the state put in host memory one tensor at a time (AdamW's would first move
        all of it to the parameters' device)."""
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        params = [p for group in self.param_groups for p in group["params"]]
        for index, entry in state_dict["state"].items():
            p = params[int(index)]
            self.state[p] = {
                key: (value.to(HOST, torch.float32) if key == "step" else _on_host(value, p).to(p.dtype))
                if isinstance(value, torch.Tensor)
                else value
                for key, value in entry.items()
            }

    def _buffers(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        staged = self.staging.get(p)
        if staged is None:
            local = local_tensor(p)
            pin = local.device.type != "cpu" and torch.cuda.is_available()
            staged = tuple(torch.empty(local.shape, dtype=local.dtype, pin_memory=pin) for _ in range(2))
            self.staging[p] = staged  # type: ignore[assignment]
        return staged

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One AdamW step of every parameter that has a gradient, computed in host memory: the parameters' and
        gradients' local pieces copied in, the new parameters copied back."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, hosts, grads, avgs, squares, steps = [], [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = _on_host(torch.zeros_like(p, memory_format=torch.preserve_format), p)
                    state["exp_avg_sq"] = _on_host(torch.zeros_like(p, memory_format=torch.preserve_format), p)
                host, grad = self._buffers(p)
                host.copy_(local_tensor(p))
                grad.copy_(local_tensor(p.grad))
                params.append(p)
                hosts.append(host)
                grads.append(grad)
                avgs.append(local_tensor(state["exp_avg"]))
                squares.append(local_tensor(state["exp_avg_sq"]))
                steps.append(state["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adam(
                hosts, grads, avgs, squares, [], steps,
                foreach=group["foreach"], fused=group["fused"], decoupled_weight_decay=True,
                amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                eps=group["eps"], maximize=False,
            )  # fmt: skip
            for p, host in zip(params, hosts, strict=True):
                local_tensor(p).copy_(host, non_blocking=True)  # a pinned source: the device stream orders the copy
        return loss


def adamw_for(
    params: list[nn.Parameter], lr: float, weight_decay: float, fused: bool | None, offload: str
) -> torch.optim.AdamW:
    """The AdamW a sharded learner steps ``params`` with: :class:`HostAdamW` for ``--dist.offload optimizer`` on an
    accelerator, else ``torch.optim.AdamW`` (with ``params`` offload FSDP2 already keeps shards and state on the
    host; on a CPU device there is nothing to offload to)."""
    device = local_tensor(params[0]).device if params else HOST
    if offload == "optimizer" and device.type != "cpu":
        return HostAdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)
