"""What an LLM run reads from outside its folder, checked every time it starts (fresh or resumed) before any model
is loaded: exported models against the digests their ``pickaxe_source.json`` records, generated preference files
against the digests the run that wrote them recorded, and on a resume every input against ``RUN_DIR/inputs.json``,
the digests recorded when the run started."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pickaxe.digests import file_digest, folder_digests
from pickaxe.envs.text.preferences import verify_preference_digest
from pickaxe.errors import PickaxeError
from pickaxe.models.export import verify_export
from pickaxe.runs.run import Run
from pickaxe.train.llm_config import LLMTrainConfig

INPUTS_FILE = "inputs.json"
"""What an LLM run read from outside its folder, written when it starts: ``files`` (per input option, the size and
sha256 of each file it reads afresh at every start: the reward model's folder, the preference files) and
``sources`` (the ``pickaxe_source.json`` of every exported model it loaded: which run, checkpoint and step the
starting policy or the reward model came from)."""

_MODELS = ("model.path", "data.reward_model")
"""Options naming a model folder; an export among them is verified against its own digests."""
_PREFERENCES = ("preferences.path", "preferences.heldout_path")
_RECORDED = ("data.reward_model", *_PREFERENCES)
"""Options whose files are read afresh at every start, so a resume must find them unchanged."""


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def _value(cfg: LLMTrainConfig, key: str) -> str | None:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def input_files(path: Path) -> dict[str, dict[str, Any]]:
    """The digest of every file of input ``path`` (a folder's files by relative name, or the one file by name)."""
    return folder_digests(path) if path.is_dir() else {path.name: file_digest(path)}


def verify_inputs(
    cfg: LLMTrainConfig,
    digests: dict[str, dict[str, Any]] | None = None,
    options: tuple[str, ...] = (*_MODELS, *_PREFERENCES),
) -> dict[str, Any]:
    """Check what ``cfg`` reads before any of it is loaded: an export (``model.path``, ``data.reward_model``)
    against the size and sha256 of each of its files in its ``pickaxe_source.json``, a generated preference file
    against the digest its run recorded beside it. A missing, truncated or changed file is a one-line
    ``PickaxeError`` naming it. ``digests``: files already hashed, by option (:func:`input_files`), not hashed
    again; ``options``: the options to check (default all; evaluating a finished run reads no preference file).
    Returns the exports' ``pickaxe_source.json`` records by option."""
    digests = digests or {}
    sources = {}
    for key in (k for k in _MODELS if k in options):
        value = _value(cfg, key)
        if value and Path(value).is_dir():
            record = verify_export(value, _flag(key), digests.get(key))
            if record is not None:
                sources[key] = record
    for key in (k for k in _PREFERENCES if k in options):
        value = _value(cfg, key)
        if value and Path(value).is_file():
            verify_preference_digest(value, _flag(key))
    return sources


def check_inputs(cfg: LLMTrainConfig, run: Run | None, resuming: bool) -> None:
    """Verify the run's inputs (:func:`verify_inputs`) and record them in ``RUN_DIR/inputs.json``
    (:data:`INPUTS_FILE`): the digests of the files it reads afresh at every start (``data.reward_model``,
    ``preferences.path``/``heldout_path``) and where its exported input models came from. On a resume, refuse with
    one line when an input changed since the run started (the resumed run would not be the run that was stopped)."""
    paths = {k: v for k in _RECORDED if (v := _value(cfg, k)) and Path(v).exists()}
    now = {k: input_files(Path(v)) for k, v in paths.items()}
    file = run.path / INPUTS_FILE if run is not None else None
    if resuming and file is not None and file.is_file():
        _check_unchanged(json.loads(file.read_text()), now, paths, run)
        verify_inputs(cfg, now)
        return
    sources = verify_inputs(cfg, now)
    if file is None:
        return
    record = {"files": now, "sources": sources}
    tmp = file.with_name(f".{INPUTS_FILE}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, file)


def _check_unchanged(record: dict[str, Any], now: dict[str, Any], paths: dict[str, str], run: Any) -> None:
    """Refuse a resume whose inputs differ from those ``inputs.json`` recorded when the run started."""

    def changed(key: str, detail: str) -> PickaxeError:
        return PickaxeError(
            f"{paths.get(key)!r} ({_flag(key)}) changed since {run.path} started{detail}, so resuming would not "
            "continue the same run; restore the original or start a new run"
        )

    for key, before in (record.get("files") or {}).items():
        current = now.get(key, {})
        for name in sorted(set(before) | set(current)):
            if name not in current:
                raise changed(key, f" ({name} is gone)")
            if name not in before:
                raise changed(key, f" ({name} is new)")
            if current[name] != {"size": before[name].get("size"), "sha256": before[name].get("sha256")}:
                raise changed(key, f" ({name} differs from its size and sha256 in {INPUTS_FILE})")
    for key, digest in (record.get("digests") or {}).items():  # inputs.json of a run from an older pickaxe
        if key not in paths or _legacy_digest(Path(paths[key])) != digest:
            raise changed(key, "")


def _legacy_digest(path: Path) -> str:
    """The one sha256 over a file, or a folder's sorted file names and contents, that ``inputs.json`` recorded before
    it recorded each file's digest; kept only to resume such runs."""
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
