"""A set of networks' weights as one safetensors file (``model.safetensors``) with its size and sha256 in
``model.json``: the format of a run's final model and of its kept policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pickaxe.digests import digest_problem, file_digest
from pickaxe.errors import PickaxeError

if TYPE_CHECKING:
    import torch
    from torch import nn

MODEL_FILE = "model.safetensors"
MODEL_DIGEST_FILE = "model.json"
"""Size and sha256 of ``model.safetensors``, written after it; ``load_model`` verifies them."""


def flat_weights(networks: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """The networks' weights as one flat dict ``<network>.<param>`` on the CPU, as safetensors stores them.

    Tensors that share memory (tied input/output embeddings) appear once per name, as copies: safetensors refuses
    shared tensors, and loading gives each name the same values again.
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, net in networks.items():
        for key, t in net.state_dict().items():
            ptr = t.untyped_storage().data_ptr()
            t = t.detach().cpu().contiguous()
            tensors[f"{name}.{key}"] = t.clone() if ptr in seen else t
            seen.add(ptr)
    return tensors


def write_weights(path: Path, networks: dict[str, nn.Module]) -> dict[str, Any]:
    """Write the networks' weights (keys ``<network>.<param>``, as :func:`flat_weights` names them) to ``path`` as a
    safetensors file, streamed tensor by tensor (no host copy of the whole model) and fsynced; return its
    ``{"size", "sha256"}``. Tied weights are written once per name. Weights sharded over several learners
    (FSDP2 DTensors) are refused: gather the full weights first."""
    from pickaxe.runs.shards import is_dtensor, shard_world
    from pickaxe.runs.tensorfile import write_tensors

    tensors = {}
    for name, net in networks.items():
        for key, t in net.state_dict().items():
            if is_dtensor(t):
                if shard_world(t, f"{name}.{key}") > 1:
                    raise ValueError(f"{name}.{key} is sharded over several learners; gather the full weights first")
                t = t.to_local()
            tensors[f"{name}.{key}"] = t.detach()
    return write_tensors(path, tensors)


def load_flat_weights(networks: dict[str, nn.Module], tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Load :func:`flat_weights` output into ``networks`` (each network takes the keys under its name); weights that
    do not fit are a one-line ``PickaxeError`` naming ``source``."""
    for name, net in networks.items():
        prefix = f"{name}."
        load_into(net, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, source)


def verify_weights(path: Path, recorded: dict[str, Any], fix: str) -> None:
    """Raise a one-line ``PickaxeError`` ending in ``fix`` when ``path``'s size or sha256 differs from ``recorded``
    (its ``model.json``: the final model's or a kept policy's)."""
    problem = digest_problem(file_digest(path), recorded, MODEL_DIGEST_FILE)
    if problem is not None:
        raise PickaxeError(f"{path} {problem}; {fix}")


def load_into(net: nn.Module, state: dict[str, Any], source: Path) -> None:
    """Load ``state`` into ``net``; weights that do not fit are a one-line ``PickaxeError`` naming ``source``."""
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise PickaxeError(
            f"the weights in {source} do not fit the networks of this run's config.json "
            f"({' '.join(ln.strip() for ln in first)[:300]}); was config.json edited?"
        ) from None


def write_json_synced(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a synced temporary file, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
