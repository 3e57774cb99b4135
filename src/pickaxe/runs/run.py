"""``Run``: one directory holding a run's config, manifest, metrics and model."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.runs.checkpoint import CheckpointError, CheckpointInfo, CheckpointManager
from pickaxe.runs.manifest import build_manifest, to_jsonable
from pickaxe.runs.status import write_status
from pickaxe.runs.tracking import TRACKERS, JsonlLogger, PrometheusSink, TensorBoardLogger, check_port, check_tracker

NONDETERMINISTIC_PREFIXES = ("time/", "sys/")
"""Metric name prefixes whose values depend on the machine and the moment (wall time, CPU, memory)."""

MODEL_FILE = "model.safetensors"
MODEL_DIGEST_FILE = "model.json"
"""Size and sha256 of ``model.safetensors``, written after it; ``load_model`` verifies them."""


def default_run_dir(name: str, root: str | Path = "runs") -> Path:
    """``runs/<name>-<timestamp>``, made unique if that folder exists."""
    base = Path(root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


RUN_MARKERS = (
    "config.json",
    "metrics.jsonl",
    "checkpoints",
    MODEL_FILE,
    MODEL_DIGEST_FILE,
    "manifest.json",
    "events.jsonl",
    "status.json",
)
"""Entries whose presence means a folder already holds a run (training into it would mix two runs)."""


class Run:
    """A run directory: ``config.json``, ``manifest.json``, ``metrics.jsonl``, ``events.jsonl``, TensorBoard
    events, ``checkpoints/``, ``status.json`` and the final ``model.safetensors`` (+ ``model.json``, its digest).

    Every log record carries ``step`` (env steps so far); wall-clock fields are namespaced ``time/``.
    A new ``Run`` refuses a folder that already holds a run unless ``overwrite=True``, which moves the old run
    aside to ``<folder>.old-<timestamp>`` (nothing is deleted). Every check (trackers, Prometheus port, the
    folder can be created and written) runs before anything is written; if creating the run fails midway, what
    it created is removed again. ``Run.open`` reattaches to an existing directory (for resuming) without
    rewriting its config.
    """

    def __init__(
        self,
        path: str | Path,
        config: Any = None,
        seed: int | None = None,
        tensorboard: bool = True,
        track: tuple[str, ...] = (),
        prometheus_port: int | None = None,
        overwrite: bool = False,
    ) -> None:
        for name in track:
            check_tracker(name)
        if prometheus_port is not None:
            check_port(prometheus_port)
        self.path = Path(path)
        had_run = check_new_run_dir(self.path, overwrite)
        self._tensorboard = tensorboard
        self._sinks: list[Any] = []
        self._extra_sinks: list[Any] = []
        self._moved_to: Path | None = None
        self._created: list[Path] | None = None  # None: nothing to undo
        self._preexisting: set[str] = set()
        try:
            if had_run:
                self._moved_to = _move_aside(self.path)
            self._preexisting = {p.name for p in self.path.iterdir()} if self.path.is_dir() else set()
            self._created = _make_dirs(self.path)
            config_json = to_jsonable(config)
            if config is not None:
                self._write_json("config.json", config_json)
            self._write_json("manifest.json", build_manifest(config, seed))
            self.event("started", echo=False, step=0, pid=os.getpid(), hostname=socket.gethostname())
            self._open_sinks(purge_step=None)
            self._extra_sinks = _extra_sinks(self.path, config_json, track, prometheus_port)
            if self._moved_to is not None:
                self.event(f"moved the run that was in {self.path} to {self._moved_to}", moved_to=str(self._moved_to))
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Undo the creation of this run: close it and remove what it wrote (the folder too if it made it), and put
        back a run that ``overwrite`` moved aside. For a run that failed before training started, never after."""
        self.close()
        created, moved_to = getattr(self, "_created", None), getattr(self, "_moved_to", None)
        if created:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in created[1:]:  # parents this run made, innermost first; kept if anyone else wrote there
                try:
                    parent.rmdir()
                except OSError:
                    break
        elif created is not None:
            for p in self.path.iterdir():
                if p.name not in self._preexisting:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink()
        if moved_to is not None and moved_to.is_dir() and not self.path.exists():
            with contextlib.suppress(OSError):
                os.replace(moved_to, self.path)
        self._created = None
        self._moved_to = None

    @classmethod
    def open(
        cls, path: str | Path, tensorboard: bool = True, track: tuple[str, ...] = (), prometheus_port: int | None = None
    ) -> Run:
        """Reattach to an existing run directory; call ``rewind(step)`` before logging."""
        run = cls.__new__(cls)
        run.path = Path(path)
        if not (run.path / "config.json").is_file():
            raise PickaxeError(f"{run.path} is not a run directory: config.json is missing")
        run._tensorboard = tensorboard
        run._sinks = []
        run._extra_sinks = _extra_sinks(run.path, None, track, prometheus_port) if track or prometheus_port else []
        return run

    def config(self) -> dict[str, Any]:
        """The run's ``config.json``."""
        path = self.path / "config.json"
        try:
            data = json.loads(path.read_bytes())
        except OSError as e:
            raise PickaxeError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise PickaxeError(
                f"{path} is not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}); "
                "restore it from a copy or delete the run"
            ) from None
        except ValueError as e:  # json.JSONDecodeError
            raise PickaxeError(f"{path} is not valid JSON ({e}); restore it from a copy or delete the run") from None
        if not isinstance(data, dict):
            raise PickaxeError(f"{path} must hold a JSON object, got {type(data).__name__}; restore it from a copy")
        return data

    def _open_sinks(self, purge_step: int | None) -> None:
        self._sinks = [JsonlLogger(self.path / "metrics.jsonl")]
        if self._tensorboard:
            self._sinks.append(TensorBoardLogger(self.path / "tensorboard", purge_step=purge_step))

    def rewind(self, step: int) -> None:
        """Drop every metric logged after ``step`` (and a torn last line), then reopen the sinks.

        A resumed run calls this with its checkpoint's step, so ``metrics.jsonl`` ends up with each
        step exactly once. The file is rewritten atomically.
        """
        self._close_sinks()
        path = self.path / "metrics.jsonl"
        kept: list[str] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a write torn by a kill
                if record.get("step", 0) <= step:
                    kept.append(line)
        tmp = path.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
        self._open_sinks(purge_step=step + 1)

    def event(self, message: str, echo: bool = True, **fields: Any) -> None:
        """Append a lifecycle event (started, resume, restart, rollback) to ``events.jsonl``; ``echo`` also prints
        it on stderr."""
        record = {"time": time.time(), "message": message, **fields}
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if echo:
            print(f"pickaxe: {message}", file=sys.stderr)

    def set_status(self, state: str, **fields: Any) -> None:
        """Record the run's state in ``status.json`` (see :mod:`pickaxe.runs.status`), e.g.
        ``run.set_status("running", step=1000, total_steps=50000)``; states: running, finished, interrupted,
        crashed, stopped."""
        write_status(self.path, state, **fields)

    def _write_json(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path / name)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Record ``metrics`` at env step ``step`` in every sink."""
        record = {"step": int(step), **metrics}
        for sink in (*self._sinks, *self._extra_sinks):
            sink.log(record)

    def save_model(self, networks: dict[str, nn.Module], step: int | None = None) -> Path:
        """Write the networks' weights to ``model.safetensors`` (keys ``<network>.<param>``), then its size and
        sha256 to ``model.json``; ``load_model`` verifies them. Both files are fsynced and renamed into place.

        Tensors that share memory (tied input/output embeddings) are written once per name, as copies:
        safetensors refuses shared tensors, and loading gives each name the same values again.
        """
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, net in networks.items():
            for key, t in net.state_dict().items():
                ptr = t.untyped_storage().data_ptr()
                t = t.detach().cpu().contiguous()
                tensors[f"{name}.{key}"] = t.clone() if ptr in seen else t
                seen.add(ptr)
        path = self.path / MODEL_FILE
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        digest = _file_digest(tmp, sync=True)
        # a kill between the two renames leaves a model without a digest (loaded with a warning), never a
        # model beside the digest of an older one (which would read as corrupted)
        (self.path / MODEL_DIGEST_FILE).unlink(missing_ok=True)
        tmp.replace(path)
        record = {"file": MODEL_FILE, **digest, "step": step, "time": time.time()}
        _write_json_synced(self.path / MODEL_DIGEST_FILE, record)
        return path

    def flush(self) -> None:
        """Push buffered metrics (TensorBoard events) to disk."""
        for sink in (*self._sinks, *self._extra_sinks):
            sink.flush()

    def _close_sinks(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def close(self) -> None:
        """Flush and close every sink."""
        self._close_sinks()
        for sink in self._extra_sinks:
            sink.close()
        self._extra_sinks = []

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(run_dir: str | Path, deterministic: bool = False) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (a line torn by a kill is skipped).

    ``deterministic=True`` drops the machine- and moment-dependent fields (``time/``, ``sys/``): what is
    left must be identical between two runs of the same config and seed.
    """
    records = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if deterministic:
            record = {k: v for k, v in record.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}
        records.append(record)
    return records


