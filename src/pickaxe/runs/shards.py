"""Sharded entries of a checkpoint: tensors whose rows are split over the ranks of a data-parallel group.

A ``DTensor`` placed ``Shard(0)`` on a one-dimensional device mesh of ``world`` ranks (what FSDP2's
``fully_shard`` makes of parameters and optimizer state) holds on rank ``r`` the rows ``torch.chunk`` gives
chunk ``r`` (possibly none on the last ranks). In a checkpoint each rank's rows go to its own file: rank 0's into
``tensors.safetensors`` with the rest of the state, rank ``r``'s into ``shards-rank-<r>.safetensors``, every piece
under the entry's name (its path in the state, e.g. ``state['algo']['policy']['0.weight']``: the same on every
rank). ``meta.json`` records each entry's global shape, dtype and pieces (file, first row, end row).

Loading gives each entry as a :class:`ShardedTensorRef` (lazy) or as the full tensor read from its pieces. A ref
reads any row range on demand, so a checkpoint written by N ranks loads on M: rank ``r`` of M reads its own rows.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pickaxe.errors import CheckpointError
from pickaxe.runs.tensorfile import DTYPE_CODES

__all__ = [
    "ShardPlan",
    "ShardedTensorRef",
    "chunk_rows",
    "is_dtensor",
    "plan_shards",
    "shard_file",
    "shard_world",
]

TENSORS = "tensors.safetensors"
"""The file of rank 0's pieces (and of everything that is not sharded)."""

FileOpener = Callable[[str], Any]
"""Opens a tensor file for reading (a ``safetensors.safe_open`` handle) by its path."""


def shard_file(rank: int) -> str:
    """The file in a checkpoint folder holding rank ``rank``'s pieces of the sharded entries."""
    return TENSORS if rank == 0 else f"shards-rank-{rank}.safetensors"


def chunk_rows(rows: int, world: int) -> list[tuple[int, int]]:
    """Each rank's ``(first row, end row)`` when ``rows`` rows are split as ``torch.chunk`` splits them over
    ``world`` ranks (``ceil(rows / world)`` each; the last ranks may get fewer or none), as FSDP2 shards dim 0."""
    size = -(-rows // world) if rows else 0
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world)]


def is_dtensor(x: Any) -> bool:
    """Whether ``x`` is a ``torch.distributed.tensor.DTensor`` (False without importing it when nothing has)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)


def shard_world(x: Any, path: str) -> int:
    """1 when the DTensor ``x``'s local tensor is the whole tensor (one rank, or replicated), else the number of
    ranks whose rows it is split over (``Shard(0)`` on a 1-D mesh). ``TypeError`` naming ``path`` for any other
    layout (2-D meshes, other dims, partial sums)."""
    mesh = x.device_mesh
    if mesh.ndim != 1:
        raise TypeError(
            f"{path}: cannot store a DTensor on a {mesh.ndim}-D device mesh; checkpoints store tensors sharded over "
            "one mesh dimension (FSDP2's fully_shard on a 1-D mesh)"
        )
    (placement,) = x.placements
    if placement.is_replicate() or mesh.size() == 1:
        return 1
    if not placement.is_shard(0):
        raise TypeError(
            f"{path}: cannot store a DTensor placed {placement!r}; checkpoints store Shard(0) (FSDP2) or Replicate"
        )
    if x.dtype not in DTYPE_CODES:
        raise TypeError(f"{path}: cannot store a sharded tensor of dtype {x.dtype}; only safetensors' native dtypes")
    return mesh.size()


def local_piece(x: Any, path: str, rank: int) -> torch.Tensor:
    """The DTensor ``x``'s local rows on mesh rank ``rank`` (checked against the rows ``chunk_rows`` gives it)."""
    mine = x.device_mesh.get_local_rank()
    if mine != rank:
        raise ValueError(f"{path}: this process is rank {mine} of the tensor's device mesh, not rank {rank}")
    local = x.to_local().detach()
    start, stop = chunk_rows(x.shape[0], x.device_mesh.size())[rank]
    if tuple(local.shape) != (stop - start, *x.shape[1:]):
        raise ValueError(
            f"{path}: rank {rank} holds rows of shape {tuple(local.shape)}, not rows {start}:{stop} of "
            f"{tuple(x.shape)} as torch.chunk splits them (uneven sharding is not supported)"
        )
    return local


