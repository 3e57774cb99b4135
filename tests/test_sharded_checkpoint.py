"""Sharded checkpoints (pickaxe.runs.shards, CheckpointManager.shard_writer, write_rank_shards): two gloo learners
train an FSDP2 model, rank 0 saves while rank 1 writes its own shard file (as the launcher has them do), and one
process then loads the checkpoint whole (every tensor equals the gathered one, bit for bit), lazily (any row range,
e.g. a three-way split) and falls back past a checkpoint whose shard file is damaged. Single-process checks use
torch's fake process group, which lets one process hold rank 0's (or rank 1's) DTensors of a two-rank mesh; a
learner SIGKILLed at each write of a sharded save leaves the previous checkpoint as ``latest``."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pickaxe.dist import data_parallel
from pickaxe.faults import CHECKPOINT_POINTS
from pickaxe.runs.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointWarning,
    ShardWriter,
    load_checkpoint,
    write_rank_shards,
)
from pickaxe.runs.shards import ShardedTensorRef, chunk_rows

sys.path.insert(0, str(Path(__file__).parent))
from test_checkpoint import assert_same

WORLD = 2
SHARDS = "shards-rank-1.safetensors"


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    # 7 rows split 4 + 3, 3 rows 2 + 1, 1 row 1 + 0 (rank 1 holds an empty piece)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Linear(3, 1))


def _gather(obj: Any) -> Any:
    """``obj`` with every DTensor replaced by its full tensor (a collective: every rank calls it alike)."""
    if hasattr(obj, "full_tensor"):
        return obj.full_tensor()
    if isinstance(obj, dict):
        out = type(obj)((k, _gather(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if isinstance(obj, list | tuple):
        return type(obj)(_gather(v) for v in obj)
    return obj


def _launcher_writer() -> ShardWriter:
    """Rank 0's shard writer, as the launcher builds it: send the folder to the other ranks, gather their entries."""

    def write(folder: Path) -> dict[str, dict]:
        dist.broadcast_object_list([str(folder)], src=0)
        entries: list[Any] = [None] * WORLD
        dist.gather_object({}, entries, dst=0)
        return {name: entry for got in entries[1:] for name, entry in got.items()}

    return write


