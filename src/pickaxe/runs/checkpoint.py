"""Atomic, checksummed, pickle-free checkpoints with last-K / best-K retention.

Layout of one checkpoint, ``RUN_DIR/checkpoints/step-<12-digit step>/``:

- ``tensors.safetensors``: every tensor / numpy array of the state (see :mod:`pickaxe.runs.state`), written
  tensor by tensor (:mod:`pickaxe.runs.tensorfile`: the file is never built in memory) and hashed as it is written;
- ``shards-rank-<r>.safetensors`` (sharded states only): rank ``r``'s rows of every tensor sharded over the
  learners (FSDP2 DTensors), written by that rank (:func:`write_rank_shards`) while rank 0 saves; rank 0's rows
  are in ``tensors.safetensors`` (see :mod:`pickaxe.runs.shards`);
- ``meta.json``: the JSON skeleton of the state, the step, the metric, the user metadata, creation time and
  format version (2 when the state has sharded entries, with their table; 1 otherwise);
- ``MANIFEST.json``: written last, the size and sha256 digest of every other file.

A checkpoint is written into ``checkpoints/.tmp-step-<N>-<random>/`` with every file and the folder fsynced,
then renamed into place, and ``checkpoints/latest`` is replaced atomically with the folder name. A writer
killed midway leaves only a ``.tmp-*`` entry, which loading ignores and the next save removes. Loading
verifies sizes and digests first, reads tensors with safetensors and everything else with json: nothing is
ever unpickled, so a planted pickle can at worst fail to load. Sharded entries load as full tensors (read row
range by row range from each rank's file) or, with ``lazy_shards``, as :class:`~pickaxe.runs.shards.ShardedTensorRef`
that read any rows on demand: a checkpoint written by N learners resumes on M.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import operator
import os
import re
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pickaxe.digests import is_entry
from pickaxe.errors import CheckpointError, PickaxeError, error_line
from pickaxe.faults import fault_point

if TYPE_CHECKING:
    import torch

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointWarning",
    "ShardStarter",
    "ShardWriter",
    "load_checkpoint",
    "save_checkpoint",
    "start_rank_shards",
    "wait_rank_shards",
    "write_rank_shards",
]

logger = logging.getLogger(__name__)

FORMAT = "pickaxe-checkpoint"
FORMAT_VERSION = 2
"""The newest format this pickaxe reads; it writes version 1 (readable by older pickaxe) unless the state is sharded."""
TENSORS, META, MANIFEST, LATEST = "tensors.safetensors", "meta.json", "MANIFEST.json", "latest"
_TMP = ".tmp-"
_STEP_RE = re.compile(r"step-(\d{12})")
_FIX = "delete this checkpoint folder or load an older checkpoint"


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped while looking for the newest good one."""


SkipHandler = Callable[[str], None]
"""Receives the one-line report of a skipped (damaged) checkpoint."""

ShardWriter = Callable[[Path], dict[str, dict[str, Any]]]
"""Called by rank 0's save with the temporary checkpoint folder: has every other rank write its shard file there
(:func:`write_rank_shards`) and returns their manifest entries ``{file name: {"size", "sha256"}}``."""
ShardStarter = Callable[[Path], Callable[[], dict[str, dict[str, Any]]]]
"""A background save's :data:`ShardWriter`: called by rank 0 before its save returns, it asks every other rank to copy
its shards to host memory (before its next update) and write them in the background (:func:`start_rank_shards`);
the function it returns, called by rank 0's writing thread, waits for their manifest entries."""


@dataclass
class _Job:
    """A checkpoint being written: its name, final and temporary folders, the tensors and meta to write, its
    format version and the other learners' shard files it needs."""

    name: str
    final: Path
    tmp: Path
    tensors: dict[str, Any]
    meta_bytes: bytes
    format_version: int
    needed: list[str]


@dataclass
class _Pending:
    """A background save: the folder it commits, its thread, and the error it ended with."""

    final: Path
    thread: threading.Thread | None = None
    error: BaseException | None = None