@dataclass
class ShardPlan:
    """What rank 0 writes for the sharded entries of a state: its own pieces, the table ``meta.json`` records
    (``{"files": [...], "entries": {name: {"shape", "dtype", "pieces": [[file, start, stop], ...]}}}``) and the
    files the other ranks must write."""

    pieces: dict[str, torch.Tensor]
    table: dict[str, Any]
    files: list[str]


def plan_shards(sharded: dict[str, Any]) -> ShardPlan:
    """The :class:`ShardPlan` of the DTensors ``sharded`` (entry name -> DTensor) on rank 0."""
    pieces: dict[str, torch.Tensor] = {}
    entries: dict[str, Any] = {}
    files: set[str] = set()
    for name, x in sharded.items():
        world = x.device_mesh.size()
        pieces[name] = local_piece(x, name, 0)
        rows = chunk_rows(x.shape[0], world)
        entries[name] = {
            "shape": list(x.shape),
            "dtype": str(x.dtype).removeprefix("torch."),
            "pieces": [[shard_file(r), a, b] for r, (a, b) in enumerate(rows)],
        }
        files.update(shard_file(r) for r in range(1, world))
    needed = sorted(files, key=lambda f: int(f.removeprefix("shards-rank-").removesuffix(".safetensors")))
    return ShardPlan(pieces, {"files": needed, "entries": entries} if entries else {}, needed)


def _safe_open(path: str) -> Any:
    from safetensors import safe_open

    return safe_open(path, framework="pt")


@dataclass(frozen=True)
class ShardedTensorRef:
    """A sharded checkpoint entry read on demand: ``ref[a:b]`` is a tensor of its global rows ``a:b`` (read from
    the one or more rank files that hold them), ``ref.materialise()`` the whole tensor. Picklable (paths and
    numbers only; each read opens the files again), so it can be handed to another process.

    ``files[i]`` holds rows ``rows[i]`` of the entry under the name ``names[i]``. The files were verified when the
    checkpoint was loaded; a ref outlives neither the checkpoint folder nor its retention.
    """

    files: tuple[str, ...]
    names: tuple[str, ...]
    rows: tuple[tuple[int, int], ...]
    shape: torch.Size
    dtype: torch.dtype
    device: str = "cpu"

    @property
    def ndim(self) -> int:
        """Number of dimensions of the full tensor."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def numel(self) -> int:
        """Number of elements of the full tensor."""
        return self.shape.numel()

    def __getitem__(self, key: slice | int) -> torch.Tensor:
        if not isinstance(key, slice):
            try:
                index = operator.index(key) if not isinstance(key, bool) else None
            except TypeError:
                index = None
            if index is None:
                raise TypeError(f"a sharded tensor is indexed by a row or a row slice, not {type(key).__name__}")
            row = index + len(self) if index < 0 else index
            if not 0 <= row < len(self):
                raise IndexError(f"row {index} is out of range for a sharded tensor of {len(self)} rows")
            return self.read(row, row + 1)[0]
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a sharded tensor's rows are read as one contiguous range (slice step must be 1)")
        return self.read(start, max(start, stop))

    def read(self, start: int, stop: int, opener: FileOpener = _safe_open) -> torch.Tensor:
        """Rows ``start:stop`` of the full tensor on :attr:`device`; ``opener`` may reuse open file handles."""
        overlaps = [
            (path, name, a, lo, hi)
            for path, name, (a, b) in zip(self.files, self.names, self.rows, strict=True)
            for lo, hi in [(max(start, a), min(stop, b))]
            if lo < hi
        ]
        if len(overlaps) == 1:  # within one file: its slice is the result, no copy
            path, name, a, lo, hi = overlaps[0]
            return self._piece(opener, path, name, lo - a, hi - a).to(self.device)
        out = torch.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        for path, name, a, lo, hi in overlaps:
            out[lo - start : hi - start] = self._piece(opener, path, name, lo - a, hi - a)
        return out.to(self.device)

    @staticmethod
    def _piece(opener: FileOpener, path: str, name: str, start: int, stop: int) -> torch.Tensor:
        try:
            return opener(path).get_slice(name)[start:stop]
        except Exception as e:  # safetensors raises its own error types; the file changed after it was verified
            problem = " ".join(str(e).split())
            raise CheckpointError(
                f"checkpoint {Path(path).parent}: {Path(path).name} cannot be read ({problem}); it changed after "
                "the checkpoint was verified: load the checkpoint again"
            ) from e

    def materialise(self) -> torch.Tensor:
        """The whole tensor, read from every rank's file."""
        return self.read(0, len(self))


