"""Pickle-free state flattening and atomic, checksummed checkpoints (pickaxe.runs.state / .checkpoint)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import random
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.runs.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    load_checkpoint,
    save_checkpoint,
)
from pickaxe.runs.state import flatten_state, unflatten_state

torch.set_num_threads(1)


def assert_same(a, b, path="state"):
    """Exact equality: same types, tensors/arrays bitwise with the same dtype, nan == nan, -0.0 != 0.0."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.cpu().contiguous().reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert type(k) is type(list(b)[list(a).index(k)]), f"{path} key {k!r}"
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def roundtrip(obj):
    tensors, skeleton = flatten_state(obj)
    skeleton = json.loads(json.dumps(skeleton, allow_nan=False))  # must survive strict JSON
    return unflatten_state(tensors, skeleton)


# ------------------------------------------------------------------------------------------ state.py
@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -7,
        2**64 + 1,
        -(2**200),
        10**30,
        1.5,
        -0.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        1e-310,
        "text ✓",
        "",
        b"",
        b"\x00\xffbytes",
        [],
        (),
        {},
        [1, (2, [3, (4,)])],
        {"a": {"b": [1, 2.0, None]}},
        {1: "one", -2: "minus two", "s": 3},
        {(1, "a"): 1, None: 2, 2.5: 3},
        {"__tensor__": "not a reference", "__dict__": [1]},
        {True: "bool key", 0: "int key"},
        OrderedDict([("b", 1), ("a", 2)]),
        np.float32(1.25),
        np.int64(-3),
        np.uint32(4_000_000_000),
        np.bool_(True),
        np.float64("nan"),
        np.arange(12, dtype=np.uint32).reshape(3, 4),
        np.zeros((0, 3), np.float16),
        np.array(3.5),
        np.arange(6, dtype=">i4")[::2],
        np.array([True, False]),
        np.frombuffer(b"abcd", np.uint8),
    ],
)
def test_roundtrip_values(value):
    assert_same(value, roundtrip(value))


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.uint32,
        torch.complex64,
        torch.complex128,
    ],
)
@pytest.mark.parametrize("shape", [(), (0,), (3, 5)])
def test_roundtrip_tensor_dtypes(dtype, shape):
    t = (torch.randn(shape, dtype=torch.float64) * 100).to(dtype)
    if dtype.is_floating_point and t.numel():
        t.view(-1)[0] = float("nan")
    assert_same(t, roundtrip(t))


def test_every_dtype_and_shape_through_a_checkpoint(tmp_path):
    dtypes = [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.bool,
        torch.uint8,
        torch.uint32,
    ]
    dtypes += [torch.complex128, torch.int8]
    state = {str(d): [(torch.randn(s, dtype=torch.float64) * 100).to(d) for s in [(), (0,), (2, 3)]] for d in dtypes}
    state["np"] = [np.arange(5, dtype=d) for d in (np.uint32, np.float16, np.int8, ">f8", np.complex64)]
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, state)
    assert_same(state, mgr.load()[0])


def test_tensors_sharing_storage_become_independent_copies(tmp_path):
    base, arr = torch.arange(12.0), np.arange(3.0)
    state = {
        "a": base,
        "view": base[2:5],
        "t": base.view(3, 4).t(),
        "again": base,
        "param": nn.Parameter(base),
        "empty": base[0:0],
        "np": arr,
        "np_as_torch": torch.from_numpy(arr),
    }
    tensors, skeleton = flatten_state(state)
    ptrs = [t.untyped_storage().data_ptr() for t in tensors.values() if t.untyped_storage().nbytes()]
    assert len(set(ptrs)) == len(ptrs)
    out = unflatten_state(tensors, skeleton)
    for k, v in state.items():
        assert_same(v if k == "np" else v.detach(), out[k], k)
    out["a"].add_(1)
    assert torch.equal(out["view"], torch.tensor([2.0, 3.0, 4.0]))
    mgr = CheckpointManager(tmp_path)  # safetensors itself rejects shared tensors
    mgr.save(1, state)
    assert_same({k: v if k == "np" else v.detach() for k, v in state.items()}, mgr.load()[0])