@dataclass
class CheckpointInfo:
    """One complete checkpoint folder: its path, training step, optional metric and user metadata."""

    path: Path
    step: int
    metric: float | None
    meta: dict = field(default_factory=dict)


def _name(step: int) -> str:
    return f"step-{step:012d}"


def _bad(folder: Path, fname: str, problem: str) -> CheckpointError:
    problem = " ".join(problem.split())  # one line, whatever the underlying error printed
    return CheckpointError(f"checkpoint {folder}: {fname} {problem}; {_FIX}")


def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(f: BinaryIO) -> str:
    """Hex sha256 of an open binary file from its current position (hashlib.file_digest on Python 3.11+)."""
    if hasattr(hashlib, "file_digest"):
        return hashlib.file_digest(f, "sha256").hexdigest()
    h, buf = hashlib.sha256(), bytearray(1 << 20)
    view = memoryview(buf)
    while n := f.readinto(buf):
        h.update(view[:n])
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    """Make a written file's contents durable."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _write_bytes(path: Path, data: bytes, sync: bool = True) -> dict[str, Any]:
    """Write ``data`` (and fsync it unless ``sync`` is False); return its manifest entry."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _read_json(folder: Path, fname: str) -> Any:
    try:
        return json.loads((folder / fname).read_bytes())
    except OSError as e:
        raise _bad(folder, fname, f"cannot be read ({e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(folder, fname, f"is not valid JSON ({e})") from e
    except RecursionError as e:  # absurdly nested JSON: damaged, never a crash
        raise _bad(folder, fname, "nests JSON too deeply to read") from e


def _check_file(folder: Path, fname: str, entry: Any) -> None:
    if fname in ("", ".", "..", MANIFEST) or "/" in fname or "\\" in fname:
        raise _bad(folder, MANIFEST, f"lists an invalid file name {fname!r}")
    if not isinstance(entry, dict) or type(entry.get("size")) is not int or "sha256" not in entry:
        raise _bad(folder, MANIFEST, f"has a malformed entry for {fname}")
    if not (folder / fname).is_file():
        raise _bad(folder, fname, "is missing but listed in MANIFEST.json")
    try:
        with open(folder / fname, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != entry["size"]:
                problem = f"has {size} bytes but MANIFEST.json records {entry['size']}"
                raise _bad(folder, fname, problem + " (truncated or overwritten)")
            if _sha256(f) != entry["sha256"]:
                raise _bad(folder, fname, "does not match its sha256 in MANIFEST.json (corrupted on disk)")
    except OSError as e:
        raise _bad(folder, fname, f"cannot be read ({e})") from e


def _verify(folder: Path) -> dict[str, Any]:
    """Check manifest, sizes, digests and metadata of one checkpoint; return its parsed meta.json."""
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint {folder} does not exist or is not a folder; pass a checkpoint folder such as "
            "RUN_DIR/checkpoints/step-000000001000"
        )
    if not (folder / MANIFEST).is_file():
        raise _bad(folder, MANIFEST, "is missing (the writer was interrupted or the file was deleted)")
    manifest = _read_json(folder, MANIFEST)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != FORMAT:
        raise _bad(folder, MANIFEST, "is not a pickaxe checkpoint manifest")
    for required in (TENSORS, META):
        if required not in files:
            raise _bad(folder, MANIFEST, f"does not list {required}")
    extra = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST and p.name not in files)
    if extra:
        raise _bad(folder, extra[0], "is not listed in MANIFEST.json (unexpected file; it is never loaded)")
    for fname, entry in files.items():
        _check_file(folder, fname, entry)
    meta = _read_json(folder, META)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "skeleton" not in meta:
        raise _bad(folder, META, "is not pickaxe checkpoint metadata")
    if type(meta.get("step")) is not int or not isinstance(meta.get("meta", {}), dict):
        raise _bad(folder, META, "has a malformed step or meta field")
    version = meta.get("format_version")
    if type(version) is not int or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {folder}: {META} has format version {version!r}, this pickaxe reads versions <= "
            f"{FORMAT_VERSION}; upgrade pickaxe to load it"
        )
    sharded = meta.get("sharded")
    needed = sharded.get("files") if isinstance(sharded, dict) else [] if sharded is None else None
    if not isinstance(needed, list):
        raise _bad(folder, META, "has a malformed table of sharded entries")
    for fname in needed:
        if fname not in files:  # a learner's shard file the manifest does not cover cannot be trusted
            raise _bad(folder, MANIFEST, f"does not list {fname}, which {META} needs (a learner's shards)")
    return meta


