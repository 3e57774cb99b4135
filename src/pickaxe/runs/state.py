"""Split arbitrary training state into named tensors plus a JSON skeleton, and back, without pickle.

``flatten_state`` walks dicts, lists, tuples, Python scalars, bytes, torch tensors, numpy arrays and numpy
scalars. Every tensor or array goes into a flat ``{name: tensor}`` dict (ready for safetensors); everything
else goes into a JSON-serialisable skeleton in which tensors are replaced by references. Values JSON cannot
hold exactly are wrapped in marker objects:

- ``{"__tensor__": "t/3"}``: torch tensor (plus ``dtype``/``shape`` when safetensors lacks the dtype and
  it is stored as raw bytes);
- ``{"__sharded__": name}``: a ``DTensor`` whose rows are split over several ranks (FSDP2), stored as one piece per
  rank under ``name``, its path in the state (see :mod:`pickaxe.runs.shards`); a DTensor whose local tensor is
  the whole tensor (one rank, replicated) is stored as a plain tensor;
- ``{"__ndarray__": "t/4", "dtype": "<u4", "shape": [624]}``: numpy array, stored as its raw bytes;
- ``{"__npscalar__": base64, "dtype": "<f4"}``: numpy scalar;
- ``{"__tuple__": [...]}``: tuple;
- ``{"__dict__": [[key, value], ...]}``: dict with non-str keys or marker-like keys, or an OrderedDict;
- ``{"__float__": "nan"}``: nan, inf, -inf;
- ``{"__int__": "0x..."}``: int outside the signed 64-bit range;
- ``{"__bytes__": base64}``: bytes.

``unflatten_state`` inverts this exactly: tensors bitwise with their dtype, numpy arrays as numpy arrays,
tuples as tuples, int keys as ints. Subclasses of dict/list/tuple come back as the base type, except
``OrderedDict`` (kept, with the ``_metadata`` that ``nn.Module.state_dict()`` attaches).

:func:`split_state` is the form checkpoints write from: tensors as they are (no host copies; the streaming writer
copies one chunk at a time) and the sharded DTensors apart.
"""

from __future__ import annotations

import base64
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pickaxe.runs.shards import is_dtensor, shard_world

__all__ = ["FlatState", "flatten_state", "split_state", "unflatten_state"]

_MARKERS = frozenset(
    (
        "__tensor__",
        "__sharded__",
        "__ndarray__",
        "__npscalar__",
        "__tuple__",
        "__dict__",
        "__float__",
        "__int__",
        "__bytes__",
    )
)
_INT64 = 2**63
# dtypes every safetensors >= 0.4 stores natively; any other dense dtype (uint32, complex128, float8, ...)
# is stored as raw bytes plus dtype and shape, which is just as exact.
_NATIVE = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _float(x: float) -> Any:
    return x if math.isfinite(x) else {"__float__": repr(x)}  # repr: 'nan', 'inf', '-inf'