def _serve_save(algo_state: dict) -> None:
    """What a learner other than rank 0 does while rank 0 saves."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    entries = write_rank_shards(Path(box[0]), {"algo": algo_state}, dist.get_rank())
    dist.gather_object(entries, None, dst=0)


def _own_rows_match(state: dict, algo: dict) -> bool:
    """Whether the lazy refs of a loaded checkpoint give this rank exactly its own rows of every DTensor."""
    rank = dist.get_rank()

    def walk(loaded: Any, live: Any) -> bool:
        if isinstance(live, dict):
            return all(walk(loaded[k], v) for k, v in live.items())
        if isinstance(live, list | tuple):
            return all(walk(a, b) for a, b in zip(loaded, live, strict=True))
        if hasattr(live, "to_local"):
            a, b = chunk_rows(live.shape[0], WORLD)[rank]
            return isinstance(loaded, ShardedTensorRef) and torch.equal(loaded[a:b], live.to_local())
        return True

    return walk(state["algo"], algo)


def _worker(rank: int, port: int, run_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    data_parallel.init(rank, WORLD, port=port)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        model = _model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mgr = CheckpointManager(run_dir, keep_last=5, keep_best=0)
        if rank == 0:
            mgr.shard_writer = _launcher_writer()
        data = torch.Generator().manual_seed(1)
        for step in range(1, 4):
            model(torch.randn(8, 5, generator=data)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if step >= 2:  # checkpoints of steps 2 and 3
                algo = {"policy": model.state_dict(), "optimizer": opt.state_dict()}
                if rank == 0:
                    mgr.save(step, {"trainer": {"step": step}, "algo": algo, "rng": torch.get_rng_state()})
                else:
                    _serve_save(algo)
        algo = {"policy": model.state_dict(), "optimizer": opt.state_dict()}
        full = _gather(algo)
        dist.barrier()  # the checkpoint is complete: every rank reads its own rows back
        state, _ = CheckpointManager(run_dir).load(lazy_shards=True)
        torch.save({"full": full, "own_rows": _own_rows_match(state, algo)}, Path(out) / f"rank{rank}.pt")
    finally:
        data_parallel.shutdown()


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """(a run folder with two-learner FSDP checkpoints at steps 2 and 3, each rank's gathered state at step 3)."""
    torch.set_num_threads(1)  # conftest's one-thread fixture is per test: this module-wide setup runs before it
    root = tmp_path_factory.mktemp("sharded")
    run_dir = root / "run"
    mp.start_processes(
        _worker, args=(data_parallel.free_port(), str(run_dir), str(root)), nprocs=WORLD, start_method="spawn"
    )
    return run_dir, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


def test_sharded_checkpoint_layout(sharded_run) -> None:
    run_dir, _ = sharded_run
    folder = run_dir / "checkpoints" / "step-000000000003"
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert sorted(manifest["files"]) == ["meta.json", SHARDS, "tensors.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == ["MANIFEST.json", "meta.json", SHARDS, "tensors.safetensors"]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["format_version"] == manifest["format_version"] == 2
    entries = meta["sharded"]["entries"]
    assert meta["sharded"]["files"] == [SHARDS]
    # 6 parameters, each with its two AdamW moments; the step counters are plain tensors
    assert len(entries) == 18
    weight = entries["state['algo']['policy']['0.weight']"]
    assert weight == {
        "shape": [7, 5],
        "dtype": "float32",
        "pieces": [["tensors.safetensors", 0, 4], [SHARDS, 4, 7]],
    }
    assert entries["state['algo']['policy']['3.bias']"]["pieces"] == [["tensors.safetensors", 0, 1], [SHARDS, 1, 1]]


def test_learners_read_their_own_rows_back(sharded_run) -> None:
    _, ranks = sharded_run
    assert [r["own_rows"] for r in ranks] == [True, True]


def test_materialised_state_is_the_gathered_state(sharded_run) -> None:
    run_dir, ranks = sharded_run
    full = ranks[0]["full"]
    for state, info in (
        CheckpointManager(run_dir).load(),
        load_checkpoint(run_dir / "checkpoints" / "step-000000000003"),
    ):
        assert info.step == 3 and state["trainer"] == {"step": 3}
        assert_same(full, state["algo"])  # every weight and moment bit for bit, dict types and key types too
    assert_same(ranks[1]["full"], full)


def test_a_sharded_checkpoint_resumes_on_one_learner(sharded_run) -> None:
    """2 -> 1: a plain model and AdamW take the materialised state and continue like the sharded pair would."""
    run_dir, ranks = sharded_run
    state, _ = CheckpointManager(run_dir).load()
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.load_state_dict(state["algo"]["policy"])
    opt.load_state_dict(state["algo"]["optimizer"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, ranks[0]["full"]["policy"][name])
    assert opt.state[model[0].weight]["exp_avg"].equal(ranks[0]["full"]["optimizer"]["state"][0]["exp_avg"])


def test_lazy_refs_give_any_rows_for_another_number_of_learners(sharded_run) -> None:
    run_dir, ranks = sharded_run
    full = ranks[0]["full"]
    mgr = CheckpointManager(run_dir)
    mgr.lazy_shards = True  # what the launcher sets, so the Trainer's own loads get refs
    state, _ = mgr.load()
    policy = state["algo"]["policy"]
    assert all(isinstance(v, ShardedTensorRef) for v in policy.values())
    moments = state["algo"]["optimizer"]["state"][0]
    assert isinstance(moments["exp_avg"], ShardedTensorRef) and isinstance(moments["step"], torch.Tensor)
    for name, ref in policy.items():
        want = full["policy"][name]
        assert (ref.shape, ref.dtype, ref.ndim, len(ref), ref.numel()) == (
            want.shape, want.dtype, want.dim(), len(want), want.numel()
        )  # fmt: skip
        for start, stop in chunk_rows(len(ref), 3):  # resumed on three learners
            assert torch.equal(ref[start:stop], want[start:stop]), (name, start, stop)
        assert torch.equal(ref.materialise(), want)
        assert torch.equal(ref[-1], want[-1]) and torch.equal(ref[:], want)
    weight = policy["0.weight"]
    assert torch.equal(weight[3:5], full["policy"]["0.weight"][3:5])  # one row from each learner's file
    assert torch.equal(pickle.loads(pickle.dumps(weight))[2:6], full["policy"]["0.weight"][2:6])
    assert weight[5:5].shape == (0, 5)
    with pytest.raises(ValueError, match="step must be 1"):
        weight[::2]
    with pytest.raises(IndexError, match="out of range"):
        weight[7]
    with pytest.raises(TypeError, match="indexed by a row or a row slice, not tuple"):
        weight[0, 1]
    assert torch.equal(weight[torch.tensor(4)], full["policy"]["0.weight"][4])  # any integer index
    eager, _ = mgr.load(lazy_shards=False)  # a call's own choice wins over the attribute
    assert isinstance(eager["algo"]["policy"]["0.weight"], torch.Tensor)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "unlisted"])
def test_a_damaged_shard_file_is_named_and_skipped(sharded_run, tmp_path: Path, damage: str) -> None:
    run_dir = _copy(sharded_run[0], tmp_path)
    folder = run_dir / "checkpoints" / "step-000000000003"
    shard = folder / SHARDS
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[-3] ^= 0x01  # a bit of rank 1's last tensor
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-4])
    elif damage == "delete":
        shard.unlink()
    else:  # the manifest no longer covers the shard file (and the file is gone): meta.json still needs it
        manifest = json.loads((folder / "MANIFEST.json").read_text())
        del manifest["files"][SHARDS]
        (folder / "MANIFEST.json").write_text(json.dumps(manifest))
        shard.unlink()
    expected = {
        "flip": f"{SHARDS} does not match its sha256 in MANIFEST.json (corrupted on disk)",
        "truncate": f"{SHARDS} has",
        "delete": f"{SHARDS} is missing but listed in MANIFEST.json",
        "unlisted": f"MANIFEST.json does not list {SHARDS}, which meta.json needs",
    }[damage]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state, info = CheckpointManager(run_dir).load(lazy_shards=True)
    assert info.step == 2 and state["trainer"] == {"step": 2}
    (skip,) = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    assert f"skipping damaged checkpoint {folder.name}" in skip and f"checkpoint {folder}: {expected}" in skip
    with pytest.raises(CheckpointError, match=f"checkpoint {folder}: "):
        load_checkpoint(folder)


