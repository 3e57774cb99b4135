"""Small process-level helpers: seeding, device choice, torch threads."""

from __future__ import annotations

import random

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


def set_torch_threads(n: int) -> None:
    """Set torch's intra-op threads.

    Small models default to one thread: on a busy 2-core machine OpenMP workers spin-wait and a small MLP
    update was measured up to 100x slower with torch's default thread count.
    """
    if n < 1:
        raise ValueError(f"torch_threads must be >= 1, got {n}")
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
