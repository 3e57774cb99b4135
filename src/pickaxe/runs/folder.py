"""A run's folder before and around training: is it free to hold a new run, can it be written, moving an old run
aside, and turning a full or read-only disk into one line."""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import time
from pathlib import Path

from pickaxe.errors import PickaxeError
from pickaxe.runs.model import MODEL_DIGEST_FILE, MODEL_FILE

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


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run: one of its files (:data:`RUN_MARKERS`), or a config.json naming an algorithm
    (a run's config), not merely some other config.json (a model folder's)."""
    if any((folder / m).exists() for m in RUN_MARKERS if m != "config.json"):
        return True
    try:
        config = json.loads((folder / "config.json").read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and "algo_name" in config


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


def check_run_writable(path: Path) -> None:
    """Raise one ``PickaxeError`` line when files cannot be created in the existing run folder ``path`` (a
    read-only mount, permissions): what ``pickaxe resume`` checks before it builds anything."""
    try:
        fd, name = tempfile.mkstemp(prefix=".pickaxe-write-test-", dir=path)
    except OSError as e:
        raise PickaxeError(
            f"cannot write run folder {path} ({e.strerror or e}); make it writable and run the command again"
        ) from None
    os.close(fd)
    os.unlink(name)


def unique_path(base: Path) -> Path:
    """``base``, or ``base-1``, ``base-2``, ... whichever does not exist yet."""
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def move_aside(path: Path) -> Path:
    """Rename the run at ``path`` to ``<path>.old-<timestamp>`` (unique); returns the new path."""
    target = unique_path(path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    try:
        os.rename(path, target)
    except OSError as e:
        raise PickaxeError(
            f"cannot move the run in {path} aside to {target} ({e.strerror or e}); move or delete it yourself"
        ) from None
    return target


def make_dirs(path: Path) -> list[Path]:
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


def disk_error(
    e: BaseException,
    run_dir: str | Path,
    resumable: bool = True,
    target: str | Path | None = None,
    undone: str = "no run was created",
) -> PickaxeError | None:
    """A one-line ``PickaxeError`` for a full disk, a quota or a read-only / unwritable folder met while writing a
    run (None for any other error). safetensors reports these as ``SafetensorError("... (os error 28)")``.
    ``resumable``: the run exists and ``pickaxe resume`` continues it; else the command is to be run again, and
    ``undone`` says what was left unmade. The line names ``target`` (default: the file the error names, else
    ``run_dir``) and, for a read-only or unwritable folder, asks to make ``run_dir`` writable."""
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
    if target is None:
        target = filename if filename is not None else run_dir
    if not resumable:
        return PickaxeError(f"{what} writing {target}; {undone}: {fix} and run the command again")
    return PickaxeError(
        f"{what} writing {target}; what was written before is kept: {fix} and run `pickaxe resume {run_dir}`"
    )


def _os_error_code(e: BaseException | None) -> tuple[int | None, str | None]:
    """errno and file name of an ``OSError`` (or a safetensors I/O error) or of the error that caused it."""
    for _ in range(4):  # a short walk down the chain of causes
        if e is None:
            break
        if isinstance(e, OSError):
            name = e.filename
            if isinstance(name, bytes | os.PathLike):  # TensorBoard names its files as bytes: text, not b'...'
                name = os.fsdecode(name)
            return e.errno, None if name is None else str(name)
        match = re.search(r"\(os error (\d+)\)", str(e)) if type(e).__name__ == "SafetensorError" else None
        if match:
            return int(match.group(1)), None
        e = e.__cause__ if e.__cause__ is not None else None if e.__suppress_context__ else e.__context__
    return None, None