# ------------------------------------------------------------------------------------ one process, fake group
def _fake_rank(rank: int) -> Any:
    """Join a fake two-rank group as ``rank`` (no other process: collectives do nothing); return its 1-D mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    return init_device_mesh("cpu", (WORLD,))


def _full(step: int) -> dict[str, torch.Tensor]:
    """The full tensors the fake learners shard (their values depend on the step)."""
    return {
        "w": torch.arange(21.0).reshape(7, 3) + step,
        "h": (torch.arange(10.0) / 3 + step).to(torch.bfloat16),
        "one": torch.full((1, 3), float(step)),  # rank 1's piece is empty
    }


def _sharded(mesh: Any, step: int) -> dict[str, Any]:
    """``{"algo": ...}`` as learner ``mesh.get_local_rank()`` holds it at ``step``: DTensors and a plain counter."""
    from torch.distributed.tensor import DTensor, Shard

    rank = mesh.get_local_rank()
    algo: dict[str, Any] = {"counter": torch.tensor(step)}
    for name, t in _full(step).items():
        a, b = chunk_rows(t.shape[0], WORLD)[rank]
        algo[name] = DTensor.from_local(
            t[a:b].clone(), mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride()
        )
    return {"algo": algo}


def _in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child (it joins its own fake group); its result, or its exception re-raised."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def run() -> None:
        try:
            child.send(("ok", fn(*args)))
        except BaseException as e:  # handed to the parent to raise
            child.send(("err", f"{type(e).__name__}: {e}"))

    proc = ctx.Process(target=run)
    proc.start()
    kind, value = parent.recv()
    proc.join()
    if kind == "err":
        raise AssertionError(value)
    return value


def _rank1_server(conn: Connection) -> None:
    """Learner 1: for each folder rank 0 sends (with the step), write its shards there and send back the entries."""
    mesh = _fake_rank(1)
    while True:
        folder, step = conn.recv()
        conn.send(write_rank_shards(Path(folder), _sharded(mesh, step), 1))


def _rank0_saves(run_dir: str, conn: Connection, steps: list[int], fault: str | None) -> None:
    """Learner 0: save each step through a shard writer that asks learner 1 (over ``conn``) for its shards."""
    mesh = _fake_rank(0)
    if fault:
        os.environ["PICKAXE_FAULT"] = fault
    mgr = CheckpointManager(run_dir, keep_last=1, keep_best=0)
    for step in steps:

        def writer(folder: Path, step: int = step) -> dict[str, dict]:
            conn.send((str(folder), step))
            return conn.recv()

        mgr.shard_writer = writer
        mgr.save(step, {"trainer": {"step": step}, **_sharded(mesh, step)})


def _two_fake_learners(run_dir: Path, steps: list[int], fault: str | None = None) -> int:
    """Run learners 0 and 1 (forked, fake group) saving ``steps``; learner 0's exit code."""
    ctx = multiprocessing.get_context("fork")
    end0, end1 = ctx.Pipe()
    server = ctx.Process(target=_rank1_server, args=(end1,), daemon=True)
    server.start()
    saver = ctx.Process(target=_rank0_saves, args=(str(run_dir), end0, steps, fault))
    saver.start()
    saver.join()
    server.kill()
    server.join()
    return saver.exitcode