def test_rng_states_roundtrip_and_reproduce():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    gen = np.random.default_rng(4)
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generator": gen.bit_generator.state,
        "torch": torch.get_rng_state(),
    }
    out = roundtrip(state)
    assert_same(state, out)
    expected = (random.random(), np.random.rand(3), gen.random(3), torch.rand(3))
    random.setstate(out["python"])
    np.random.set_state(out["numpy"])
    gen2 = np.random.default_rng()
    gen2.bit_generator.state = out["generator"]
    torch.set_rng_state(out["torch"])
    got = (random.random(), np.random.rand(3), gen2.random(3), torch.rand(3))
    assert expected[0] == got[0]
    assert np.array_equal(expected[1], got[1]) and np.array_equal(expected[2], got[2])
    assert torch.equal(expected[3], got[3])


def _model_and_adam():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).pow(2).mean().backward()
    opt.step()
    return model, opt


def test_module_and_adam_state_dicts_roundtrip_and_load():
    model, opt = _model_and_adam()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    out = roundtrip(state)
    assert_same(state, out)
    model2, opt2 = _model_and_adam()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1.0)
    model2.load_state_dict(out["model"])
    opt2.load_state_dict(out["optim"])
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())


@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({"algo": {"foo": object()}}, "state['algo']['foo']: cannot store object of type object"),
        ({"x": [1, (2, {3})]}, "state['x'][1][1]: cannot store object of type set"),
        ({"k": {object(): 1}}, "state['k'] key <object"),
        ({"a": np.array([object()], dtype=object)}, "state['a']: cannot store numpy array of dtype object"),
        ({"s": [torch.eye(2).to_sparse()]}, "state['s'][0]: cannot store a torch.sparse_coo"),
    ],
)
def test_unsupported_types_raise_typeerror_naming_the_path(state, where):
    with pytest.raises(TypeError, match=re.escape(where)):
        flatten_state(state)


def test_unsupported_custom_class_is_named():
    class Foo:
        pass

    with pytest.raises(TypeError, match=r"state\['algo'\]\['foo'\]: cannot store object of type Foo"):
        flatten_state({"algo": {"foo": Foo()}})


# ------------------------------------------------------------------------------------------ checkpoint.py
def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=g), "step": seed, "np": np.arange(seed + 1), "t": (seed, "x")}


def test_save_load_roundtrip_and_layout(tmp_path):
    mgr = CheckpointManager(tmp_path)
    assert mgr.list() == [] and mgr.latest() is None
    state = {**_state(1), "rng": torch.get_rng_state(), "big": 2**100}
    path = mgr.save(7, state, metric=1.5, meta={"note": "hi"})
    assert path == tmp_path / "checkpoints" / "step-000000000007"
    assert sorted(p.name for p in path.iterdir()) == ["MANIFEST.json", "meta.json", "tensors.safetensors"]
    manifest = json.loads((path / "MANIFEST.json").read_text())
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000000000007"
    out, info = mgr.load()
    assert_same(state, out)
    assert (info.path, info.step, info.metric, info.meta) == (path, 7, 1.5, {"note": "hi"})
    assert mgr.latest() == info
    assert_same(state, mgr.load(path, map_location=torch.device("cpu"))[0])
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_latest_pointer_and_resave_same_step(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=10)
    for step in (1, 2, 3):
        mgr.save(step, _state(step))
    mgr.save(2, _state(20))  # e.g. resumed from step 1: step 2 is replaced and becomes latest
    assert [i.step for i in mgr.list()] == [1, 2, 3]
    assert (mgr.dir / "latest").read_text().strip() == "step-000000000002"
    out, info = mgr.load()
    assert info.step == 2 and out["step"] == 20
    assert mgr.latest().step == 2


