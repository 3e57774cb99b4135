"""Preference data for reward models and DPO: ``PreferencePair`` and ``load_preferences``.

Rows come from a ``.jsonl``/``.json``/``.parquet`` file or a ``datasets.Dataset``, in one of two shapes:

* a pair: ``{"prompt": ..., "chosen": ..., "rejected": ...}``;
* a ranking (``ranking_key`` set): ``{"prompt": ..., "<ranking_key>": [best, ..., worst]}``, which becomes every
  ordered pair of the list (``n (n - 1) / 2`` pairs, the better response as ``chosen``).

Every row is validated before anything is returned: a bad one raises ``DatasetError`` (one line naming the file,
the row, the field and the fix), so a dataset is loaded whole or not at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.digests import MANIFEST, file_problem, read_manifest, write_manifest
from pickaxe.envs.text.prompt_env import DatasetError, _text, read_rows

__all__ = [
    "HELDOUT_FRACTION",
    "PreferencePair",
    "load_preferences",
    "record_preference_digests",
    "save_preferences",
    "split_by_prompt",
    "verify_preference_digest",
]

HELDOUT_FRACTION = 0.1
"""Share of a preference file's prompts held out when no held-out file is given."""


@dataclass
class PreferencePair:
    """One preference: ``chosen`` is preferred to ``rejected`` as a response to ``prompt``.

    ``group`` numbers the distinct prompts in order of first appearance (pairs of one prompt, e.g. those of a
    ranking, share it: split train/held-out by group so no prompt lands in both); ``row`` is the source row;
    ``metadata`` holds the row's other fields.
    """

    prompt: str
    chosen: str
    rejected: str
    group: int = 0
    row: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


def load_preferences(
    source: str | Path | Any,
    prompt_key: str = "prompt",
    chosen_key: str = "chosen",
    rejected_key: str = "rejected",
    ranking_key: str | None = None,
) -> list[PreferencePair]:
    """Read and validate preference pairs from a ``.jsonl``/``.json``/``.parquet`` file or a ``datasets.Dataset``.

    Each row needs a non-empty string under ``prompt_key`` and either non-empty, different strings under
    ``chosen_key`` and ``rejected_key``, or (``ranking_key`` set) a list of at least two distinct non-empty
    strings, best first, under ``ranking_key``. Pairs come out in row order (a ranking's pairs in the order
    ``(0, 1), (0, 2), ..., (1, 2), ...``). Any bad row raises ``DatasetError`` with the file, where the row is (a
    JSONL file's line number, else the 0-based row), the field and what to fix; nothing is returned then.
    """
    name, rows = read_rows(source, "preference file")
    groups: dict[str, int] = {}
    pairs: list[PreferencePair] = []
    for i, (where, row) in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetError(f"{where} is a {type(row).__name__}, not an object with a {prompt_key!r} field")
        prompt = _field(row, prompt_key, where, "prompt_key")
        group = groups.setdefault(prompt, len(groups))
        if ranking_key is None:
            chosen = _field(row, chosen_key, where, "chosen_key")
            rejected = _field(row, rejected_key, where, "rejected_key")
            if chosen == rejected:
                raise DatasetError(
                    f"{where}: fields {chosen_key!r} and {rejected_key!r} are the same text; "
                    "a pair needs two different responses, remove or fix the row"
                )
            meta = {k: v for k, v in row.items() if k not in (prompt_key, chosen_key, rejected_key)}
            pairs.append(PreferencePair(prompt, chosen, rejected, group, i, meta))
            continue
        ranking = _ranking(row, ranking_key, where)
        meta = {k: v for k, v in row.items() if k not in (prompt_key, ranking_key)}
        for a in range(len(ranking)):
            for b in range(a + 1, len(ranking)):
                pairs.append(PreferencePair(prompt, ranking[a], ranking[b], group, i, dict(meta)))
    if not pairs:
        raise DatasetError(f"{name} holds no rows; a preference dataset needs at least one pair")
    return pairs


