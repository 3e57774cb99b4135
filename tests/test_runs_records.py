"""What a run writes about itself: ``manifest.json`` (config hash, git commit, versions), ``config.json``,
``events.jsonl``, ``metrics.jsonl`` (and ``rewind``), ``status.json``, the ``sys/*`` readings, and the
``pickaxe runs`` listing's fields and table."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
import types
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from pickaxe.errors import PickaxeError
from pickaxe.runs import manifest as manifest_mod
from pickaxe.runs import status as status_mod
from pickaxe.runs.listing import RunSummary, format_runs, list_runs, summarize_run
from pickaxe.runs.manifest import build_manifest, config_hash, git_commit, package_versions, to_jsonable
from pickaxe.runs.monitor import SystemMonitor
from pickaxe.runs.run import Run, default_run_dir, read_metrics
from pickaxe.runs.status import STATUS_FILE, process_alive, read_status, run_state, write_status

# ------------------------------------------------------------------------------------------ manifest.json


@dataclasses.dataclass
class _Inner:
    lr: float = 0.1
    sizes: tuple[int, ...] = (64, 64)


@dataclasses.dataclass
class _Outer:
    name: str = "x"
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    extra: dict = dataclasses.field(default_factory=lambda: {1: [_Inner(0.5, ())]})


def test_to_jsonable_turns_nested_dataclasses_into_plain_json() -> None:
    assert to_jsonable(_Outer()) == {
        "name": "x",
        "inner": {"lr": 0.1, "sizes": [64, 64]},
        "extra": {"1": [{"lr": 0.5, "sizes": []}]},
    }
    assert to_jsonable(_Inner) is _Inner  # a dataclass type is not an instance: left alone
    assert to_jsonable(3) == 3


def test_config_hash_is_a_short_sha256_of_the_canonical_json() -> None:
    expected = hashlib.sha256(b'{"a":1,"b":[1,2]}').hexdigest()[:16]
    assert config_hash({"b": (1, 2), "a": 1}) == expected
    assert config_hash({"a": 1, "b": [1, 2]}) == expected  # key order does not matter
    assert config_hash({"a": 2, "b": [1, 2]}) != expected


def _git(cwd: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_git_commit_and_dirty_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    head = _git(tmp_path, "rev-parse", "HEAD")
    monkeypatch.chdir(tmp_path)
    assert git_commit() == {"commit": head, "dirty": False}
    (tmp_path / "a.txt").write_text("changed\n")
    assert git_commit() == {"commit": head, "dirty": True}


def test_git_commit_outside_git_or_without_git_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_commit() is None  # not a checkout

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory: 'git'")

    monkeypatch.setattr(manifest_mod.subprocess, "run", missing)
    assert git_commit() is None

    def hangs(*args: Any, **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired("git", 5)

    monkeypatch.setattr(manifest_mod.subprocess, "run", hangs)
    assert git_commit() is None


def test_package_versions_skip_what_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    versions = package_versions()
    assert versions["python"] == platform.python_version()
    assert versions["torch"] == torch.__version__ and versions["numpy"] == metadata.version("numpy")
    real = metadata.version

    def without_gymnasium(name: str) -> str:
        if name == "gymnasium":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(manifest_mod.metadata, "version", without_gymnasium)
    versions = package_versions()
    assert "gymnasium" not in versions
    assert versions["numpy"] == real("numpy") and versions["tyro"] == real("tyro")  # listed after it: still there


def test_build_manifest_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_mod, "git_commit", lambda: {"commit": "abc", "dirty": False})
    monkeypatch.setattr(sys, "argv", ["pickaxe", "train", "cartpole-ppo"])
    m = build_manifest({"a": 1}, seed=7)
    assert m == {
        "git": {"commit": "abc", "dirty": False},
        "packages": package_versions(),
        "platform": platform.platform(),
        "command": ["pickaxe", "train", "cartpole-ppo"],
        "seed": 7,
        "config_hash": config_hash({"a": 1}),
    }
    assert build_manifest(None, seed=None)["config_hash"] is None


# ------------------------------------------------------------------------------------------ Run records


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_new_run_writes_config_manifest_and_started_event(tmp_path: Path) -> None:
    config = {"b": 1, "a": {"sizes": (1, 2)}}
    before = time.time()
    with Run(tmp_path / "r", config=config, seed=3, tensorboard=False):
        pass
    r = tmp_path / "r"
    assert sorted(p.name for p in r.iterdir()) == ["config.json", "events.jsonl", "manifest.json", "metrics.jsonl"]
    assert (r / "config.json").read_text() == json.dumps({"a": {"sizes": [1, 2]}, "b": 1}, indent=2) + "\n"
    manifest = json.loads((r / "manifest.json").read_text())
    assert (manifest["seed"], manifest["config_hash"]) == (3, config_hash(config))
    (started,) = _lines(r / "events.jsonl")
    assert started["message"] == "started" and started["step"] == 0
    assert (started["pid"], started["hostname"]) == (os.getpid(), socket.gethostname())
    assert before <= started["time"] <= time.time()
    assert Run.open(r, tensorboard=False).config() == {"a": {"sizes": [1, 2]}, "b": 1}


def test_run_without_config_has_no_config_json(tmp_path: Path) -> None:
    with Run(tmp_path / "r", tensorboard=True):
        pass
    assert not (tmp_path / "r" / "config.json").exists()
    assert json.loads((tmp_path / "r" / "manifest.json").read_text())["config_hash"] is None
    assert any((tmp_path / "r" / "tensorboard").iterdir())  # TensorBoard events on by default


def test_events_and_metrics_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Run(tmp_path / "r", tensorboard=False) as run:
        capsys.readouterr()
        run.event("resume from step 5", step=5, checkpoint="step-5")
        run.event("quiet", echo=False)
        run.log({"loss": 0.5, "bad": float("nan")}, step=7.0)  # type: ignore[arg-type]
        run.flush()
    assert capsys.readouterr().err == "pickaxe: resume from step 5\n"
    events = _lines(tmp_path / "r" / "events.jsonl")
    assert [(e["message"], e.get("step"), e.get("checkpoint")) for e in events[1:]] == [
        ("resume from step 5", 5, "step-5"),
        ("quiet", None, None),
    ]
    assert read_metrics(tmp_path / "r") == [{"step": 7, "loss": 0.5, "bad": None}]


def test_rewind_keeps_steps_up_to_the_checkpoint_and_drops_torn_lines(tmp_path: Path) -> None:
    with Run(tmp_path / "r", config={"a": 1}, tensorboard=False) as run:
        for step in (1, 2, 3):
            run.log({"x": float(step)}, step=step)
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write('{"note": "no step"}\n{"step": 4, "x"')  # a record without a step, then a torn write
    run = Run.open(tmp_path / "r", tensorboard=False)
    run.rewind(2)
    run.log({"x": 30.0}, step=3)
    run.close()
    assert read_metrics(tmp_path / "r") == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}, {"note": "no step"},
                                            {"step": 3, "x": 30.0}]  # fmt: skip
    assert not (tmp_path / "r" / ".metrics.jsonl.tmp").exists()
    run = Run.open(tmp_path / "r", tensorboard=False)
    run.rewind(0)
    run.close()
    assert read_metrics(tmp_path / "r") == [{"note": "no step"}]  # no step counts as step 0


def test_open_and_config_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError, match=f"^{tmp_path} is not a run directory: config.json is missing$"):
        Run.open(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    run = Run.open(tmp_path)
    with pytest.raises(PickaxeError, match=r"config\.json must hold a JSON object, got list; restore it"):
        run.config()
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(PickaxeError, match=r"config\.json is not valid JSON \(Expecting .*\); restore it"):
        run.config()
    (tmp_path / "config.json").unlink()
    with pytest.raises(PickaxeError, match=f"^cannot read {tmp_path / 'config.json'}: No such file or directory$"):
        run.config()


def test_default_run_dir_is_named_by_time_and_unique(tmp_path: Path) -> None:
    first = default_run_dir("ppo", tmp_path)
    assert first.parent == tmp_path and first.name.startswith("ppo-")
    assert time.strptime(first.name[len("ppo-") :], "%Y%m%d-%H%M%S")
    first.mkdir()
    second = default_run_dir("ppo", tmp_path)
    assert second in (Path(f"{first}-1"), tmp_path / f"ppo-{time.strftime('%Y%m%d-%H%M%S')}")
    assert not second.exists()


def test_discard_in_a_used_folder_removes_only_what_the_run_wrote(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "job.log").write_text("kept\n")
    run = Run(tmp_path / "r", config={"a": 1}, tensorboard=True)
    run.discard()
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["job.log"]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "other.txt").write_text("someone else's\n")
    run = Run(tmp_path / "a" / "b" / "r", tensorboard=False)
    run.discard()
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["other.txt"]  # b (made by the run) removed, a kept


# ------------------------------------------------------------------------------------------ status.json


def test_status_record_holds_fields_identity_and_time(tmp_path: Path) -> None:
    before = time.time()
    path = write_status(tmp_path, "stopped", step=10, reason="nan")
    assert path == tmp_path / STATUS_FILE
    record = json.loads(path.read_text())
    assert set(record) == {"state", "step", "reason", "pid", "hostname", "process_create_time", "time"}
    assert (record["state"], record["step"], record["reason"]) == ("stopped", 10, "nan")
    assert (record["pid"], record["hostname"]) == (os.getpid(), socket.gethostname())
    assert before <= record["time"] <= time.time()
    assert path.read_text().endswith("}\n")
    assert run_state(tmp_path) == "stopped"


@pytest.mark.parametrize("state", ["running", "finished", "interrupted", "crashed", "stopped"])
def test_each_state_reads_back(tmp_path: Path, state: str) -> None:
    write_status(tmp_path, state)
    assert run_state(tmp_path) == state and read_status(tmp_path)["state"] == state


def test_unknown_state_names_the_valid_ones(tmp_path: Path) -> None:
    states = "running, finished, interrupted, crashed, stopped"
    with pytest.raises(ValueError, match=rf"^unknown run state 'done'; use one of {states}$"):
        write_status(tmp_path, "done")
    (tmp_path / STATUS_FILE).write_text('{"state": "paused"}')  # written by something else
    assert run_state(tmp_path) == "crashed"


def test_identity_without_process_start_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(pid: int) -> Any:
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(status_mod.psutil, "Process", denied)
    write_status(tmp_path, "finished")
    assert read_status(tmp_path)["process_create_time"] is None


def test_failed_status_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_status(tmp_path, "running", step=1)

    def full(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(status_mod.os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        write_status(tmp_path, "finished", step=2)
    assert [p.name for p in tmp_path.iterdir()] == [STATUS_FILE]
    assert read_status(tmp_path)["step"] == 1  # the previous status is intact


def test_process_alive_checks() -> None:
    me = psutil.Process()
    assert process_alive(os.getpid())
    assert process_alive(os.getpid(), me.create_time() + 0.5)  # within the tolerance of the clock
    assert not process_alive(os.getpid(), me.create_time() + 2.0)  # a reused pid
    assert process_alive(os.getpid(), me.create_time(), socket.gethostname())
    assert process_alive(-1, None, "another-host")  # cannot be checked: trusted
    for pid in (0, -5, True, "123", None, 1.0):
        assert not process_alive(pid)


class _FakeProcess:
    def __init__(self, status: str = "running", error: type[Exception] | None = None) -> None:
        self._status, self._error = status, error

    def __call__(self, pid: int) -> _FakeProcess:
        if self._error is not None:
            raise self._error(pid)
        return self

    def status(self) -> str:
        return self._status

    def create_time(self) -> float:
        return 100.0


def test_zombies_are_gone_and_unreadable_processes_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_mod.psutil, "Process", _FakeProcess(psutil.STATUS_ZOMBIE))
    assert not process_alive(4242)
    monkeypatch.setattr(status_mod.psutil, "Process", _FakeProcess(error=psutil.AccessDenied))
    assert process_alive(4242)
    monkeypatch.setattr(status_mod.psutil, "Process", _FakeProcess(error=psutil.NoSuchProcess))
    assert not process_alive(4242)
    monkeypatch.setattr(status_mod.psutil, "Process", _FakeProcess())
    assert process_alive(4242, 100.9) and not process_alive(4242, 101.5)


# ------------------------------------------------------------------------------------------ sys/* readings


def test_system_monitor_reads_process_resources() -> None:
    monitor = SystemMonitor()
    reading = monitor.read()
    assert set(reading) == {"sys/cpu_percent", "sys/rss_mb"} or torch.cuda.is_available()
    assert reading["sys/cpu_percent"] >= 0.0
    rss = psutil.Process().memory_info().rss / 2**20
    assert abs(reading["sys/rss_mb"] - rss) < 0.1 * rss


def _fake_nvml(fail: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    def init() -> None:
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: f"gpu-{i}"  # type: ignore[attr-defined]
    util = {"gpu-0": 37, "gpu-1": 80}
    used = {"gpu-0": 512 * 2**20, "gpu-1": 3 * 2**30}
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=util[h])  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used[h])  # type: ignore[attr-defined]
    return nvml


@pytest.mark.parametrize("nvml_works", [True, False])
def test_system_monitor_reads_every_gpu(monkeypatch: pytest.MonkeyPatch, nvml_works: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 256 * 2**20)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail=not nvml_works))
    reading = SystemMonitor().read()
    gpus = {k: v for k, v in reading.items() if k.startswith("sys/gpu")}
    if nvml_works:
        assert gpus == {
            "sys/gpu0_util_percent": 37.0,
            "sys/gpu0_mem_mb": 512.0,
            "sys/gpu1_util_percent": 80.0,
            "sys/gpu1_mem_mb": 3072.0,
        }
        assert type(gpus["sys/gpu0_util_percent"]) is float
    else:
        assert gpus == {}  # no NVML: the torch reading only
    assert reading["sys/torch_cuda_max_allocated_mb"] == 256.0


# ------------------------------------------------------------------------------------------ pickaxe runs


def _run_folder(path: Path, config: Any, records: list[Any] | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    if records is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_summary_fields_from_unusual_files(tmp_path: Path) -> None:
    bare = _run_folder(tmp_path / "bare", [1, 2])  # config.json not an object, no metrics
    s = summarize_run(bare)
    assert (s.recipe, s.state, s.step, s.total_steps, s.metric, s.final_eval, s.best_eval, s.wall_s) == (
        "?", "crashed", None, None, "eval/return_mean", None, None, None
    )  # fmt: skip
    odd = _run_folder(
        tmp_path / "odd",
        {"recipe": "x", "trainer": {"total_steps": "1000"}},
        [
            {"step": 10, "eval/return_mean": True},  # not numbers: ignored
            {"step": 20, "eval/return_mean": "12"},
            {"step": 30, "eval/return_mean": None, "time/elapsed_s": "3"},
            {"step": 40, "eval/return_mean": 5},
            {"step": "50"},
        ],
    )
    s = summarize_run(odd)
    assert (s.step, s.total_steps, s.final_eval, s.best_eval, s.wall_s) == (None, None, 5.0, 5.0, None)
    trainer_not_dict = _run_folder(tmp_path / "t", {"recipe": "y", "trainer": [1000]}, [{"step": 8}])
    s = summarize_run(trainer_not_dict)
    assert (s.total_steps, s.step) == (None, 8)  # the last logged step when status.json has none
    write_status(trainer_not_dict, "interrupted", step="9")  # a step that is not an int is ignored
    assert summarize_run(trainer_not_dict).step == 8
    write_status(trainer_not_dict, "interrupted", step=9)
    assert (summarize_run(trainer_not_dict).step, summarize_run(trainer_not_dict).state) == (9, "interrupted")


def test_wall_time_sums_resumed_segments(tmp_path: Path) -> None:
    times = [5.0, 10.0, 2.0, 4.0, 4.0, 1.0]  # segments end at 10, 4 (equal values do not restart) and 1
    run = _run_folder(tmp_path / "r", {"recipe": "x"}, [{"step": i, "time/elapsed_s": t} for i, t in enumerate(times)])
    assert summarize_run(run).wall_s == 15.0


def test_listing_skips_tool_and_hidden_folders_and_runs_inside_runs(tmp_path: Path) -> None:
    top = _run_folder(tmp_path / "sweep" / "a", {"recipe": "a"})
    _run_folder(top / "nested", {"recipe": "inner"})  # inside a run: never listed
    for skipped in ("checkpoints", "tensorboard", "wandb", ".hidden", "__pycache__"):
        _run_folder(tmp_path / "sweep" / skipped / "r", {"recipe": skipped})
    b = _run_folder(tmp_path / "sweep" / "b", {"recipe": "b"})
    assert [s.path for s in list_runs(tmp_path)] == [top, b]
    assert [s.recipe for s in list_runs(top)] == ["a"]  # DIR is itself a run


def _summary(**kw: Any) -> RunSummary:
    base: dict[str, Any] = {
        "path": Path("runs/x"),
        "recipe": "r",
        "state": "finished",
        "step": None,
        "total_steps": None,
        "metric": "eval/return_mean",
        "final_eval": None,
        "best_eval": None,
        "wall_s": None,
    }
    return RunSummary(**{**base, **kw})


@pytest.mark.parametrize(
    ("wall_s", "shown"),
    [(None, "-"), (0.04, "0.0s"), (59.94, "59.9s"), (60.0, "1m00s"), (61.4, "1m01s"), (3599.0, "59m59s"),
     (3600.0, "1h00m"), (3725.0, "1h02m"), (90061.0, "25h01m")],
)  # fmt: skip
def test_wall_time_column(wall_s: float | None, shown: str) -> None:
    assert format_runs([_summary(wall_s=wall_s)]).splitlines()[1].split()[5] == shown


def test_table_columns_and_alignment() -> None:
    runs = [
        _summary(recipe="cartpole-ppo", step=1234567, total_steps=2000000, final_eval=499.96, best_eval=500.0),
        _summary(path=Path("runs/y"), recipe="g", state="running", metric="eval/accuracy", final_eval=0.12345,
                 best_eval=0.5, wall_s=7.0),
    ]  # fmt: skip
    lines = format_runs(runs).splitlines()
    assert lines == [  # numbers right-aligned under their headers, the run path last and whole
        "recipe        state               env steps  final eval  best eval  wall  run",
        "cartpole-ppo  finished  1,234,567/2,000,000       500.0      500.0     -  runs/x",
        "g             running                   ?/?       0.123      0.500  7.0s  runs/y",
    ]
    assert format_runs([]) == "no runs found (a run folder holds config.json)"


def test_rewind_skips_a_torn_line_in_the_middle(tmp_path: Path) -> None:
    _run_folder(tmp_path / "r", {"a": 1})
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    run = Run.open(tmp_path / "r", tensorboard=False)
    run.rewind(5)
    run.close()
    assert read_metrics(tmp_path / "r") == [{"step": 1}, {"step": 3}]


def test_wall_time_ignores_records_without_a_time(tmp_path: Path) -> None:
    records = [{"step": 1, "time/elapsed_s": 4.0}, {"step": 2}, {"step": 3, "time/elapsed_s": 6.0}]
    assert summarize_run(_run_folder(tmp_path / "r", {"recipe": "x"}, records)).wall_s == 6.0