def test_helpers(tmp_path):
    path = save_checkpoint(tmp_path, 3, _state(3), metric=2.0)
    assert_same(_state(3), load_checkpoint(tmp_path)[0])
    state, info = load_checkpoint(path)
    assert_same(_state(3), state) and info.metric == 2.0
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_checkpoint(tmp_path / "empty")


def test_retention_keeps_last_k_and_best_k(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2, keep_best=2, mode="max")
    metrics = {1: 5.0, 2: 9.0, 3: None, 4: 1.0, 5: 7.0, 6: 2.0, 7: None}
    for step, metric in metrics.items():
        mgr.save(step, _state(step), metric=metric)
    assert [i.step for i in mgr.list()] == [2, 5, 6, 7]  # best: 2 (9.0), 5 (7.0); last: 6, 7
    mgr_min = CheckpointManager(tmp_path / "min", keep_last=1, keep_best=1, mode="min")
    for step, metric in metrics.items():
        mgr_min.save(step, _state(step), metric=metric)
    assert [i.step for i in mgr_min.list()] == [4, 7]
    assert [i.metric for i in mgr_min.list()] == [1.0, None]
    with pytest.raises(ValueError, match="mode"):
        CheckpointManager(tmp_path, mode="best")


def test_retention_never_deletes_latest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=0)
    for step in (5, 6):
        mgr.save(step, _state(step))
    mgr.save(1, _state(1))  # older step saved last: it is what latest points to
    assert [i.step for i in mgr.list()] == [1, 6]
    assert mgr.load()[1].step == 1


def _truncate(p: Path):
    f = p / "tensors.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    return "tensors.safetensors"


def _flip(p: Path):
    f = p / "tensors.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0x01
    f.write_bytes(bytes(data))
    return "tensors.safetensors"


def _no_manifest(p: Path):
    (p / "MANIFEST.json").unlink()
    return "MANIFEST.json"


def _missing_file(p: Path):
    m = json.loads((p / "MANIFEST.json").read_text())
    m["files"]["extra.bin"] = {"size": 3, "sha256": "0" * 64}
    (p / "MANIFEST.json").write_text(json.dumps(m))
    return "extra.bin"


def _garbage_meta(p: Path):
    (p / "meta.json").write_bytes(b"{not json")
    return "meta.json"


def _garbage_meta_matching_manifest(p: Path):
    _garbage_meta(p)
    _rehash(p, "meta.json")
    return "meta.json"


def _garbage_manifest(p: Path):
    (p / "MANIFEST.json").write_text("[[[")
    return "MANIFEST.json"


def _path_in_manifest(p: Path):
    m = json.loads((p / "MANIFEST.json").read_text())
    m["files"]["../meta.json"] = m["files"]["meta.json"]  # never read a file outside the checkpoint folder
    (p / "MANIFEST.json").write_text(json.dumps(m))
    return "invalid file name '../meta.json'"


def _malformed_entry(p: Path):
    m = json.loads((p / "MANIFEST.json").read_text())
    m["files"]["meta.json"]["size"] = "12"
    (p / "MANIFEST.json").write_text(json.dumps(m))
    return "malformed entry for meta.json"


def _foreign_manifest(p: Path):
    m = json.loads((p / "MANIFEST.json").read_text())
    m["format"] = "other-tool"
    (p / "MANIFEST.json").write_text(json.dumps(m))
    return "not a pickaxe checkpoint manifest"


