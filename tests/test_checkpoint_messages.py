"""What a refused checkpoint's error says: the folder, the bad file, what is wrong with it and the fix, on one line.

Each damage is made on its own (one bad field at a time), so that a check joining two conditions with ``or``
is tested on each of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pickaxe.runs.checkpoint as ckpt
from pickaxe.runs.checkpoint import CheckpointError, CheckpointManager, load_checkpoint

FIX = "delete this checkpoint folder or load an older checkpoint"


def _state() -> dict[str, Any]:
    return {"w": torch.arange(6.0).reshape(2, 3), "n": 3, "a": np.arange(4)}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """One good checkpoint (step 5, metric 1.5)."""
    return CheckpointManager(tmp_path).save(5, _state(), metric=1.5, meta={"note": "x"})


def _message(folder: Path, **kwargs: Any) -> str:
    with pytest.raises(CheckpointError) as exc:
        ckpt.load_checkpoint(folder, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _expect(folder: Path, fname: str, problem: str) -> None:
    """Loading ``folder`` fails with exactly ``checkpoint FOLDER: FNAME PROBLEM; FIX`` (``problem`` a regex)."""
    msg = _message(folder)
    pattern = f"checkpoint {re.escape(str(folder))}: {re.escape(fname)} {problem}; {re.escape(FIX)}"
    assert re.fullmatch(pattern, msg), msg


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "MANIFEST.json").read_text())


def _write_manifest(folder: Path, manifest: Any) -> None:
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))


def _write_rehashed(folder: Path, name: str, data: bytes) -> None:
    """Replace ``name`` with ``data`` and record its true size and digest: only content checks can catch it."""
    (folder / name).write_bytes(data)
    m = _manifest(folder)
    m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(folder, m)


def _meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "meta.json").read_text())


# ------------------------------------------------------------------------------------------ the folder


def test_missing_folder_names_it_and_what_to_pass(tmp_path: Path) -> None:
    missing = tmp_path / "checkpoints" / "step-000000000009"
    msg = _message(missing)
    assert msg == (
        f"checkpoint {missing} does not exist or is not a folder; pass a checkpoint folder such as "
        "RUN_DIR/checkpoints/step-000000001000"
    )


def test_missing_manifest(saved: Path) -> None:
    (saved / "MANIFEST.json").unlink()
    _expect(saved, "MANIFEST.json", re.escape("is missing (the writer was interrupted or the file was deleted)"))


# ------------------------------------------------------------------------------------------ MANIFEST.json


@pytest.mark.parametrize(
    "manifest",
    [
        [1, 2],  # not an object
        {"format": "pickaxe-checkpoint"},  # right format, no files
        {"format": "pickaxe-checkpoint", "files": ["meta.json"]},  # right format, files not an object
        {"format": "other-tool", "files": {}},  # files, foreign format
        {"files": {}},  # no format
    ],
)
def test_foreign_or_malformed_manifest(saved: Path, manifest: Any) -> None:
    _write_manifest(saved, manifest)
    _expect(saved, "MANIFEST.json", "is not a pickaxe checkpoint manifest")


@pytest.mark.parametrize("required", ["tensors.safetensors", "meta.json"])
def test_manifest_must_list_tensors_and_meta(saved: Path, required: str) -> None:
    m = _manifest(saved)
    del m["files"][required]
    _write_manifest(saved, m)
    _expect(saved, "MANIFEST.json", f"does not list {re.escape(required)}")


@pytest.mark.parametrize("bad_name", ["", ".", "..", "MANIFEST.json", "sub/meta.json", "..\\meta.json"])
def test_manifest_listing_an_invalid_file_name(saved: Path, bad_name: str) -> None:
    m = _manifest(saved)
    m["files"][bad_name] = m["files"]["meta.json"]
    _write_manifest(saved, m)
    _expect(saved, "MANIFEST.json", f"lists an invalid file name {re.escape(repr(bad_name))}")


@pytest.mark.parametrize(
    "entry",
    [
        "12",  # not an object
        {"sha256": "0" * 64},  # no size
        {"size": "12", "sha256": "0" * 64},  # size as a string
        {"size": 12.0, "sha256": "0" * 64},  # size as a float
        {"size": True, "sha256": "0" * 64},  # a bool is not a size
        {"size": 12},  # no digest
    ],
)
def test_malformed_manifest_entry(saved: Path, entry: Any) -> None:
    m = _manifest(saved)
    m["files"]["meta.json"] = entry
    _write_manifest(saved, m)
    _expect(saved, "MANIFEST.json", "has a malformed entry for meta\\.json")


def test_file_listed_but_missing(saved: Path) -> None:
    m = _manifest(saved)
    m["files"]["extra.bin"] = {"size": 3, "sha256": "0" * 64}
    _write_manifest(saved, m)
    _expect(saved, "extra.bin", re.escape("is missing but listed in MANIFEST.json"))


def test_unexpected_file_is_named_first_in_sorted_order(saved: Path) -> None:
    (saved / "zz.bin").write_bytes(b"z")
    (saved / "aa.bin").write_bytes(b"a")
    _expect(saved, "aa.bin", re.escape("is not listed in MANIFEST.json (unexpected file; it is never loaded)"))


def test_truncated_file_gives_both_sizes(saved: Path) -> None:
    f = saved / "tensors.safetensors"
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[:-10])
    problem = f"has {size - 10} bytes but MANIFEST.json records {size} (truncated or overwritten)"
    _expect(saved, "tensors.safetensors", re.escape(problem))


def test_flipped_bit_is_a_digest_mismatch(saved: Path) -> None:
    f = saved / "meta.json"
    data = bytearray(f.read_bytes())
    data[3] ^= 0x01
    f.write_bytes(bytes(data))
    _expect(saved, "meta.json", re.escape("does not match its sha256 in MANIFEST.json (corrupted on disk)"))


def test_unreadable_listed_file(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(f: Any) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ckpt, "_sha256", fail)
    _expect(saved, "tensors.safetensors", re.escape("cannot be read ([Errno 13] Permission denied)"))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"{not json", "is not valid JSON \\(Expecting property name .*\\)"),
        (b"\x80{}", "is not valid JSON \\(.*codec can't decode.*\\)"),
        (b"[" * 100_000 + b"]" * 100_000, "nests JSON too deeply to read"),
    ],
)
def test_manifest_that_is_not_json(saved: Path, data: bytes, problem: str) -> None:
    (saved / "MANIFEST.json").write_bytes(data)
    _expect(saved, "MANIFEST.json", problem)


def test_manifest_that_cannot_be_read(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "MANIFEST.json":
            raise OSError(5, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    _expect(saved, "MANIFEST.json", re.escape("cannot be read ([Errno 5] Input/output error)"))


# ------------------------------------------------------------------------------------------ meta.json


def test_meta_that_is_not_json(saved: Path) -> None:
    _write_rehashed(saved, "meta.json", b'{"format": ')
    _expect(saved, "meta.json", "is not valid JSON \\(.*\\)")


@pytest.mark.parametrize(
    "change",
    [
        lambda m: [m],  # not an object
        lambda m: {**m, "format": "other-tool"},
        lambda m: {k: v for k, v in m.items() if k != "format"},
        lambda m: {k: v for k, v in m.items() if k != "skeleton"},
    ],
)
def test_foreign_meta(saved: Path, change: Any) -> None:
    _write_rehashed(saved, "meta.json", json.dumps(change(_meta(saved))).encode())
    _expect(saved, "meta.json", "is not pickaxe checkpoint metadata")


@pytest.mark.parametrize(
    "fields", [{"step": "5"}, {"step": 5.0}, {"step": True}, {"step": None}, {"meta": [1]}, {"meta": "note"}]
)
def test_malformed_step_or_meta_field(saved: Path, fields: dict[str, Any]) -> None:
    _write_rehashed(saved, "meta.json", json.dumps({**_meta(saved), **fields}).encode())
    _expect(saved, "meta.json", "has a malformed step or meta field")


def test_meta_without_user_metadata_loads_with_an_empty_dict(saved: Path) -> None:
    meta = _meta(saved)
    del meta["meta"]
    _write_rehashed(saved, "meta.json", json.dumps(meta).encode())
    _, info = load_checkpoint(saved)
    assert (info.step, info.metric, info.meta) == (5, 1.5, {})


@pytest.mark.parametrize("version", [3, 99, None, "1", 1.0])
def test_newer_or_malformed_format_version_says_upgrade(saved: Path, version: Any) -> None:
    _write_rehashed(saved, "meta.json", json.dumps({**_meta(saved), "format_version": version}).encode())
    assert _message(saved) == (
        f"checkpoint {saved}: meta.json has format version {version!r}, this pickaxe reads versions <= 2; "
        "upgrade pickaxe to load it"
    )


def test_older_format_version_still_loads(saved: Path) -> None:
    _write_rehashed(saved, "meta.json", json.dumps({**_meta(saved), "format_version": 0}).encode())
    assert load_checkpoint(saved)[1].step == 5


# ------------------------------------------------------------------------------------------ content


def test_tensors_that_are_not_safetensors(saved: Path) -> None:
    _write_rehashed(saved, "tensors.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    _expect(saved, "tensors.safetensors", "is not a valid safetensors file \\(.+\\)")


def test_skeleton_naming_a_missing_tensor(saved: Path) -> None:
    meta = _meta(saved)
    assert meta["skeleton"]["w"] == {"__tensor__": "t/0"}
    meta["skeleton"]["w"] = {"__tensor__": "t/999"}
    _write_rehashed(saved, "meta.json", json.dumps(meta).encode())
    _expect(saved, "meta.json", "does not match the tensors in tensors\\.safetensors \\(.*t/999.*\\)")


def test_refused_state_names_the_error_on_one_line(saved: Path) -> None:
    mgr = CheckpointManager(saved.parent.parent)

    def refuse(state: Any, info: Any) -> None:
        raise ValueError("size mismatch for w\nsecond line")

    with pytest.raises(CheckpointError) as exc:
        mgr.load(saved, accept=refuse)
    problem = "holds state this run cannot load (ValueError: size mismatch for w)"
    assert str(exc.value) == f"checkpoint {saved}: meta.json {problem}; {FIX}"

    def own_error(state: Any, info: Any) -> None:
        raise CheckpointError("already one line")

    with pytest.raises(CheckpointError, match=r"^already one line$"):
        mgr.load(saved, accept=own_error)


def test_problems_are_folded_onto_one_line() -> None:
    err = ckpt._bad(Path("/r/step-1"), "meta.json", "is bad\n  because\tof this")
    assert str(err) == f"checkpoint /r/step-1: meta.json is bad because of this; {FIX}"


# ------------------------------------------------------------------------------------------ what is written


def test_meta_and_manifest_record_what_was_saved(tmp_path: Path) -> None:
    before = time.time()
    path = CheckpointManager(tmp_path).save(7, _state(), metric=2, meta=None)
    meta = _meta(path)
    assert (meta["format"], meta["format_version"], meta["step"], meta["metric"], meta["meta"]) == (
        "pickaxe-checkpoint", 1, 7, 2.0, {}
    )  # fmt: skip
    assert before <= meta["created"] <= time.time()
    assert "skeleton" in meta
    manifest = _manifest(path)
    assert (manifest["format"], manifest["format_version"]) == ("pickaxe-checkpoint", 1)
    assert sorted(manifest["files"]) == ["meta.json", "tensors.safetensors"]


def test_step_bounds(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    assert mgr.save(10**12 - 1, _state()).name == "step-999999999999"
    assert mgr.save(0, _state()).name == "step-000000000000"
    with pytest.raises(ValueError, match=re.escape("step must be in [0, 10**12), got 1000000000000")):
        mgr.save(10**12, _state())


@pytest.mark.parametrize(("keep_last", "keep_best"), [(-1, 1), (3, -1)])
def test_negative_retention_is_refused_with_both_values(tmp_path: Path, keep_last: int, keep_best: int) -> None:
    with pytest.raises(ValueError, match=f"^keep_last and keep_best must be >= 0, got {keep_last} and {keep_best}$"):
        CheckpointManager(tmp_path, keep_last=keep_last, keep_best=keep_best)


def test_keep_last_zero_keeps_only_the_best_and_latest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=0, keep_best=1)
    for step, metric in [(1, 3.0), (2, 9.0), (3, 1.0), (4, 2.0)]:
        mgr.save(step, _state(), metric=metric)
    assert [i.step for i in mgr.list()] == [2, 4]


def test_best_ties_keep_the_newest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=1, mode="min")
    for step, metric in [(1, 1.0), (2, 1.0), (3, 5.0)]:
        mgr.save(step, _state(), metric=metric)
    assert [i.step for i in mgr.list()] == [2, 3]


def test_list_reports_damaged_meta_without_metric(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    a = mgr.save(1, _state(), metric=4.0, meta={"k": 1})
    b = mgr.save(2, _state(), metric=5.0)
    c = mgr.save(3, _state(), metric=6.0)
    (a / "meta.json").write_text("{broken")
    (b / "meta.json").write_text(json.dumps({"metric": "high", "meta": ["not", "a", "dict"]}))
    (c / "meta.json").write_text("[1]")
    (mgr.dir / "step-12").mkdir()  # not a checkpoint name
    (mgr.dir / "step-000000000009").write_text("a file, not a folder")
    assert [(i.step, i.metric, i.meta) for i in mgr.list()] == [(1, None, {}), (2, None, {}), (3, None, {})]


def test_verify_and_load_accept_a_folder_name_inside_checkpoints(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(4, _state())
    mgr.verify("step-000000000004")
    assert mgr.load("step-000000000004")[1].path == path
    (path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {path}: MANIFEST.json is missing")):
        mgr.verify("step-000000000004")


def test_load_checkpoint_of_a_renamed_checkpoint_folder(saved: Path, tmp_path: Path) -> None:
    copy = tmp_path / "my-checkpoint"
    copy.mkdir()
    for f in saved.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    state, info = load_checkpoint(copy)
    assert info.path == copy and info.step == 5 and state["n"] == 3


# ------------------------------------------------------------------------------------------ the fallback walk


def _damage(folder: Path) -> None:
    (folder / "MANIFEST.json").unlink()


def test_walk_order_is_latest_then_older_newest_first_then_newer(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=10)
    for step in (1, 2, 3, 4, 5, 6):
        mgr.save(step, _state())
    mgr.save(3, _state())  # resumed from step 2: latest points at 3, with 4..6 newer
    for step in (3, 2):
        _damage(mgr.dir / f"step-{step:012d}")
    reports: list[str] = []
    assert mgr.load(on_skip=reports.append)[1].step == 1
    assert [r.split()[3] for r in reports] == ["step-000000000003", "step-000000000002"]
    _damage(mgr.dir / "step-000000000001")
    reports.clear()
    assert mgr.load(on_skip=reports.append)[1].step == 6  # then the newer ones, newest first
    for step in (6, 5):
        _damage(mgr.dir / f"step-{step:012d}")
    reports.clear()
    assert mgr.latest(on_skip=reports.append).step == 4
    assert [r.split()[3] for r in reports] == [f"step-{s:012d}" for s in (3, 2, 1, 6, 5)]
    (mgr.dir / "latest").unlink()  # no pointer: newest first
    reports.clear()
    assert mgr.load(on_skip=reports.append)[1].step == 4
    assert [r.split()[3] for r in reports] == [f"step-{s:012d}" for s in (6, 5)]


def test_walk_tries_each_checkpoint_once(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=10)
    for step in (1, 2, 3, 4):
        mgr.save(step, _state())
    mgr.save(2, _state())  # latest points at 2, with 3 and 4 newer
    for step in (1, 2, 3, 4):
        _damage(mgr.dir / f"step-{step:012d}")
    reports: list[str] = []
    with pytest.raises(CheckpointError) as exc:
        mgr.load(on_skip=reports.append)
    tried = ", ".join(f"step-{s:012d}" for s in (2, 1, 4, 3))
    assert str(exc.value) == (
        f"no good checkpoint in {mgr.dir} (tried newest to oldest: {tried}; each reason is reported above); "
        "restore the folder from a backup or start training from scratch"
    )
    assert len(reports) == 4


def test_walk_skips_a_checkpoint_whose_state_is_refused(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {**_state(), "algo": "ppo"})
    mgr.save(2, {**_state(), "algo": "dqn"})

    def only_ppo(state: Any, info: Any) -> None:
        if state["algo"] != "ppo":
            raise ValueError(f"state of {state['algo']}")

    reports: list[str] = []
    state, info = mgr.load(accept=only_ppo, on_skip=reports.append)
    assert (info.step, state["algo"]) == (1, "ppo")
    assert len(reports) == 1 and "holds state this run cannot load (ValueError: state of dqn)" in reports[0]


def test_save_checkpoint_passes_metric_meta_and_retention(tmp_path: Path) -> None:
    for step, metric in [(1, 9.0), (2, 8.0), (3, 2.0), (4, 3.0), (5, 4.0)]:
        ckpt.save_checkpoint(tmp_path, step, _state(), metric=metric, meta={"s": step})
    infos = CheckpointManager(tmp_path).list()
    assert [(i.step, i.metric, i.meta) for i in infos] == [
        (1, 9.0, {"s": 1}), (3, 2.0, {"s": 3}), (4, 3.0, {"s": 4}), (5, 4.0, {"s": 5})
    ]  # fmt: skip  # defaults: the last 3 and the best 1 (not the second best, step 2)
    for step, metric in [(6, 0.5), (7, 8.0)]:
        ckpt.save_checkpoint(tmp_path / "min", step, _state(), metric=metric, keep_last=1, keep_best=1, mode="min")
    assert [i.step for i in CheckpointManager(tmp_path / "min").list()] == [6, 7]


def test_non_finite_metric_warning_and_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mgr = CheckpointManager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pickaxe.runs.checkpoint"):
        folder = mgr.save(7, _state(), metric=float("inf"))
    assert caplog.messages == ["checkpoint of step 7: metric inf is not finite; stored without one"]
    assert _meta(folder)["metric"] is None  # null in meta.json: never counts as best


def test_meta_with_nan_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(TypeError) as exc:
        mgr.save(1, _state(), meta={"score": float("nan")})
    # the json module's reason follows (its wording varies between Python versions)
    assert str(exc.value).startswith("checkpoint meta must be JSON-serialisable (no nan/inf, no objects): Out of range")
    assert not mgr.dir.exists()