def _metric(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def _info(folder: Path, meta: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(folder, meta["step"], _metric(meta.get("metric")), meta.get("meta") or {})


def _load_one(folder: Path, map_location: str | torch.device, lazy_shards: bool = False) -> tuple[Any, CheckpointInfo]:
    import torch
    from safetensors import safe_open

    from pickaxe.runs.shards import shard_refs
    from pickaxe.runs.state import unflatten_state

    device = torch.device(map_location)
    torch.empty(0, device=device)  # an unusable device is the caller's error, not a damaged checkpoint
    meta = _verify(folder)
    handles: dict[str, Any] = {}

    def opener(path: str) -> Any:
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        return handles[path]

    try:
        try:
            refs = shard_refs(folder, meta["sharded"], str(device), opener) if meta.get("sharded") else {}
            main = opener(str(folder / TENSORS))
            # one tensor at a time (never the file's bytes and the state together); rank 0's pieces of the
            # sharded entries are read through their refs
            tensors: dict[str, Any] = {k: main.get_tensor(k) for k in main.keys() if k not in refs}  # noqa: SIM118
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error type for any malformed file
            raise _bad(folder, TENSORS, f"is not a valid safetensors file ({e})") from e
        for name, ref in refs.items():
            tensors[name] = ref if lazy_shards else ref.read(0, len(ref), opener)
    finally:
        handles.clear()
    try:
        state = unflatten_state(tensors, meta["skeleton"], map_location=None if device.type == "cpu" else device)
    except Exception as e:
        raise _bad(folder, META, f"does not match the tensors in {TENSORS} ({e})") from e
    return state, _info(folder, meta)


class CheckpointManager:
    """Save, list, verify and load the checkpoints of one run in ``RUN_DIR/checkpoints``.

    Retention after each save keeps the ``keep_last`` newest checkpoints by step plus the ``keep_best`` best
    by metric (``mode`` ``"max"`` or ``"min"``; checkpoints without a metric never count as best), and
    never the one ``latest`` points to.

    With sharded learners (FSDP2) the launcher sets, on rank 0, ``shard_writer`` (see :data:`ShardWriter`; called
    by every save once rank 0's files are written, before the manifest, whether or not the state holds sharded
    tensors, so the other ranks can wait for it) and ``lazy_shards`` (loads give sharded entries as
    :class:`~pickaxe.runs.shards.ShardedTensorRef` unless a call says otherwise).
    """

    shard_writer: ShardWriter | None = None
    shard_starter: ShardStarter | None = None
    lazy_shards: bool = False
    _pending: _Pending | None = None

    def __init__(self, run_dir: str | Path, keep_last: int = 3, keep_best: int = 1, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if keep_last < 0 or keep_best < 0:
            raise ValueError(f"keep_last and keep_best must be >= 0, got {keep_last} and {keep_best}")
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "checkpoints"
        self.keep_last, self.keep_best, self.mode = keep_last, keep_best, mode

    # ----------------------------------------------------------------------------------------- writing
    def save(self, step: int, state: Any, metric: float | None = None, meta: dict | None = None) -> Path:
        """Atomically write ``state`` as the checkpoint of ``step``, point ``latest`` at it, apply retention.

        ``state`` may hold anything :func:`~pickaxe.runs.state.flatten_state` accepts (``TypeError``
        otherwise, before anything is written); ``meta`` must be JSON-serialisable. A nan/inf ``metric`` is
        logged and stored as None. A checkpoint of the same step is replaced. Returns the checkpoint folder.
        Tensors are written from where they are, one chunk at a time (no copy of the state is made). DTensors
        sharded over several learners (this process being rank 0 of their mesh) need :attr:`shard_writer`
        (``ValueError`` before anything is written without one); a save whose shard writer fails or omits a
        learner's file raises and leaves the previous checkpoint as ``latest``. A background save still in flight
        (:meth:`save_async`) is finished first.
        """
        self.wait()
        job = self._prepare(step, state, metric, meta, self.shard_writer, "shard_writer")
        writer = self.shard_writer
        return self._write(job, job.tensors, None if writer is None else lambda: writer(job.tmp))

    def save_async(self, step: int, state: Any, metric: float | None = None, meta: dict | None = None) -> Path:
        """:meth:`save` in the background: returns once ``state``'s tensors are copied to host memory
        (:func:`~pickaxe.runs.snapshot.host_copy`; with sharded learners, once every learner was asked to copy its
        shards: they do it before their next update), and a helper thread writes and commits the copies exactly as
        :meth:`save` does (same files, same atomic rename, then ``latest`` and retention). Returns the folder the
        checkpoint will have. At most one save is in flight: an earlier one is finished first (:meth:`wait`), and
        so is any :meth:`save` or :meth:`load`. A process killed while the thread writes leaves only a ``.tmp-*``
        folder: ``latest`` still names the previous checkpoint. Sharded states need :attr:`shard_starter`."""
        self.wait()
        job = self._prepare(step, state, metric, meta, self.shard_starter, "shard_starter")
        try:
            from pickaxe.runs.snapshot import host_copy

            tensors = host_copy(job.tensors)
            finish = None if self.shard_starter is None else self.shard_starter(job.tmp)
        except BaseException:
            shutil.rmtree(job.tmp, ignore_errors=True)
            raise
        pending = _Pending(job.final)

        def write() -> None:
            try:
                self._write(job, tensors, finish)
            except BaseException as e:  # handed to whoever waits next
                pending.error = e
            finally:
                tensors.clear()  # the copies go as soon as the write ends, not when the next save waits

        pending.thread = threading.Thread(target=write, name=f"checkpoint-{job.name}", daemon=True)
        self._pending = pending
        pending.thread.start()
        return job.final

    def wait(self) -> Path | None:
        """Finish the background save in flight, if any: its folder, None without one. Re-raises the error of a
        background save that failed (the previous checkpoint is still ``latest``); the error is raised once."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        assert pending.thread is not None
        pending.thread.join()
        if pending.error is not None:
            raise pending.error
        return pending.final

    def _prepare(
        self, step: int, state: Any, metric: float | None, meta: dict | None, sharer: Any, sharer_name: str
    ) -> _Job:
        """Check and split ``state``, and create the temporary folder the checkpoint of ``step`` is written into."""
        step = operator.index(step)
        if not 0 <= step < 10**12:
            raise ValueError(f"step must be in [0, 10**12), got {step}")
        if metric is not None and not math.isfinite(metric := float(metric)):
            logger.warning("checkpoint of step %d: metric %s is not finite; stored without one", step, metric)
            metric = None  # never counts as best
        from pickaxe.runs.shards import plan_shards
        from pickaxe.runs.state import split_state

        flat = split_state(state)
        plan = plan_shards(flat.sharded)
        if plan.files and sharer is None:
            raise ValueError(
                f"the state holds tensors sharded over several learners (e.g. {next(iter(flat.sharded))}) but "
                f"CheckpointManager.{sharer_name} is None: the launcher must set it so that the other learners write "
                "their shards"
            )
        doc = {
            "format": FORMAT,
            "format_version": 2 if plan.table else 1,
            "step": step,
            "metric": metric,
            "created": time.time(),
            "meta": meta or {},
            "skeleton": flat.skeleton,
            **({"sharded": plan.table} if plan.table else {}),
        }
        try:
            meta_bytes = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint meta must be JSON-serialisable (no nan/inf, no objects): {e}") from e

        self.dir.mkdir(parents=True, exist_ok=True)
        self._remove_tmp()
        name = _name(step)
        tmp = self.dir / f"{_TMP}{name}-{secrets.token_hex(4)}"
        tmp.mkdir()
        tensors = {**flat.tensors, **plan.pieces}
        return _Job(name, self.dir / name, tmp, tensors, meta_bytes, doc["format_version"], plan.files)

    def _write(self, job: _Job, tensors: dict[str, Any], shards: Callable[[], Any] | None) -> Path:
        """Write ``tensors`` and the other files of ``job`` into its temporary folder, rename it into place, point
        ``latest`` at it and apply retention; ``shards`` returns the other learners' manifest entries."""
        tmp, final, name = job.tmp, job.final, job.name
        try:
            from pickaxe.runs.tensorfile import write_tensors

            files = {TENSORS: write_tensors(tmp / TENSORS, tensors, sync=False)}
            fault_point("checkpoint-tensors")  # tests kill at each write of the protocol
            # The fsyncs run in helper threads, overlapping each other and the other ranks' writes (the file
            # system can commit them together); every file is durable before the folder is synced and renamed.
            with ThreadPoolExecutor(3) as pool:
                synced = [pool.submit(fsync_file, tmp / TENSORS)]
                files[META] = _write_bytes(tmp / META, job.meta_bytes, False)
                fault_point("checkpoint-meta")
                synced.append(pool.submit(fsync_file, tmp / META))
                if shards is not None:
                    files.update(_shard_entries(tmp, shards(), job.needed))
                fault_point("checkpoint-shards")  # the other ranks' files written and synced, no manifest yet
                manifest = {"format": FORMAT, "format_version": job.format_version, "files": files}
                _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode(), sync=False)
                fault_point("checkpoint-manifest")
                synced.append(pool.submit(fsync_file, tmp / MANIFEST))
                for done in synced:
                    done.result()  # re-raises an fsync error
            _fsync_dir(tmp)
            fault_point("checkpoint-write")  # tests kill here: complete files, folder not yet in place
            old = None
            if final.exists():  # a directory rename cannot replace a non-empty one: move the old aside first
                old = self.dir / f"{_TMP}old-{name}-{secrets.token_hex(4)}"
                os.replace(final, old)
            os.replace(tmp, final)
            fault_point("checkpoint-renamed")  # in place, ``latest`` still names the previous one
            _fsync_dir(self.dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._write_pointer(name)
        self._apply_retention(name)
        return final

    def _remove_tmp(self) -> None:
        for p in self.dir.glob(f"{_TMP}*"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def _write_pointer(self, name: str) -> None:
        tmp = self.dir / f"{_TMP}{LATEST}-{secrets.token_hex(4)}"
        _write_bytes(tmp, f"{name}\n".encode())
        fault_point("latest-tmp")  # new name written and synced, old pointer not yet replaced
        os.replace(tmp, self.dir / LATEST)
        _fsync_dir(self.dir)

    def _pointer(self) -> str | None:
        try:
            name = (self.dir / LATEST).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return name if _STEP_RE.fullmatch(name) else None

    def _apply_retention(self, current: str) -> None:
        infos = self.list()
        keep = {current, self._pointer()}
        if self.keep_last:
            keep |= {i.path.name for i in infos[-self.keep_last :]}
        sign = 1.0 if self.mode == "max" else -1.0
        scored = sorted((i for i in infos if i.metric is not None), key=lambda i: (sign * i.metric, i.step))
        keep |= {i.path.name for i in scored[::-1][: self.keep_best]}  # best first; ties: newest
        for info in infos:
            if info.path.name not in keep:
                # rename first so a half-deleted folder is never mistaken for a checkpoint
                trash = self.dir / f"{_TMP}del-{info.path.name}-{secrets.token_hex(4)}"
                try:
                    os.replace(info.path, trash)
                    fault_point("checkpoint-retention")
                    shutil.rmtree(trash, ignore_errors=True)
                except OSError as e:
                    logger.warning("could not delete old checkpoint %s: %s", info.path, e)

    # ----------------------------------------------------------------------------------------- reading
    def list(self) -> list[CheckpointInfo]:
        """Complete (renamed into place) checkpoints sorted by step; digests are not verified."""
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.iterdir():
            m = _STEP_RE.fullmatch(p.name)
            if not (m and p.is_dir()):
                continue
            metric, meta = None, {}
            try:
                doc = json.loads((p / META).read_bytes())
                metric, meta = _metric(doc.get("metric")), doc.get("meta") or {}
            except (OSError, ValueError, AttributeError, RecursionError):
                pass  # damaged: listed anyway, verify()/load() will report it
            out.append(CheckpointInfo(p, int(m.group(1)), metric, meta if isinstance(meta, dict) else {}))
        return sorted(out, key=lambda i: i.step)

    def _resolve(self, path: str | Path) -> Path:
        p = Path(path)
        return self.dir / p if not p.exists() and (self.dir / p).exists() else p

    def verify(self, path: str | Path) -> None:
        """Raise :class:`CheckpointError` naming the bad file if the checkpoint at ``path`` is damaged.

        Detects a missing manifest, missing or unexpected files, size mismatches (truncation), digest
        mismatches (bit flips) and unparsable JSON. ``path`` may also be a folder name inside ``checkpoints``.
        """
        _verify(self._resolve(path))

    def _candidates(self) -> list[CheckpointInfo]:
        """Checkpoints in load order: ``latest``'s target, older ones newest first, then any newer ones."""
        infos = self.list()
        names = [i.path.name for i in infos]
        pointer = self._pointer()
        if pointer not in names:
            return infos[::-1]
        i = names.index(pointer)
        return [infos[i], *infos[:i][::-1], *infos[i + 1 :][::-1]]

    def _skip(self, info: CheckpointInfo, err: CheckpointError, on_skip: SkipHandler | None) -> None:
        """Report a skipped checkpoint once: to ``on_skip`` if given, else as a :class:`CheckpointWarning`."""
        msg = f"skipping damaged checkpoint {info.path.name} and trying the previous one: {err}"
        if on_skip is not None:
            on_skip(msg)
        else:
            warnings.warn(msg, CheckpointWarning, stacklevel=3)

    def _settle(self, on_skip: SkipHandler | None) -> None:
        """Before reading: finish a background save in flight; one that failed is reported like a skipped
        checkpoint (the previous one is still ``latest``)."""
        try:
            self.wait()
        except Exception as e:
            msg = f"the checkpoint written in the background failed and is not used: {type(e).__name__}: {e}"
            if on_skip is not None:
                on_skip(msg)
            else:
                warnings.warn(msg, CheckpointWarning, stacklevel=3)

    def _none_good(self, tried: list[str]) -> CheckpointError:
        if not tried:
            return CheckpointError(f"no checkpoint found in {self.dir}; check run_dir or start training from scratch")
        names = ", ".join(tried)
        return CheckpointError(
            f"no good checkpoint in {self.dir} (tried newest to oldest: {names}; each reason is reported above); "
            "restore the folder from a backup or start training from scratch"
        )

    def load(
        self,
        path: str | Path | None = None,
        map_location: str | torch.device = "cpu",
        accept: Callable[[Any, CheckpointInfo], None] | None = None,
        on_skip: SkipHandler | None = None,
        lazy_shards: bool | None = None,
    ) -> tuple[Any, CheckpointInfo]:
        """Load a checkpoint's state and info; nothing is unpickled.

        With ``path`` None, start at the checkpoint ``latest`` points to (else the newest by step) and walk
        to older ones, skipping damaged ones; raise :class:`CheckpointError` naming what was tried if none is
        good. Each skip is reported once: to ``on_skip(message)`` if given, else as a :class:`CheckpointWarning`.
        ``accept(state, info)``, if given, is part of the check: a checkpoint whose state it refuses (any
        exception, e.g. another algorithm's state or wrong shapes) counts as damaged and the walk goes on.
        With ``path`` given, load exactly that checkpoint or raise :class:`CheckpointError`. Tensors are moved
        to ``map_location``. Sharded entries come back whole, or as
        :class:`~pickaxe.runs.shards.ShardedTensorRef` with ``lazy_shards`` (None: the manager's
        :attr:`lazy_shards`).
        """
        self._settle(on_skip)
        lazy = self.lazy_shards if lazy_shards is None else lazy_shards
        if path is not None:
            return self._load_accepted(self._resolve(path), map_location, accept, lazy)
        tried = []
        for info in self._candidates():
            try:
                return self._load_accepted(info.path, map_location, accept, lazy)
            except CheckpointError as e:
                self._skip(info, e, on_skip)
                tried.append(info.path.name)
        raise self._none_good(tried)

    @staticmethod
    def _load_accepted(
        folder: Path,
        map_location: str | torch.device,
        accept: Callable[[Any, CheckpointInfo], None] | None,
        lazy_shards: bool = False,
    ) -> tuple[Any, CheckpointInfo]:
        state, info = _load_one(folder, map_location, lazy_shards)
        if accept is not None:
            try:
                accept(state, info)
            except CheckpointError:
                raise
            except Exception as e:  # any refusal of the state makes this checkpoint unusable
                problem = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                raise _bad(folder, META, f"holds state this run cannot load ({problem})") from e
        return state, info

    def latest(self, on_skip: SkipHandler | None = None) -> CheckpointInfo | None:
        """Info of the checkpoint :meth:`load` would pick (digests verified), or None if there is none."""
        self._settle(on_skip)
        for info in self._candidates():
            try:
                return _info(info.path, _verify(info.path))
            except CheckpointError as e:
                self._skip(info, e, on_skip)
        return None


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    state: Any,
    *,
    metric: float | None = None,
    meta: dict | None = None,
    keep_last: int = 3,
    keep_best: int = 1,
    mode: str = "max",
) -> Path:
    """Save ``state`` as ``run_dir``'s checkpoint of ``step`` (see :meth:`CheckpointManager.save`)."""
    return CheckpointManager(run_dir, keep_last, keep_best, mode).save(step, state, metric=metric, meta=meta)


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", lazy_shards: bool = False
) -> tuple[Any, CheckpointInfo]:
    """Load from a checkpoint folder (``.../step-<N>``), or the newest good checkpoint of a run folder; sharded
    entries whole, or as :class:`~pickaxe.runs.shards.ShardedTensorRef` with ``lazy_shards``."""
    p = Path(path)
    if _STEP_RE.fullmatch(p.name) or (p / MANIFEST).exists():
        return _load_one(p, map_location, lazy_shards)
    return CheckpointManager(p).load(map_location=map_location, lazy_shards=lazy_shards)


def write_rank_shards(folder: Path, state: Any, rank: int) -> dict[str, dict[str, Any]]:
    """On learner ``rank`` (not 0) while rank 0 saves: write this rank's rows of every sharded tensor of ``state``
    (``{"algo": algo.state_dict()}``: the structure of rank 0's state there, so the same entry names) to
    ``folder/shards-rank-<rank>.safetensors``, streamed and fsynced; return its manifest entry
    ``{file name: {"size", "sha256"}}`` for rank 0's :data:`ShardWriter` (empty when nothing is sharded)."""
    return _write_pieces(folder, _rank_pieces(state, rank), rank)


def _rank_pieces(state: Any, rank: int) -> dict[str, torch.Tensor]:
    """Learner ``rank``'s rows of every sharded tensor of ``state``, by entry name (where they are: no copy)."""
    from pickaxe.runs.shards import iter_local_pieces
    from pickaxe.runs.state import split_state

    if rank < 1:
        raise ValueError(f"write_rank_shards is for the learners other than rank 0, got rank {rank}")
    return dict(iter_local_pieces(split_state(state).sharded, rank))


def _write_pieces(folder: Path, pieces: dict[str, torch.Tensor], rank: int) -> dict[str, dict[str, Any]]:
    """``pieces`` as ``folder/shards-rank-<rank>.safetensors``; its manifest entry (empty for no pieces)."""
    from pickaxe.runs.shards import shard_file
    from pickaxe.runs.tensorfile import write_tensors

    if not pieces:
        return {}
    fname = shard_file(rank)
    return {fname: write_tensors(Path(folder) / fname, pieces)}


def _receipt(folder: Path, rank: int) -> Path:
    return Path(folder) / f".receipt-rank-{rank}.json"


def start_rank_shards(folder: Path, state: Any, rank: int) -> threading.Thread:
    """:func:`write_rank_shards` in the background, for rank 0's :meth:`CheckpointManager.save_async`: copies this
    rank's rows to host memory now (so training may go on changing them), then a started thread writes them and
    leaves a receipt in ``folder`` (the manifest entries, or the error in one line) for :func:`wait_rank_shards`."""
    from pickaxe.runs.snapshot import host_copy

    pieces = host_copy(_rank_pieces(state, rank))

    def write() -> None:
        try:
            got: dict[str, Any] = {"entries": _write_pieces(folder, pieces, rank)}
        except Exception as e:
            got = {"error": error_line(e)}
        pieces.clear()
        part = _receipt(folder, rank).with_suffix(".part")
        try:
            _write_bytes(part, json.dumps(got).encode())
            os.replace(part, _receipt(folder, rank))
        except OSError:  # the folder is gone (rank 0 gave up on this save): nothing to report to
            pass

    thread = threading.Thread(target=write, name=f"checkpoint-shards-{rank}", daemon=True)
    thread.start()
    return thread


def wait_rank_shards(
    folder: Path, ranks: range, alive: Callable[[], bool], poll_s: float = 0.05
) -> dict[str, dict[str, Any]]:
    """On rank 0's writing thread: wait for the receipt of every rank in ``ranks`` (:func:`start_rank_shards`),
    remove them, and return their manifest entries. Raises :class:`CheckpointError` naming a rank whose write failed,
    or once ``alive()`` says a learner is gone."""
    entries: dict[str, dict[str, Any]] = {}
    for rank in ranks:
        path = _receipt(folder, rank)
        while not path.exists():
            if not alive():
                raise CheckpointError(f"checkpoint {folder}: learner {rank} ended before writing its shards")
            time.sleep(poll_s)
        got = json.loads(path.read_text())
        path.unlink()
        if "error" in got:
            raise CheckpointError(f"learner {rank} could not write its checkpoint shards: {got['error']}")
        entries.update(got["entries"])
    return entries


def _shard_entries(folder: Path, entries: Any, needed: list[str]) -> dict[str, dict[str, Any]]:
    """The shard writer's manifest entries, checked: well-formed, naming files it wrote, every needed one there."""
    if not isinstance(entries, dict) or not all(isinstance(k, str) and is_entry(v) for k, v in entries.items()):
        raise CheckpointError(f"checkpoint {folder}: the shard writer returned {entries!r}, not manifest entries")
    for fname in entries:
        if fname in (TENSORS, META, MANIFEST, LATEST) or not re.fullmatch(r"shards-rank-\d+\.safetensors", fname):
            raise CheckpointError(f"checkpoint {folder}: the shard writer returned an entry for {fname!r}")
        if not (folder / fname).is_file():
            raise CheckpointError(f"checkpoint {folder}: the shard writer returned {fname}, which it did not write")
    missing = [f for f in needed if f not in entries]
    if missing:
        raise CheckpointError(
            f"checkpoint {folder}: the shard writer returned no entry for {', '.join(missing)} (a learner did not "
            "write its shards)"
        )
    return entries


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether the run keeps a complete checkpoint to resume from (digests are not verified here)."""
    return bool(CheckpointManager(run_dir).list())


def no_checkpoint_error(run_dir: str | Path) -> PickaxeError:
    """The one line for resuming a run that stopped before its first checkpoint, with the command that restarts it."""
    return PickaxeError(
        f"{run_dir} has no checkpoint to resume from (it stopped before its first one); "
        f"`pickaxe resume {run_dir} --restart` starts it again from step 0"
    )