def _rehash(p: Path, name: str) -> None:
    m = json.loads((p / "MANIFEST.json").read_text())
    data = (p / name).read_bytes()
    m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (p / "MANIFEST.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    "corrupt",
    [
        _truncate,
        _flip,
        _no_manifest,
        _missing_file,
        _garbage_meta,
        _garbage_meta_matching_manifest,
        _garbage_manifest,
        _path_in_manifest,
        _malformed_entry,
        _foreign_manifest,
    ],
)
def test_corruption_is_detected_and_load_falls_back(tmp_path, corrupt, caplog):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(1))
    bad = mgr.save(2, _state(2))
    fname = corrupt(bad)
    with pytest.raises(CheckpointError, match=fname):
        mgr.verify(bad)
    with pytest.raises(CheckpointError, match=fname):
        mgr.load(bad)
    with (
        caplog.at_level(logging.WARNING),
        pytest.warns(CheckpointWarning, match=f"skipping damaged checkpoint step-000000000002.*{fname}") as warned,
    ):
        out, info = mgr.load()
    assert info.step == 1
    assert_same(_state(1), out)
    assert len(warned) == 1 and caplog.text == ""  # reported once, not once as a warning and again as a log line
    reports: list[str] = []
    assert mgr.load(on_skip=reports.append)[1].step == 1  # or to a handler (the Trainer's events.jsonl)
    assert len(reports) == 1 and fname in reports[0] and "\n" not in reports[0]
    with pytest.warns(CheckpointWarning):
        assert mgr.latest().step == 1


def test_all_bad_raises_listing_what_was_tried(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _flip(mgr.save(1, _state(1)))
    _no_manifest(mgr.save(2, _state(2)))
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError) as exc:
        mgr.load()
    msg = str(exc.value)
    assert "no good checkpoint" in msg and "step-000000000001" in msg and "step-000000000002" in msg
    assert "\n" not in msg and isinstance(exc.value, PickaxeError)  # the CLI prints it as one line, exit 2
    with pytest.warns(CheckpointWarning):
        assert mgr.latest() is None


def test_half_written_tmp_folder_is_ignored_and_cleaned(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(1))
    tmp = mgr.dir / ".tmp-step-000000000002-deadbeef"
    tmp.mkdir()
    (tmp / "tensors.safetensors").write_bytes(b"\x08\x00half")
    (mgr.dir / ".tmp-latest-cafe").write_text("step-000000000002")
    assert [i.step for i in mgr.list()] == [1]
    assert mgr.load()[1].step == 1
    mgr.save(3, _state(3))
    assert not [p for p in mgr.dir.iterdir() if p.name.startswith(".tmp-")]
    assert mgr.load()[1].step == 3


def test_stale_or_garbage_latest_pointer(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(1))
    mgr.save(2, _state(2))
    (mgr.dir / "latest").write_text("../../etc/passwd")
    assert mgr.load()[1].step == 2
    (mgr.dir / "latest").write_text("step-000000000099")
    assert mgr.load()[1].step == 2


def test_invalid_save_arguments_write_nothing(tmp_path):
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(TypeError, match=r"state\['bad'\]"):
        mgr.save(1, {"bad": object()})
    with pytest.raises(TypeError, match="meta"):
        mgr.save(1, _state(), meta={"x": object()})
    with pytest.raises(ValueError, match="step"):
        mgr.save(-1, _state())
    assert mgr.list() == [] and not mgr.dir.exists()


def test_non_finite_metric_is_stored_as_none(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=1)
    mgr.save(1, _state(1), metric=1.0)
    with caplog.at_level(logging.WARNING):
        mgr.save(2, _state(2), metric=float("nan"))
    assert "not finite" in caplog.text
    assert [(i.step, i.metric) for i in mgr.list()] == [(1, 1.0), (2, None)]


def test_state_without_tensors_and_conjugate_views(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"only": ["python", 1, None]})
    assert mgr.load()[0] == {"only": ["python", 1, None]}
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert_same(z.conj().resolve_conj(), roundtrip(z.conj()))
    assert_same(-z, roundtrip(z._neg_view()))