def _check_step(state: dict, step: int) -> None:
    assert state["trainer"] == {"step": step} and torch.equal(state["algo"]["counter"], torch.tensor(step))
    for name, want in _full(step).items():
        assert_same(want, state["algo"][name], name)


def test_fake_learners_save_and_load(tmp_path: Path) -> None:
    assert _two_fake_learners(tmp_path / "run", [1, 2]) == 0
    state, info = CheckpointManager(tmp_path / "run").load()
    assert info.step == 2
    _check_step(state, 2)


@pytest.mark.parametrize("point", CHECKPOINT_POINTS)
def test_learner_killed_at_each_write_of_a_sharded_save_leaves_the_previous_checkpoint(tmp_path: Path, point: str):
    run_dir = tmp_path / "run"
    # inside the second save; retention deletes for the first time there
    code = _two_fake_learners(run_dir, [1, 2], f"{point}:{1 if point == 'checkpoint-retention' else 2}")
    assert code == -signal.SIGKILL
    latest = (run_dir / "checkpoints" / "latest").read_text()
    before_pointer = point in CHECKPOINT_POINTS[: CHECKPOINT_POINTS.index("latest-tmp") + 1]
    assert latest == ("step-000000000001\n" if before_pointer else "step-000000000002\n")
    state, info = CheckpointManager(run_dir).load()
    _check_step(state, info.step)
    assert info.step == (1 if before_pointer else 2)
    assert _two_fake_learners(run_dir, [3]) == 0  # the next save clears what the killed one left
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step-000000000003"]
    _check_step(CheckpointManager(run_dir).load()[0], 3)


