"""Exporting a model for the next stage of a pipeline (SFT -> reward model -> RL): a standard ``transformers`` folder
(``config.json``, ``model.safetensors``, the tokenizer files) that ``load_lm(DIR)`` and ``load_tokenizer(DIR)``, or
any ``transformers`` program, load by path, plus ``pickaxe_source.json``: where the weights came from, and the size
and sha256 of every other file of the folder (``files``; ``weights_sha256`` is the exported ``model.safetensors``'s).
A stage that loads an export checks it first with :func:`verify_export`.

An export is written into a temporary folder beside its destination and renamed into place when complete, so a
crash or a full disk never leaves a half-written export under the destination's name. LoRA adapters are merged
into the weights (the export is a plain model); a reward model is written in its own format
(``RewardModel.save``, loaded with ``RewardModel.load``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from pickaxe.digests import digest_problem, file_problem, folder_digests, is_entry
from pickaxe.errors import PickaxeError
from pickaxe.models.folders import REWARD_MODEL_FORMAT
from pickaxe.models.lm import no_progress_bars
from pickaxe.models.lora import is_lora, merge_lora
from pickaxe.models.reward import RewardModel

SOURCE_FILE = "pickaxe_source.json"
"""The provenance record of an export: the run, checkpoint and env step its weights came from."""

FORMAT_CAUSAL_LM = "transformers-causal-lm"
WEIGHTS_FILE = "model.safetensors"
"""The weights file of both formats; ``weights_sha256`` in ``pickaxe_source.json`` is its sha256."""


class ExportError(PickaxeError):
    """An export that cannot be written where it was asked to go."""


def export_model(
    model: nn.Module, tokenizer: Any, out_dir: str | Path, source: dict[str, Any] | None = None, overwrite: bool = False
) -> Path:
    """Write ``model`` and ``tokenizer`` to folder ``out_dir`` for a later stage to load by path; return the folder.

    A causal LM is saved with ``save_pretrained`` (safetensors); one with LoRA adapters is first merged into a
    copy (the model passed in keeps its adapters). A :class:`~pickaxe.models.reward.RewardModel` is saved with its
    own ``save``. ``tokenizer`` may be None (a reward model scored on ids only). ``source`` (JSON-able: run folder,
    recipe, step, config hash...) goes into ``pickaxe_source.json`` with the format, the export time and the size and
    sha256 of every other file written (``files``; ``weights_sha256``: the exported weights file's), which
    :func:`verify_export` checks before a later stage loads the folder.

    Written atomically: a temporary folder beside ``out_dir``, renamed into place when complete. An existing
    non-empty ``out_dir`` is refused unless ``overwrite``, and even then only when it holds a pickaxe export.
    """
    out = Path(out_dir)
    _check_destination(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        if isinstance(model, RewardModel):
            model.save(tmp)
            fmt = REWARD_MODEL_FORMAT
        else:
            if not hasattr(model, "save_pretrained"):
                raise ExportError(
                    f"cannot export a {type(model).__name__}: export_model takes a transformers causal LM (a "
                    "PreTrainedModel, with or without LoRA adapters) or a RewardModel"
                )
            with no_progress_bars():
                merge_lora(model).save_pretrained(str(tmp))
            fmt = FORMAT_CAUSAL_LM
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        source = dict(source or {})
        files = folder_digests(tmp, skip=(SOURCE_FILE,))
        record = {
            **source,
            "format": fmt,
            "lora_merged": is_lora(model) or bool(source.get("lora_merged")),  # or merged by the caller
            "tokenizer": tokenizer is not None,
            "exported_at": time.time(),
            "files": files,
            "weights_sha256": files[WEIGHTS_FILE]["sha256"],
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        _fsync_tree(tmp)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_export_source(path: str | Path) -> dict[str, Any] | None:
    """The ``pickaxe_source.json`` record of the export in folder ``path`` (where its weights came from), or None
    when ``path`` is not a pickaxe export (e.g. a model from elsewhere). A later stage records it as its origin."""
    file = Path(path) / SOURCE_FILE
    if not file.is_file():
        return None
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{file} is unreadable ({e}); export the run again") from None
    if not isinstance(record, dict):
        raise ExportError(f"{file} must hold a JSON object; export the run again")
    return record


def verify_export(
    path: str | Path, flag: str, digests: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """Check the export in folder ``path`` against the sizes and sha256 digests its ``pickaxe_source.json`` records
    (``files``) before a stage loads it (``flag``: the option that named it, e.g. ``--data.reward-model``, for the
    message); return the record. A missing, truncated, overwritten or corrupted file is an :class:`ExportError`
    whose one line names the file and the fix. A folder without ``pickaxe_source.json`` (a model from elsewhere) is
    not checked and gives None; an export from a pickaxe that recorded no digests loads with a warning. ``digests``:
    the folder's files already hashed (``pickaxe.digests.folder_digests``), so they are not hashed again."""
    folder = Path(path)
    record = read_export_source(folder)
    if record is None:
        return None
    files = record.get("files")
    source = SOURCE_FILE
    run = record.get("run_dir")
    fix = f"restore the folder, or export it again (pickaxe export {run})" if run else "restore or re-export it"
    if files is None:
        warnings.warn(
            f"{flag} {folder}: {source} records no file digests (an export from an older pickaxe); loading it "
            f"unverified; {fix} to have it checked",
            stacklevel=2,
        )
        return record
    if (
        not isinstance(files, dict)
        or WEIGHTS_FILE not in files
        or not all(is_entry(e) and _inside(n) for n, e in files.items())
    ):
        raise ExportError(f"{flag} {folder}: {source} has a malformed files record; {fix}")
    for name in sorted(files):
        if digests is None:
            problem = file_problem(folder / name, files[name], source)
        else:
            problem = digest_problem(digests.get(name), files[name], source)
        if problem is not None:
            raise ExportError(f"{flag} {folder}: {name} {problem}; {fix}")
    return record


def _inside(name: str) -> bool:
    """Whether ``name`` is a relative path that stays inside its folder."""
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def _check_destination(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"export destination {out} is a file; choose a folder path that does not exist")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / SOURCE_FILE).is_file():
        raise ExportError(
            f"{out} already holds files that are not a pickaxe export; choose another folder (it is never replaced)"
        )
    if not overwrite:
        raise ExportError(f"{out} already holds an export; replace it with overwrite (--overwrite) or choose another")


def _fsync_tree(folder: Path) -> None:
    """Flush every file of ``folder`` and the folder itself to disk before the rename makes them visible."""
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``; an existing ``out`` (empty, or an export being replaced) is moved
    aside first and removed after, so ``out`` is never a partial export."""
    old = None
    if out.is_dir():
        if any(out.iterdir()):
            old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
            out.rename(old)
        else:
            out.rmdir()
    try:
        tmp.rename(out)
    except BaseException:
        if old is not None and not out.exists():
            old.rename(out)  # put the previous export back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