def test_verify_without_hashlib_file_digest(tmp_path, monkeypatch):
    """Python 3.10 has no hashlib.file_digest: the chunked fallback must agree with it."""
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(1, _state(1))
    monkeypatch.delattr(hashlib, "file_digest", raising=False)
    mgr.verify(path)
    _flip(path)
    with pytest.raises(CheckpointError, match="sha256"):
        mgr.verify(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unusable_map_location_is_not_mistaken_for_damage(tmp_path, recwarn):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(1))
    with pytest.raises((RuntimeError, AssertionError)):
        mgr.load(map_location="cuda")
    assert not [w for w in recwarn if issubclass(w.category, CheckpointWarning)]


# ------------------------------------------------------------------------------------------ security
class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_pickle_payload_is_live(tmp_path):
    """Sanity check for the tests below: unpickling the payload really creates the marker."""
    pickle.loads(pickle.dumps(_Evil(tmp_path / "live")))
    assert (tmp_path / "live").exists()


def test_planted_pickle_files_are_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    mgr = CheckpointManager(tmp_path / "run")
    mgr.save(1, _state(1))
    bad = mgr.save(2, _state(2))
    (bad / "evil.pkl").write_bytes(pickle.dumps(_Evil(marker)))
    torch.save({"x": _Evil(marker)}, bad / "state.pt")
    with pytest.raises(CheckpointError, match=r"evil\.pkl is not listed in MANIFEST\.json"):
        mgr.load(bad)
    with pytest.warns(CheckpointWarning, match="evil.pkl"):
        assert mgr.load()[1].step == 1
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_pickle_in_place_of_tensors_with_matching_digest_is_rejected(tmp_path, kind):
    marker = tmp_path / "pwned"
    mgr = CheckpointManager(tmp_path / "run")
    mgr.save(1, _state(1))
    bad = mgr.save(2, _state(2))
    target = bad / "tensors.safetensors"
    if kind == "pickle":
        target.write_bytes(pickle.dumps({"t/0": _Evil(marker)}))
    else:
        torch.save({"t/0": _Evil(marker)}, target)
    _rehash(bad, "tensors.safetensors")
    mgr.verify(bad)  # digests match: only the format check can catch it
    with pytest.raises(CheckpointError, match=r"tensors\.safetensors is not a valid safetensors file"):
        mgr.load(bad)
    with pytest.warns(CheckpointWarning, match="tensors.safetensors"):
        assert mgr.load()[1].step == 1
    (bad / "meta.json").write_bytes(pickle.dumps(_Evil(marker)))
    _rehash(bad, "meta.json")
    with pytest.raises(CheckpointError, match=r"meta\.json is not valid JSON"):
        mgr.load(bad)
    assert not marker.exists()


def test_crafted_skeleton_cannot_build_object_arrays(tmp_path):
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(1, {"a": np.arange(8, dtype=np.int64)})
    meta = json.loads((path / "meta.json").read_text())
    meta["skeleton"]["a"]["dtype"] = "O"
    (path / "meta.json").write_text(json.dumps(meta))
    _rehash(path, "meta.json")
    with pytest.raises(CheckpointError, match=r"meta\.json does not match.*invalid numpy dtype 'O'"):
        mgr.load(path)