def _extra_sinks(path: Path, config: Any, track: tuple[str, ...], prometheus_port: int | None) -> list[Any]:
    """Optional sinks: W&B / MLflow trackers and a Prometheus endpoint."""
    sinks: list[Any] = []
    for name in track:
        check_tracker(name)
        sinks.append(TRACKERS[name](path, config))
    if prometheus_port is not None:
        sinks.append(PrometheusSink(prometheus_port, path.name))
    return sinks


class MissingModelError(PickaxeError, FileNotFoundError):
    """The run has no ``model.safetensors`` (it has not finished)."""


def load_model(
    run_dir: str | Path,
    networks: dict[str, nn.Module],
    device: str | torch.device = "cpu",
    checkpoint: str | int = "final",
) -> None:
    """Load a run's weights into ``networks`` (the names they were saved with), verified first.

    ``checkpoint``: ``"final"`` (``model.safetensors``, checked against the size and sha256 in ``model.json``;
    a model without ``model.json``, from an older pickaxe, loads with a warning), ``"latest"`` (the newest good
    checkpoint), ``"best"`` (the checkpoint with the highest recorded eval metric; ties: the newest) or an env
    step (the checkpoint of that step). Checkpoints are verified by their manifests. Problems raise a
    ``PickaxeError`` whose one line names the file and the fix.
    """
    run_dir = Path(run_dir)
    which = _checkpoint_choice(checkpoint)
    if which == "final":
        tensors = _load_final(run_dir, device)
        for name, net in networks.items():
            prefix = f"{name}."
            _load_into(
                net, {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, run_dir / MODEL_FILE
            )
        return
    state, info = _load_checkpoint_state(run_dir, which, device)
    algo = state.get("algo") if isinstance(state, dict) else None
    for name, net in networks.items():
        if not isinstance(algo, dict) or not isinstance(algo.get(name), dict):
            raise PickaxeError(f"checkpoint {info.path} holds no weights for network {name!r}; evaluate another")
        _load_into(net, algo[name], info.path)


def _checkpoint_choice(checkpoint: str | int) -> str | int:
    if isinstance(checkpoint, bool):
        raise PickaxeError(f"checkpoint must be final, latest, best or an env step, got {checkpoint!r}")
    if isinstance(checkpoint, int):
        return checkpoint
    text = str(checkpoint).strip()
    if text in ("final", "latest", "best"):
        return text
    digits = text.removeprefix("step-")
    if digits.isdigit():
        return int(digits)
    raise PickaxeError(f"--checkpoint must be final, latest, best or an env step (e.g. 10000), got {checkpoint!r}")


def _load_final(run_dir: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    path = run_dir / MODEL_FILE
    fix = f"`pickaxe eval {run_dir} --checkpoint latest` evaluates its newest checkpoint instead"
    if not path.is_file():
        raise MissingModelError(f"no model in {run_dir}: {path} is missing (did the run finish?); {fix}")
    recorded = _read_model_digest(run_dir)
    if recorded is None:
        warnings.warn(
            f"{path} has no recorded size and sha256 ({MODEL_DIGEST_FILE} is missing, e.g. a run from an older "
            "pickaxe); loading it unverified",
            stacklevel=3,
        )
    else:
        actual = _file_digest(path)
        if actual["size"] != recorded["size"]:
            raise PickaxeError(
                f"{path} has {actual['size']} bytes but {MODEL_DIGEST_FILE} records {recorded['size']} (truncated or "
                f"overwritten); restore it from a backup, or {fix}"
            )
        if actual["sha256"] != recorded["sha256"]:
            raise PickaxeError(
                f"{path} does not match its sha256 in {MODEL_DIGEST_FILE} (corrupted on disk); restore it from a "
                f"backup, or {fix}"
            )
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise PickaxeError(
            f"{path} is not a valid safetensors file ({e}); restore it from a backup, or {fix}"
        ) from None


def _read_model_digest(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / MODEL_DIGEST_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or type(record.get("size")) is not int or not isinstance(record.get("sha256"), str):
        raise PickaxeError(f"{path} is unreadable or malformed; delete it to load {MODEL_FILE} unverified")
    return record


def _load_checkpoint_state(run_dir: Path, which: str | int, device: str | torch.device) -> tuple[Any, CheckpointInfo]:
    manager = CheckpointManager(run_dir)
    infos = manager.list()
    if not infos:
        raise PickaxeError(f"{run_dir} has no checkpoints (no {manager.dir}); evaluate the final model instead")
    try:
        if which == "latest":
            with warnings.catch_warnings():  # damaged newer checkpoints are skipped with a warning: show it
                warnings.simplefilter("default")
                return manager.load(map_location=device)
        if which == "best":
            scored = [i for i in infos if i.metric is not None]
            if not scored:
                raise PickaxeError(
                    f"no checkpoint in {manager.dir} has a recorded eval metric, so none is best; "
                    "use --checkpoint latest or an env step"
                )
            best = max(scored, key=lambda i: (i.metric, i.step))
            return manager.load(best.path, map_location=device)
        match = [i for i in infos if i.step == which]
        if not match:
            steps = ", ".join(str(i.step) for i in infos)
            raise PickaxeError(f"{run_dir} has no checkpoint at env step {which}; kept checkpoints: {steps}")
        return manager.load(match[0].path, map_location=device)
    except CheckpointError as e:
        raise PickaxeError(str(e).replace("\n", " ")) from None


def _load_into(net: nn.Module, state: dict[str, Any], source: Path) -> None:
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise PickaxeError(
            f"the weights in {source} do not fit the networks of this run's config.json "
            f"({' '.join(ln.strip() for ln in first)[:300]}); was config.json edited?"
        ) from None


# --------------------------------------------------------------------------------------- run folder checks


def check_new_run_dir(path: Path, overwrite: bool = False) -> bool:
    """Check a new run can be made at ``path`` without writing anything; returns whether it holds a run to move.

    Raises ``PickaxeError`` when ``path`` holds a run (and not ``overwrite``), is or lies under a regular file,
    or when it (or the folder it would be created in) cannot be written.
    """
    try:
        if path.is_symlink() and not path.exists():
            raise PickaxeError(f"run folder {path} is a broken symbolic link; remove it or choose another run folder")
        if path.exists():
            if not path.is_dir():
                raise PickaxeError(f"run folder {path} is a file, not a folder; choose another run folder (--run-dir)")
            markers = [m for m in RUN_MARKERS if (path / m).exists()]
            if markers and not overwrite:
                raise PickaxeError(
                    f"{path} already holds a run ({markers[0]}); `pickaxe resume {path}` continues it, --overwrite "
                    "moves it aside and starts a new one, or choose another --run-dir"
                )
            _probe_writable(path, path)
            if markers:
                _probe_writable(path.resolve().parent, path)  # the old run is renamed within its parent
            return bool(markers)
        ancestor = path.absolute().parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise PickaxeError(
                f"cannot create run folder {path}: {ancestor} is a file, not a folder; choose another --run-dir"
            )
        _probe_writable(ancestor, path)
        return False
    except PickaxeError:
        raise
    except OSError as e:
        raise PickaxeError(f"cannot use run folder {path}: {e.strerror or e}; choose another --run-dir") from None


def _probe_writable(folder: Path, path: Path) -> None:
    """Create and remove a temporary file in ``folder``: catches read-only file systems and permissions, root
    included (``os.access`` says yes to root even on a read-only mount)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".pickaxe-write-test-", dir=folder)
    except OSError as e:
        where = f"{folder} is" if folder == path else f"{folder} (where {path} would be created) is"
        raise PickaxeError(
            f"cannot write run folder {path}: {where} not writable ({e.strerror or e}); "
            "choose another --run-dir or fix its permissions"
        ) from None
    os.close(fd)
    os.unlink(name)


def _move_aside(path: Path) -> Path:
    """Rename the run at ``path`` to ``<path>.old-<timestamp>`` (unique); returns the new path."""
    base = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    target, i = base, 1
    while target.exists():
        target, i = Path(f"{base}-{i}"), i + 1
    try:
        os.rename(path, target)
    except OSError as e:
        raise PickaxeError(
            f"cannot move the run in {path} aside to {target} ({e.strerror or e}); move or delete it yourself"
        ) from None
    return target


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path``; returns the folders it created, innermost (``path``) first."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return missing


def _file_digest(path: Path, sync: bool = False) -> dict[str, Any]:
    """Size and sha256 of a file (fsynced first with ``sync``)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def _write_json_synced(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def disk_error(e: BaseException, run_dir: str | Path, resumable: bool = True) -> PickaxeError | None:
    """A one-line ``PickaxeError`` for a full disk, a quota or a read-only / unwritable folder met while writing a
    run (None for any other error). safetensors reports these as ``SafetensorError("... (os error 28)")``.
    ``resumable``: the run exists and ``pickaxe resume`` continues it; else the command is to be run again."""
    fixes = {
        errno.ENOSPC: ("no space left on device", "free space"),
        errno.EDQUOT: ("disk quota exceeded", "free space"),
        errno.EROFS: ("read-only file system", f"make {run_dir} writable"),
        errno.EACCES: ("permission denied", f"make {run_dir} writable"),
        errno.EPERM: ("operation not permitted", f"make {run_dir} writable"),
    }
    if isinstance(e, PickaxeError):  # already a user-facing message
        return None
    code, filename = _os_error_code(e)
    if code not in fixes:
        return None
    what, fix = fixes[code]
    target = filename if filename is not None else run_dir
    if not resumable:
        return PickaxeError(f"{what} writing {target}; no run was created: {fix} and run the command again")
    return PickaxeError(
        f"{what} writing {target}; what was written before is kept: {fix} and run `pickaxe resume {run_dir}`"
    )


def _os_error_code(e: BaseException | None) -> tuple[int | None, str | None]:
    """errno and file name of an ``OSError`` (or a safetensors I/O error) or of the error that caused it."""
    for _ in range(4):  # a short walk down the chain of causes
        if e is None:
            break
        if isinstance(e, OSError):
            return e.errno, None if e.filename is None else str(e.filename)
        match = re.search(r"\(os error (\d+)\)", str(e)) if type(e).__name__ == "SafetensorError" else None
        if match:
            return int(match.group(1)), None
        e = e.__cause__ if e.__cause__ is not None else None if e.__suppress_context__ else e.__context__
    return None, None
