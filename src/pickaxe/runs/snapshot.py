"""Host copies of a state's tensors, so a checkpoint can be written in the background while training goes on.

``--trainer.async-checkpoint``: the training step waits only for :func:`host_copy` (device-to-host copies into
pinned memory on CUDA, one synchronisation per device at the end; plain copies of host tensors, which training
would otherwise change in place while they are written), then a helper thread writes the copies
(:meth:`~pickaxe.runs.checkpoint.CheckpointManager.save_async`). The copies cost host memory equal to the state
written (``pickaxe plan`` counts it), which is why the synchronous streamed write stays the default on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["host_copy"]


def host_copy(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host copy of every tensor of ``tensors`` (same names, dtypes, shapes and values; contiguous, not sharing
    memory with the originals or with each other). Tensors on an accelerator are copied into pinned memory without
    blocking, and each device is synchronised once before this returns, so the copies are complete."""
    out: dict[str, torch.Tensor] = {}
    devices: set[torch.device] = set()
    for name, t in tensors.items():
        t = t.detach()
        if t.device.type == "cpu":
            out[name] = t.clone(memory_format=torch.contiguous_format)
            continue
        pinned = torch.cuda.is_available() and t.device.type == "cuda"
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pinned)
        host.copy_(t, non_blocking=pinned)
        out[name] = host
        devices.add(t.device)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return out