def _malformed(folder: Path, problem: str) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {folder}: meta.json {problem}; delete this checkpoint folder or load an older checkpoint"
    )


def shard_refs(folder: Path, table: Any, device: str, opener: FileOpener) -> dict[str, ShardedTensorRef]:
    """A :class:`ShardedTensorRef` for every entry of a checkpoint's shard table (``meta.json``'s ``sharded``),
    after checking (headers only) that each piece is in its file with the recorded shape and dtype."""
    entries = table.get("entries") if isinstance(table, dict) else None
    if not isinstance(entries, dict):
        raise _malformed(folder, "has a malformed table of sharded entries")
    refs = {}
    for name, entry in entries.items():
        refs[name] = ref = _ref(folder, name, entry, device)
        for path, piece, (a, b) in zip(ref.files, ref.names, ref.rows, strict=True):
            _check_piece(path, piece, (b - a, *ref.shape[1:]), ref.dtype, opener)
    return refs


def _ref(folder: Path, name: str, entry: Any, device: str) -> ShardedTensorRef:
    try:
        shape, dtype = torch.Size(entry["shape"]), getattr(torch, entry["dtype"])
        pieces = [(str(f), int(a), int(b)) for f, a, b in entry["pieces"]]
    except Exception as e:  # any malformed field: a damaged file, never a crash
        raise _malformed(folder, f"has a malformed sharded entry {name!r} ({type(e).__name__}: {e})") from e
    ends = [0] + [b for _, _, b in pieces]
    if (
        dtype not in DTYPE_CODES
        or not shape
        or any(a != ends[i] or b < a for i, (_, a, b) in enumerate(pieces))
        or ends[-1] != shape[0]
        or any(f != shard_file(r) for r, (f, _, _) in enumerate(pieces))
    ):
        raise _malformed(folder, f"has a malformed sharded entry {name!r} (pieces do not tile its rows)")
    return ShardedTensorRef(
        files=tuple(str(folder / f) for f, _, _ in pieces),
        names=(name,) * len(pieces),
        rows=tuple((a, b) for _, a, b in pieces),
        shape=shape,
        dtype=dtype,
        device=device,
    )


def _check_piece(path: str, name: str, shape: tuple[int, ...], dtype: torch.dtype, opener: FileOpener) -> None:
    fname, folder = Path(path).name, Path(path).parent
    try:
        piece = opener(path).get_slice(name)
        found, code = tuple(piece.get_shape()), piece.get_dtype()
    except Exception as e:  # a missing entry or an unreadable file
        problem = " ".join(str(e).split())
        raise CheckpointError(
            f"checkpoint {folder}: {fname} lacks the sharded entry {name} ({problem}); delete this checkpoint "
            "folder or load an older checkpoint"
        ) from e
    if found != shape or code != DTYPE_CODES[dtype]:
        raise CheckpointError(
            f"checkpoint {folder}: {fname} holds {name} as {code} {list(found)}, meta.json records "
            f"{DTYPE_CODES[dtype]} {list(shape)}; delete this checkpoint folder or load an older checkpoint"
        )


def iter_local_pieces(sharded: dict[str, Any], rank: int) -> Iterator[tuple[str, torch.Tensor]]:
    """``(entry name, local rows)`` of every DTensor in ``sharded`` on mesh rank ``rank``."""
    for name, x in sharded.items():
        yield name, local_piece(x, name, rank)
