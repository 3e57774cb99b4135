"""File digests, the one format every pickaxe record of a file uses: ``{"size": bytes, "sha256": hex}``.

A checkpoint's ``MANIFEST.json``, a final model's ``model.json``, an export's ``pickaxe_source.json`` (``files``), a
run's generated preference files (``preferences/MANIFEST.json``) and a run's ``inputs.json`` all record files this
way, and all check them with :func:`digest_problem`, so a truncated, overwritten or corrupted file reads the same
wherever it is found. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
"""The name of a folder's manifest: the size and sha256 of the files it lists (``{"format", "files"}``)."""


def file_digest(path: Path) -> dict[str, Any]:
    """``{"size", "sha256"}`` of a file (a manifest entry), hashed through a read-only memory map (no copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:  # empty files cannot be mapped
            return {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return {"size": size, "sha256": hashlib.sha256(view).hexdigest()}


def folder_digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The digest of every file under ``folder`` by its relative POSIX name, sorted; names in ``skip`` left out."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name not in skip:
            out[name] = file_digest(path)
    return out


def is_entry(entry: Any) -> bool:
    """Whether ``entry`` is a well-formed digest record (an int size and a str sha256)."""
    return isinstance(entry, dict) and type(entry.get("size")) is int and isinstance(entry.get("sha256"), str)


def digest_problem(actual: dict[str, Any] | None, recorded: dict[str, Any], record: str) -> str | None:
    """What is wrong with a file whose digest is ``actual`` (None: the file is missing) given the digest ``recorded``
    in the file named ``record``, as the end of a sentence that starts with the file's name; None when they match."""
    if actual is None:
        return f"is missing but listed in {record}"
    if actual["size"] != recorded["size"]:
        return f"has {actual['size']} bytes but {record} records {recorded['size']} (truncated or overwritten)"
    if actual["sha256"] != recorded["sha256"]:
        return f"does not match its sha256 in {record} (corrupted on disk)"
    return None


def file_problem(path: Path, recorded: dict[str, Any], record: str) -> str | None:
    """:func:`digest_problem` of the file at ``path`` (hashed now); an unreadable file is a problem too."""
    if not path.is_file():
        return digest_problem(None, recorded, record)
    try:
        actual = file_digest(path)
    except OSError as e:
        return " ".join(f"cannot be read ({e})".split())
    return digest_problem(actual, recorded, record)


def write_manifest(folder: Path, names: list[str], fmt: str) -> dict[str, dict[str, Any]]:
    """Write ``folder/MANIFEST.json`` (format ``fmt``) listing the digests of the files ``names`` in ``folder``,
    atomically (a synced temporary file, then a rename); return the listed digests."""
    files = {name: file_digest(folder / name) for name in names}
    tmp = folder / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"format": fmt, "files": files}, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / MANIFEST)
    return files


def read_manifest(folder: Path, fmt: str) -> dict[str, dict[str, Any]] | None:
    """The files listed by ``folder/MANIFEST.json`` when it is a manifest of format ``fmt``; None when there is none
    or it is another kind of file (one the user put there). ``ValueError`` (one line) when it is one of ours but
    its entries are malformed."""
    path = folder / MANIFEST
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        return None
    files = doc.get("files")
    if not isinstance(files, dict) or not all(is_entry(e) for e in files.values()):
        raise ValueError(f"{path} is malformed (a {fmt} manifest whose files are not size and sha256 records)")
    return files
