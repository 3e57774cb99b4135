"""Small process-level helpers: seeding, device choice, torch threads."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

from pickaxe.errors import ConfigError


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's (CPU and CUDA) global generators from one run seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Map ``auto`` to CUDA when a GPU is visible, else CPU; pass explicit devices through.

    ``cuda`` without a GPU is a user error, reported instead of failing deep inside torch.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for but torch sees no GPU; use --device cpu or --device auto")
    return dev


@contextlib.contextmanager
def visiting(module: torch.nn.Module, device: torch.device | None) -> Iterator[None]:
    """A frozen model kept in host memory visits ``device`` for the ``with`` block and goes back to the host after
    it, also after an error (the device's cached blocks freed on CUDA); ``device`` None: nothing moves."""
    if device is None:
        yield
        return
    module.to(device)
    try:
        yield
    finally:
        module.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()


def set_torch_threads(n: int) -> None:
    """Set torch's intra-op threads.

    Small models default to one thread: on a busy 2-core machine OpenMP workers spin-wait and a small MLP
    update was measured up to 100x slower with torch's default thread count.
    """
    if n < 1:
        raise ValueError(f"torch_threads must be >= 1, got {n}")
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def get_rng_state() -> dict:
    """The global generators' states: python, numpy (legacy global), torch CPU and every CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``get_rng_state`` returned. Call it last when resuming: building objects consumes randomness."""
    random.setstate(_as_tuple(state["python"]))
    np.random.set_state(_as_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x):
    """Nested lists back to the nested tuples ``random.setstate`` expects."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