class _Flattener:
    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.tensors: dict[str, torch.Tensor] = {}
        self.sharded: dict[str, Any] = {}
        self.storages: set[int] = set()

    def add(self, t: torch.Tensor) -> str:
        name = f"t/{len(self.tensors)}"
        if self.stream:  # the streaming writer copies each tensor's bytes itself: shared memory is no problem
            self.tensors[name] = t
            return name
        # Tensors sharing memory (views, tied weights, the same tensor twice) must be stored as independent
        # copies: safetensors refuses shared storage.
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.storages:
            t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        if ptr:  # empty storages have no address and never clash
            self.storages.add(ptr)
        self.tensors[name] = t
        return name

    def key(self, k: Any, path: str) -> Any:
        if k is None or type(k) in (str, int, bool, float) or isinstance(k, tuple):
            return self.enc(k, path)
        raise TypeError(f"{path}: cannot store dict key {k!r} of type {type(k).__name__}")

    def enc(self, x: Any, path: str) -> Any:
        if isinstance(x, torch.Tensor):
            if is_dtensor(x):
                if shard_world(x, path) > 1:
                    return self.shard(x, path)
                x = x.to_local()
            if x.layout != torch.strided or x.is_meta or x.is_quantized:
                raise TypeError(f"{path}: cannot store a {x.layout}/meta/quantized tensor; make it dense first")
            if self.stream:
                t = x.detach()
                if t.dtype in _NATIVE:
                    return {"__tensor__": self.add(t)}
                raw = self.add(t)  # stored as its raw bytes by the writer
                return {"__tensor__": raw, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            t = x.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
            if t.dtype in _NATIVE:
                return {"__tensor__": self.add(t)}
            raw = self.add(t.reshape(-1).view(torch.uint8))
            return {"__tensor__": raw, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject or x.dtype.fields is not None or x.dtype.subdtype is not None:
                raise TypeError(f"{path}: cannot store numpy array of dtype {x.dtype} (object/structured)")
            a = np.ascontiguousarray(x)
            if not a.flags.writeable:  # torch.from_numpy warns on read-only memory
                a = a.copy()
            name = self.add(torch.from_numpy(a.reshape(-1).view(np.uint8)))
            return {"__ndarray__": name, "dtype": a.dtype.str, "shape": list(x.shape)}  # a is >= 1-d
        if isinstance(x, np.generic):  # before float/int: np.float64 subclasses float
            if x.dtype.hasobject or x.dtype.fields is not None:
                raise TypeError(f"{path}: cannot store numpy scalar of dtype {x.dtype}")
            return {"__npscalar__": _b64(x.tobytes()), "dtype": x.dtype.str}
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return x if -_INT64 <= x < _INT64 else {"__int__": hex(x)}
        if t is float:
            return _float(x)
        if t is bytes:
            return {"__bytes__": _b64(x)}
        if isinstance(x, dict):
            if t is dict and all(type(k) is str and k not in _MARKERS for k in x):
                return {k: self.enc(v, f"{path}[{k!r}]") for k, v in x.items()}
            pairs = [[self.key(k, f"{path} key {k!r}"), self.enc(v, f"{path}[{k!r}]")] for k, v in x.items()]
            out: dict[str, Any] = {"__dict__": pairs}
            if isinstance(x, OrderedDict):
                out["ordered"] = True
                if hasattr(x, "_metadata"):
                    out["metadata"] = self.enc(x._metadata, f"{path}._metadata")
            return out
        if isinstance(x, list):
            return [self.enc(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"__tuple__": [self.enc(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        raise TypeError(f"{path}: cannot store object of type {t.__name__}")

    def shard(self, x: Any, path: str) -> dict[str, str]:
        if not self.stream:
            raise TypeError(
                f"{path}: a tensor sharded over {x.device_mesh.size()} ranks; save it with CheckpointManager.save "
                "(rank 0) and write_rank_shards (the other ranks)"
            )
        if path in self.sharded:  # paths are unique within one state; never overwrite an entry
            raise TypeError(f"{path}: two sharded tensors have this path")
        self.sharded[path] = x
        return {"__sharded__": path}


def flatten_state(obj: Any, root: str = "state") -> tuple[dict[str, torch.Tensor], Any]:
    """Split ``obj`` into ``({name: contiguous CPU tensor}, JSON-serialisable skeleton)``.

    Tensors are detached and moved to CPU; tensors that share memory are copied so that each stored tensor
    is independent. Raises ``TypeError`` naming the location (``state['algo']['foo']``) of any value that
    cannot be stored (a DTensor sharded over several ranks included: see :func:`split_state`); ``root`` is the
    name used for the top of that path.
    """
    f = _Flattener(stream=False)
    skeleton = f.enc(obj, root)
    return f.tensors, skeleton


@dataclass
class FlatState:
    """A state split for :func:`pickaxe.runs.tensorfile.write_tensors`: ``tensors`` as the state holds them (any
    device and strides, possibly sharing memory; a dtype safetensors lacks is written as raw bytes, as the
    skeleton records), the JSON ``skeleton``, and ``sharded``: entry name -> DTensor split over several ranks."""

    tensors: dict[str, torch.Tensor]
    skeleton: Any
    sharded: dict[str, Any]


def split_state(obj: Any, root: str = "state") -> FlatState:
    """:func:`flatten_state` without copies, for streaming writes: see :class:`FlatState`. Every rank of a sharded
    state gets the same entry names for the same structure (an entry's name is its path from ``root``)."""
    f = _Flattener(stream=True)
    skeleton = f.enc(obj, root)
    return FlatState(f.tensors, skeleton, f.sharded)


def unflatten_state(tensors: dict[str, Any], skeleton: Any, map_location: str | torch.device | None = None) -> Any:
    """Rebuild the object that :func:`flatten_state` split into ``tensors`` and ``skeleton``.

    Torch tensors are moved to ``map_location`` when given; numpy arrays always come back on the host. A sharded
    entry (``{"__sharded__": name}``) is ``tensors[name]`` as given: the full tensor (moved too) or a
    :class:`~pickaxe.runs.shards.ShardedTensorRef`. Raises ``ValueError`` for a malformed skeleton or a
    reference to a missing tensor.
    """

    def tensor(name: Any, path: str) -> Any:
        if not isinstance(name, str) or name not in tensors:
            raise ValueError(f"{path}: skeleton refers to tensor {name!r}, which is not in the tensor file")
        return tensors[name]

    def np_dtype(spec: Any, path: str) -> np.dtype:
        dtype = np.dtype(spec) if isinstance(spec, str) else None
        if dtype is None or dtype.hasobject:  # never build object arrays (pointers) from stored bytes
            raise ValueError(f"{path}: invalid numpy dtype {spec!r}")
        return dtype

    def dec(x: Any, path: str) -> Any:
        if isinstance(x, list):
            return [dec(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if not isinstance(x, dict):
            return x
        if "__tensor__" in x:
            t = tensor(x["__tensor__"], path)
            if "dtype" in x:
                dtype = getattr(torch, x["dtype"], None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"{path}: unknown torch dtype {x['dtype']!r}")
                t = t.view(dtype).reshape(x["shape"])
            return t if map_location is None else t.to(map_location)
        if "__sharded__" in x:
            t = tensor(x["__sharded__"], path)
            return t.to(map_location) if map_location is not None and isinstance(t, torch.Tensor) else t
        if "__ndarray__" in x:
            raw = tensor(x["__ndarray__"], path).cpu().numpy()
            return raw.view(np_dtype(x["dtype"], path)).reshape(x["shape"])
        if "__npscalar__" in x:
            return np.frombuffer(base64.b64decode(x["__npscalar__"]), dtype=np_dtype(x["dtype"], path))[0]
        if "__tuple__" in x:
            return tuple(dec(v, f"{path}[{i}]") for i, v in enumerate(x["__tuple__"]))
        if "__float__" in x:
            return float(x["__float__"])
        if "__int__" in x:
            return int(x["__int__"], 16)
        if "__bytes__" in x:
            return base64.b64decode(x["__bytes__"])
        if "__dict__" in x:
            pairs = ((dec(k, f"{path} key"), v) for k, v in x["__dict__"])
            d = {k: dec(v, f"{path}[{k!r}]") for k, v in pairs}
            if x.get("ordered"):
                d = OrderedDict(d)
                if "metadata" in x:
                    d._metadata = dec(x["metadata"], f"{path}._metadata")  # type: ignore[attr-defined]
            return d
        return {k: dec(v, f"{path}[{k!r}]") for k, v in x.items()}

    return dec(skeleton, "state")
