"""Data-parallel learners on ``torch.distributed``: the process group and the collectives the algorithms use.

Every learner holds the same weights and the same batch; in each optimizer step it computes the loss of its share
of the step's micro-batches (``algos.base.my_share``), normalised by the whole step's counts, and the learners'
gradients are summed in one collective on a flattened buffer (``algos.base.all_reduce_gradients``, inside the
guarded optimizer step), together with the step's loss and metric sums. Every learner then reads the same gradient
norm and loss in the step's one host read, makes the same decision (a non-finite step is refused on all of them or
none) and applies the same update: the single-process update, up to the order of float summation.

The collectives live in ``pickaxe.algos.base`` (algorithms sit below ``pickaxe.dist`` and must not import it);
this module sets the group up (gloo on CPU, NCCL on CUDA, from torchrun's environment or explicit values) and
re-exports them. No Ray here.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from pickaxe.algos.base import all_reduce, all_reduce_gradients, data_parallel, my_share
from pickaxe.errors import PickaxeError

__all__ = [
    "all_reduce",
    "all_reduce_gradients",
    "control_group",
    "free_port",
    "init",
    "init_from_env",
    "my_share",
    "rank",
    "shutdown",
    "world_size",
]

_CONTROL: list[Any] = []  # the gloo group for host-side messages (one per process group), once created
_EXIT_COLLECT: list[bool] = []  # whether collect_at_exit is registered


def rank() -> int:
    """This learner's rank in the data-parallel group, 0 without one."""
    return data_parallel()[0]


def world_size() -> int:
    """The number of data-parallel learners, 1 without a group."""
    return data_parallel()[1]


def free_port() -> int:
    """A TCP port free on this machine now (for ``MASTER_PORT`` of a group on localhost)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def backend_for(device: str | torch.device) -> str:
    """``nccl`` for a CUDA device, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init(
    rank: int,
    world: int,
    address: str = "127.0.0.1",
    port: int | None = None,
    device: str | torch.device = "cpu",
    timeout_s: float = 1800.0,
) -> None:
    """Join (or create, as rank 0) the group of ``world`` learners whose rank 0 listens on ``address:port``.

    The backend is NCCL for a CUDA ``device`` (each learner uses its own GPU: set it with ``torch.cuda.set_device``
    first), gloo otherwise. A group already initialised in this process is refused: one group per process.
    """
    if dist.is_initialized():
        raise PickaxeError("a torch.distributed group is already initialised in this process; call shutdown() first")
    if port is None:
        port = int(os.environ.get("MASTER_PORT", "0")) or None
    if port is None:
        raise PickaxeError("data-parallel learners need rank 0's port: set MASTER_PORT or pass port=")
    dist.init_process_group(
        backend_for(device),
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    if not _EXIT_COLLECT:
        atexit.register(collect_at_exit)
        _EXIT_COLLECT.append(True)


def collect_at_exit() -> None:
    """Collect the garbage once more before the interpreter shuts down (registered by :func:`init`, once).

    A sharded model sits in reference cycles (FSDP's hooks and states) that outlive the run's functions. Left to
    the interpreter's own last collection, they are freed after Python has stopped other threads from taking the
    GIL, and a gloo thread releasing one of their tensors then aborts the process ("terminate called without an
    active exception", SIGABRT): seen at the exit of 2 of 30 finished sharded runs under torchrun."""
    gc.collect()


def init_from_env(device: str | torch.device = "cpu") -> bool:
    """Join the group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
    ``LOCAL_RANK`` chooses the GPU of a CUDA ``device``); returns whether there is one (``WORLD_SIZE`` > 1).
    Without torchrun's variables, or with ``WORLD_SIZE=1``, nothing happens and False is returned."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return False
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise PickaxeError(f"WORLD_SIZE={world} but {', '.join(missing)} unset: start the learners with torchrun")
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init(int(os.environ["RANK"]), world, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), device)
    return True


def control_group() -> Any:
    """A gloo group over the same learners for host-side messages (batches, commands, state to load), so they
    never go through NCCL; the default group itself when it is gloo."""
    if not dist.is_initialized():
        raise PickaxeError("no data-parallel group: call init() or init_from_env() first")
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    if not _CONTROL:
        _CONTROL.append(dist.new_group(backend="gloo"))
    return _CONTROL[0]


def shutdown() -> None:
    """Leave the group (a no-op without one). The group's objects are collected at once: left in a reference cycle,
    a process forked later (a test's learners, a sweep's runs) would inherit them without their threads, and
    collecting them there joins that process's own threads at the same addresses: a hang."""
    _CONTROL.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()
