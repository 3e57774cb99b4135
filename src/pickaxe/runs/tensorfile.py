"""Write a safetensors file tensor by tensor, hashing as it goes: the whole file never exists in memory.

``safetensors.torch.save_file`` copies every tensor into one bytes object before it writes anything, so saving a
state of N bytes briefly needs 2-3 N. :func:`write_tensors` writes the same format (an 8-byte little-endian header
length, the JSON header ``{name: {dtype, shape, data_offsets}, "__metadata__": {...}}`` padded with spaces to a
multiple of 8, then each tensor's raw bytes in header order) one bounded chunk at a time: a CPU tensor's own memory
is written as it is, a tensor on an accelerator (or a strided view) is copied to the host 64 MiB at a time. The
sha256 of the manifest entry is computed over the same chunks (in a helper thread, overlapping the writes), so the
file is never read back. Files load with ``safetensors.safe_open`` / ``load_file`` like any other.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHUNK_BYTES", "DTYPE_CODES", "stored_layout", "write_tensors"]

CHUNK_BYTES = 64 << 20
"""The most bytes of one tensor copied to the host (or hashed) at once."""

_OVERLAP_BYTES = 1 << 20

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
"""The dtypes this writer stores natively, by their safetensors code; any other is stored as its raw bytes (U8)."""


def stored_layout(t: torch.Tensor) -> tuple[str, list[int], int]:
    """``(safetensors dtype code, shape, bytes)`` under which ``t`` is stored: a dtype safetensors lacks (uint32,
    complex, float8, ...) is stored as a flat U8 tensor of its raw bytes (the caller records its dtype and shape)."""
    nbytes = t.numel() * t.element_size()
    if t.dtype in DTYPE_CODES:
        return DTYPE_CODES[t.dtype], list(t.shape), nbytes
    return "U8", [nbytes], nbytes


def _chunks(t: torch.Tensor) -> Iterator[memoryview]:
    """``t``'s bytes in storage order (row-major), as host buffers of at most :data:`CHUNK_BYTES`."""
    if not t.numel():
        return
    t = t.detach().resolve_conj().resolve_neg()
    if t.device.type == "cpu" and t.is_contiguous():  # its own memory, as it is
        view = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(view), CHUNK_BYTES):
            yield view[start : start + CHUNK_BYTES]
        return
    # On an accelerator the contiguous copy costs no host memory and each chunk is copied to the host on its own;
    # a strided view on the host is copied once (one tensor's worth).
    flat = t.contiguous().reshape(-1)
    step = max(1, CHUNK_BYTES // t.element_size())
    for start in range(0, flat.numel(), step):
        yield memoryview(flat[start : start + step].cpu().view(torch.uint8).numpy())


def _header(tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> tuple[bytes, list[str]]:
    """The length-prefixed, space-padded header and the tensor names in file order (widest dtype first, so each
    tensor starts at a multiple of its element size, as safetensors' own writer orders them)."""
    order = sorted(tensors, key=lambda name: -tensors[name].element_size())
    doc: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        code, shape, nbytes = stored_layout(tensors[name])
        doc[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body, order


def write_tensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None, sync: bool = True
) -> dict[str, Any]:
    """Write ``tensors`` (any device, any strides; tensors may share memory) to ``path`` as a safetensors file, one
    chunk at a time, and fsync it unless ``sync`` is False; return its manifest entry ``{"size", "sha256"}``.

    A dtype safetensors lacks is stored as flat U8 bytes (see :func:`stored_layout`). ``metadata`` goes into the
    header's ``__metadata__`` (default ``{"format": "pt"}``, as transformers expects).
    """
    if sys.byteorder != "little":  # safetensors is little-endian; raw tensor bytes are native-endian
        raise RuntimeError("writing safetensors files needs a little-endian machine")
    for name in tensors:
        if name == "__metadata__":
            raise ValueError("a tensor cannot be named __metadata__ in a safetensors file")
    header, order = _header(tensors, {"format": "pt"} if metadata is None else metadata)
    digest = hashlib.sha256(header)
    size = len(header)
    with open(path, "wb") as f, ThreadPoolExecutor(1) as hasher:
        f.write(header)
        for name in order:
            for chunk in _chunks(tensors[name]):
                size += len(chunk)
                if len(chunk) < _OVERLAP_BYTES:  # a small tensor: handing it to the thread costs more than hashing
                    digest.update(chunk)
                    f.write(chunk)
                    continue
                hashed = hasher.submit(digest.update, chunk)  # sha256 releases the GIL: it overlaps the write
                f.write(chunk)
                hashed.result()
        f.flush()
        if sync:
            os.fsync(f.fileno())
    return {"size": size, "sha256": digest.hexdigest()}