# ------------------------------------------------------------------------------------------ tensorfile.py
def _dtype_zoo() -> dict[str, torch.Tensor]:
    """Every dtype pickaxe saves, 0-d, empty, odd sizes and strided views."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g, dtype=torch.float64) * 100
    out = {}
    for d in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8):
        out[f"{d}/2d"] = base.to(d)
        out[f"{d}/0d"] = base[1, 2].to(d)
        out[f"{d}/empty"] = base[:0].to(d)
        out[f"{d}/odd"] = base.reshape(-1)[:7].to(d)
        out[f"{d}/transposed"] = base.to(d).t()  # a non-contiguous view
        out[f"{d}/strided"] = base.to(d)[::2, 1::2]
    out["float64"] = base
    out["int32"] = base.to(torch.int32)
    out["int8"] = base.to(torch.int8)
    return out


@pytest.mark.parametrize("chunk", [None, 8])  # 8 bytes: every tensor in many chunks
def test_streamed_file_loads_as_safetensors_own(tmp_path, monkeypatch, chunk):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from pickaxe.digests import file_digest
    from pickaxe.runs import tensorfile

    if chunk is not None:
        monkeypatch.setattr(tensorfile, "CHUNK_BYTES", chunk)
    tensors = _dtype_zoo()
    entry = tensorfile.write_tensors(tmp_path / "ours.safetensors", tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "theirs.safetensors")
    assert entry == file_digest(tmp_path / "ours.safetensors")  # hashed while written, never read back
    ours, theirs = load_file(tmp_path / "ours.safetensors"), load_file(tmp_path / "theirs.safetensors")
    assert list(ours) != [] and sorted(ours) == sorted(theirs) == sorted(tensors)
    for name, want in tensors.items():
        assert_same(want.contiguous(), ours[name], name)
        assert_same(theirs[name], ours[name], name)
    with safe_open(tmp_path / "ours.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    raw = (tmp_path / "ours.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert n % 8 == 0 and raw[8 : 8 + n].endswith((b"}", b" "))
    for name, info in header.items():  # each tensor starts at a multiple of its element size
        if name != "__metadata__":
            assert info["data_offsets"][0] % tensors[name].element_size() == 0, name
    assert max(i["data_offsets"][1] for k, i in header.items() if k != "__metadata__") == len(raw) - 8 - n


def test_streamed_file_of_shared_and_foreign_dtype_tensors(tmp_path):
    from safetensors.torch import load_file

    from pickaxe.digests import file_digest
    from pickaxe.runs.tensorfile import write_tensors

    base = torch.arange(12.0)
    wide = torch.arange(5, dtype=torch.int64).to(torch.uint32)  # a dtype safetensors lacks: stored as raw bytes
    big = torch.randn(700, 1000)  # 2.8 MB: hashed in the helper thread while written
    tensors = {"a": base, "view": base[2:5], "same": base, "wide": wide, "big": big}
    assert write_tensors(tmp_path / "f.safetensors", tensors) == file_digest(tmp_path / "f.safetensors")
    got = load_file(tmp_path / "f.safetensors")
    assert torch.equal(got["a"], base) and torch.equal(got["same"], base) and torch.equal(got["view"], base[2:5])
    assert torch.equal(got["big"], big)
    assert got["wide"].dtype == torch.uint8 and torch.equal(got["wide"].view(torch.uint32), wide)
    with pytest.raises(ValueError, match="__metadata__"):
        write_tensors(tmp_path / "g.safetensors", {"__metadata__": base})


def test_checkpoint_files_are_streamed_not_built_by_safetensors(tmp_path, monkeypatch):
    import safetensors.torch

    def refuse(*args, **kwargs):
        raise AssertionError("safetensors.torch.save_file builds the whole file in memory")

    monkeypatch.setattr(safetensors.torch, "save_file", refuse)
    from pickaxe.runs.model import load_model, save_model
    from pickaxe.runs.policies import load_policy, save_policy

    state = {"algo": {"w": torch.randn(3, 4), "b": torch.randn(4).to(torch.bfloat16)}, "step": 3}
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, state)
    assert_same(state, mgr.load()[0])
    net = nn.Linear(3, 2)
    tied = nn.Sequential(net, nn.Linear(2, 3))
    tied[1].weight = nn.Parameter(net.weight.t())  # not the same shape: a second tensor over the same storage
    save_model(tmp_path, {"policy": tied}, step=5)
    save_policy(tmp_path, {"policy": tied}, 5, {"eval/x": 1.0})
    for load in (lambda n: load_model(tmp_path, n), lambda n: load_policy(tmp_path, n, 5)):
        fresh = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 3))
        load({"policy": fresh})
        for a, b in zip(tied.state_dict().values(), fresh.state_dict().values(), strict=True):
            assert torch.equal(a, b)