def _refusals(run_dir: str) -> dict[str, str]:
    """Every way rank 0 refuses a sharded save, and what is left on disk."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from pickaxe.runs.state import flatten_state, split_state
    from pickaxe.runs.weights import write_weights

    mesh = _fake_rank(0)
    state = {"trainer": {}, **_sharded(mesh, 1)}
    out = {}
    mgr = CheckpointManager(run_dir)
    for key, writer in (("no_writer", None), ("empty_writer", lambda folder: {}), ("bad_writer", lambda f: {"x": 1})):
        mgr.shard_writer = writer
        try:
            mgr.save(1, state)
        except (ValueError, CheckpointError) as e:
            out[key] = f"{type(e).__name__}: {e}"
    out["left"] = ",".join(sorted(p.name for p in Path(run_dir, "checkpoints").iterdir()))
    by_dim1 = DTensor.from_local(torch.zeros(2, 2), mesh, [Shard(1)], run_check=False)
    for key, fn in (
        ("dim1", lambda: split_state({"x": by_dim1})),
        ("flatten", lambda: flatten_state(state)),
        ("rank0", lambda: write_rank_shards(Path(run_dir), state, 0)),
        ("wrong_rank", lambda: write_rank_shards(Path(run_dir), state, 1)),
    ):
        try:
            fn()
        except (TypeError, ValueError) as e:
            out[key] = f"{type(e).__name__}: {e}"
    replicated = DTensor.from_local(torch.arange(4.0), mesh, [Replicate()], run_check=False)
    tensors, skeleton = flatten_state({"r": replicated})  # the local tensor is the whole tensor
    out["replicated"] = json.dumps(skeleton) + str(tensors["t/0"].tolist())
    net = nn.Linear(2, 4)
    net.weight = nn.Parameter(DTensor.from_local(torch.zeros(2, 2), mesh, [Shard(0)], run_check=False))
    try:
        write_weights(Path(run_dir) / "model.safetensors", {"policy": net})
    except ValueError as e:
        out["weights"] = str(e)
    return out


def test_sharded_saves_that_cannot_be_complete_are_refused(tmp_path: Path) -> None:
    out = _in_child(_refusals, str(tmp_path / "run"))
    assert out["no_writer"].startswith("ValueError: the state holds tensors sharded over several learners")
    assert "CheckpointManager.shard_writer is None" in out["no_writer"]
    assert f"returned no entry for {SHARDS} (a learner did not write its shards)" in out["empty_writer"]
    assert "the shard writer returned {'x': 1}, not manifest entries" in out["bad_writer"]
    assert out["left"] == ""  # nothing written, no temporary folder left, no latest
    assert out["dim1"] == "TypeError: state['x']: cannot store a DTensor placed Shard(dim=1); checkpoints store " + (
        "Shard(0) (FSDP2) or Replicate"
    )
    assert out["flatten"].startswith("TypeError: state['algo']['w']: a tensor sharded over 2 ranks; save it with")
    assert "for the learners other than rank 0" in out["rank0"]
    assert "this process is rank 0 of the tensor's device mesh, not rank 1" in out["wrong_rank"]
    assert out["replicated"] == '{"r": {"__tensor__": "t/0"}}[0.0, 1.0, 2.0, 3.0]'
    assert out["weights"] == "policy.weight is sharded over several learners; gather the full weights first"


def test_a_shard_file_that_lacks_an_entry_is_named(tmp_path: Path) -> None:
    from pickaxe.runs.tensorfile import write_tensors

    assert _two_fake_learners(tmp_path / "run", [1]) == 0
    folder = tmp_path / "run" / "checkpoints" / "step-000000000001"
    entry = write_tensors(folder / SHARDS, {"state['algo']['w']": torch.zeros(3, 3)})  # rank 1's other pieces lost
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    manifest["files"][SHARDS] = entry
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=rf"{SHARDS} lacks the sharded entry state\['algo'\]\['h'\]"):
        load_checkpoint(folder)
    entry = write_tensors(
        folder / SHARDS, {"state['algo']['w']": torch.zeros(2, 3), "state['algo']['h']": torch.zeros(5)}
    )
    manifest["files"][SHARDS] = entry
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(
        CheckpointError, match=rf"{SHARDS} holds state\['algo'\]\['w'\] as F32 \[2, 3\], meta.json records F32 \[3, 3\]"
    ):
        load_checkpoint(folder)


def test_unflatten_keeps_ordered_dicts_of_refs() -> None:
    from pickaxe.runs.state import unflatten_state

    ref = ShardedTensorRef(("a", "b"), ("n", "n"), ((0, 1), (1, 1)), torch.Size([1]), torch.float32)
    skeleton = {"__dict__": [["x", {"__sharded__": "n"}]], "ordered": True}
    out = unflatten_state({"n": ref}, skeleton, map_location="cpu")
    assert isinstance(out, OrderedDict) and out["x"] is ref


def test_a_one_learner_checkpoint_reads_the_same_way_on_more_learners(tmp_path: Path) -> None:
    """1 -> 2: without sharded entries a lazy load gives full tensors, which each learner slices alike."""
    full = _full(4)
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(4, {"algo": full})
    assert json.loads((path / "meta.json").read_text())["format_version"] == 1  # readable by an older pickaxe
    state, _ = mgr.load(lazy_shards=True)
    for name, want in full.items():
        for start, stop in chunk_rows(len(want), WORLD):
            assert torch.equal(state["algo"][name][start:stop], want[start:stop])