def split_by_prompt(
    pairs: list[PreferencePair], seed: int, source: str | Path = "the preference file"
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Training and held-out pairs: a seeded ``HELDOUT_FRACTION`` of the prompts (at least one, never all) and their
    pairs held out; one prompt alone cannot be split (``DatasetError`` naming ``source`` and the fix)."""
    groups = sorted({p.group for p in pairs})
    if len(groups) < 2:
        raise DatasetError(
            f"{source} has one prompt, so none can be held out: add prompts or set --preferences.heldout-path"
        )
    n = min(len(groups) - 1, max(1, round(HELDOUT_FRACTION * len(groups))))
    held = set(np.random.default_rng(seed).permutation(groups)[:n].tolist())
    return [p for p in pairs if p.group not in held], [p for p in pairs if p.group in held]


def save_preferences(pairs: Sequence[PreferencePair], path: str | Path) -> Path:
    """Write ``pairs`` as JSONL rows ``{prompt, chosen, rejected, **metadata}`` that :func:`load_preferences` reads
    back (same pairs, same order); written to a temporary file and renamed, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps({**p.metadata, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _field(row: dict[str, Any], key: str, where: str, option: str) -> str:
    """A required non-empty string field."""
    if key not in row or row[key] is None:
        raise DatasetError(f"{where} has no {key!r} field (fields: {sorted(row)}); add it or set {option}")
    value = _text(row[key], where, key)
    if not value.strip():
        raise DatasetError(f"{where}: field {key!r} is empty; fill it in or remove the row")
    return value


def _ranking(row: dict[str, Any], key: str, where: str) -> list[str]:
    """A ranking field: at least two distinct non-empty strings, best first."""
    if key not in row or row[key] is None:
        raise DatasetError(f"{where} has no {key!r} field (fields: {sorted(row)}); add it or set ranking_key")
    value = row[key]
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise DatasetError(
            f"{where}: field {key!r} must be a list of responses, best first, got {type(value).__name__}"
        )
    if len(value) < 2:
        raise DatasetError(f"{where}: field {key!r} ranks {len(value)} response(s); a ranking needs at least two")
    ranking = []
    for j, item in enumerate(value):
        text = _text(item, where, f"{key}[{j}]")
        if not text.strip():
            raise DatasetError(f"{where}: field '{key}[{j}]' is empty; fill it in or drop it from the ranking")
        if text in ranking:
            raise DatasetError(
                f"{where}: field '{key}[{j}]' repeats '{key}[{ranking.index(text)}]'; "
                "a ranking lists each response once, remove the duplicate"
            )
        ranking.append(text)
    return ranking


PREFERENCES_FORMAT = "pickaxe-preferences"
"""The format of the ``MANIFEST.json`` a run writes beside the preference files it generated."""


def record_preference_digests(folder: str | Path, names: Sequence[str]) -> None:
    """Record the size and sha256 of the preference files ``names`` a run wrote in ``folder`` in
    ``folder/MANIFEST.json`` (written last, atomically), so a later stage that trains on them can tell they are the
    ones written (:func:`verify_preference_digest`)."""
    write_manifest(Path(folder), list(names), PREFERENCES_FORMAT)


def verify_preference_digest(path: str | Path, flag: str) -> bool:
    """Check preference file ``path`` against the digest the run that wrote it recorded (``MANIFEST.json`` beside
    it): a changed file (a swapped label, a truncated write) is a ``DatasetError`` whose one line names the file
    and the fix. Returns whether a recorded digest was checked: a file nobody recorded (the user's own) is
    accepted as it is (``flag`` names the option that gave it, for the message)."""
    file = Path(path)
    try:
        files = read_manifest(file.parent, PREFERENCES_FORMAT)
    except ValueError as e:
        raise DatasetError(f"{flag}: {e}; restore it or delete it to use the files unverified") from None
    if files is None or file.name not in files:
        return False
    problem = file_problem(file, files[file.name], str(file.parent / MANIFEST))
    if problem is not None:
        raise DatasetError(
            f"{flag} {str(file)!r} {problem}: it changed after the run that generated it recorded it; restore it or "
            f"rerun that run (to train on an edited copy on purpose, save it outside {file.parent})"
        )
    return True
