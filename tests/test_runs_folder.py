"""The run folder around training: a full, read-only or forbidden disk says which and what to do (found down the
chain of causes), unique folder names, the old run moved aside, undoing a run twice, and the final model's
``--checkpoint`` names and digest record (mutation survivors of issue 8)."""

from __future__ import annotations

import errno
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from pickaxe.errors import PickaxeError
from pickaxe.runs.folder import check_new_run_dir, disk_error, move_aside, unique_path
from pickaxe.runs.model import MODEL_DIGEST_FILE, MODEL_FILE, checkpoint_choice, load_model, save_model
from pickaxe.runs.run import Run, default_run_dir
from pickaxe.runs.status import process_alive, read_status, write_status

RUN = Path("runs/x")

# ------------------------------------------------------------------------------------------ disk errors

DISK_ERRORS = [
    (errno.ENOSPC, "no space left on device", "free space"),
    (errno.EDQUOT, "disk quota exceeded", "free space"),
    (errno.EROFS, "read-only file system", "make runs/x writable"),
    (errno.EACCES, "permission denied", "make runs/x writable"),
    (errno.EPERM, "operation not permitted", "make runs/x writable"),
]


@pytest.mark.parametrize(("code", "what", "fix"), DISK_ERRORS)
def test_disk_error_names_the_problem_and_the_fix(code: int, what: str, fix: str) -> None:
    e = OSError(code, "strerror", "runs/x/metrics.jsonl")
    assert str(disk_error(e, RUN)) == (
        f"{what} writing runs/x/metrics.jsonl; what was written before is kept: {fix} and run `pickaxe resume runs/x`"
    )
    no_file = OSError(code, "strerror")  # no file name: the run folder is named instead
    assert str(disk_error(no_file, RUN, resumable=False)) == (
        f"{what} writing runs/x; no run was created: {fix} and run the command again"
    )


class SafetensorError(Exception):
    """What safetensors raises for an I/O error (it is no OSError)."""


def test_disk_error_from_safetensors_text_only_for_its_error_type() -> None:
    text = "Error while serializing: I/O error: Read-only file system (os error 30)"
    assert str(disk_error(SafetensorError(text), RUN)).startswith("read-only file system writing runs/x;")
    assert disk_error(RuntimeError(text), RUN) is None  # the "(os error N)" text is trusted from safetensors only


def _wrapped(depth: int, suppress: bool = False) -> None:
    """Raise a RuntimeError whose chain of causes reaches an ENOSPC ``depth`` links down."""
    if depth == 0:
        raise OSError(errno.ENOSPC, "No space left on device", "runs/x/model.tmp")
    try:
        _wrapped(depth - 1)
    except Exception as inner:
        if suppress:
            raise RuntimeError(f"wrapper {depth}") from None
        if depth % 2:  # alternate an explicit cause and an implicit context
            raise RuntimeError(f"wrapper {depth}") from inner
        raise RuntimeError(f"wrapper {depth}")  # noqa: B904 - the implicit context is what is tested


def _caught(depth: int, suppress: bool = False) -> BaseException:
    with pytest.raises(Exception) as exc:
        _wrapped(depth, suppress)
    return exc.value


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_disk_error_found_down_the_chain_of_causes(depth: int) -> None:
    message = str(disk_error(_caught(depth), RUN))
    assert message.startswith("no space left on device writing runs/x/model.tmp; what was written before is kept")


def test_disk_error_stops_where_the_context_is_suppressed() -> None:
    assert disk_error(_caught(2, suppress=True), RUN) is None  # `raise ... from None` hides the cause
    assert disk_error(PickaxeError("already a message"), RUN) is None


# ------------------------------------------------------------------------------------------ a new run's folder


def test_a_folder_holding_a_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    Run(tmp_path / "r", config={"x": 1}).close()
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "r")  # overwrite is off unless asked for
    assert str(exc.value) == (
        f"{tmp_path / 'r'} already holds a run (config.json); `pickaxe resume {tmp_path / 'r'}` continues it, "
        "--overwrite moves it aside and starts a new one, or choose another --run-dir"
    )
    assert check_new_run_dir(tmp_path / "r", overwrite=True) is True


def test_broken_link_or_file_is_not_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "link")
    assert str(exc.value) == (
        f"run folder {tmp_path / 'link'} is a broken symbolic link; remove it or choose another run folder"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "file")
    assert (
        str(exc.value)
        == f"run folder {tmp_path / 'file'} is a file, not a folder; choose another run folder (--run-dir)"
    )
    (tmp_path / "works").symlink_to(tmp_path, target_is_directory=True)  # a link to a folder is fine
    assert check_new_run_dir(tmp_path / "works") is False


@pytest.fixture
def unwritable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every folder refuses new files (a read-only mount; chmod does not stop root)."""

    def refuse(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)


@pytest.mark.usefixtures("unwritable")
def test_unwritable_folder_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path)  # an existing, empty folder
    assert str(exc.value) == (
        f"cannot write run folder {tmp_path}: {tmp_path} is not writable (Permission denied); "
        "choose another --run-dir or fix its permissions"
    )
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "a" / "r")  # to be created: the folder it would be created in is named
    assert str(exc.value) == (
        f"cannot write run folder {tmp_path / 'a' / 'r'}: {tmp_path} (where {tmp_path / 'a' / 'r'} would be created) "
        "is not writable (Permission denied); choose another --run-dir or fix its permissions"
    )


def test_overwrite_needs_the_parent_writable_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Run(tmp_path / "r", config={"x": 1}).close()
    real = tempfile.mkstemp

    def parent_read_only(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        if Path(dir) == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", parent_read_only)
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "r", overwrite=True)  # the old run is renamed within its parent
    assert str(exc.value).startswith(
        f"cannot write run folder {tmp_path / 'r'}: {tmp_path} (where {tmp_path / 'r'} would be created) is not "
    )


def test_folder_that_cannot_be_inspected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(self: Path) -> bool:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "is_symlink", fails)
    with pytest.raises(PickaxeError) as exc:
        check_new_run_dir(tmp_path / "r")
    assert str(exc.value) == f"cannot use run folder {tmp_path / 'r'}: Permission denied; choose another --run-dir"


# ------------------------------------------------------------------------------------------ folder names


def test_unique_path_counts_past_taken_names(tmp_path: Path) -> None:
    base = tmp_path / "run"
    assert unique_path(base) == base
    for name in ("run", "run-1", "run-3"):
        (tmp_path / name).mkdir()
    assert unique_path(base) == tmp_path / "run-2"  # the first free number, counting up by one
    (tmp_path / "run-2").mkdir()
    assert unique_path(base) == tmp_path / "run-4"


def test_default_run_dir_lies_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_run_dir("cartpole-ppo").parent == Path("runs")


def test_move_aside_renames_to_old_and_the_time(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text("{}")
    before = time.strftime("%Y%m%d-%H%M%S")
    moved = move_aside(tmp_path / "r")
    after = time.strftime("%Y%m%d-%H%M%S")
    assert re.fullmatch(r"r\.old-\d{8}-\d{6}", moved.name) and before <= moved.name[len("r.old-") :] <= after
    assert (moved / "config.json").read_text() == "{}" and not (tmp_path / "r").exists()


def test_failed_move_aside_keeps_the_old_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Run(tmp_path / "r", config={"x": 1}) as run:
        run.log({"loss": 1.0}, 1)
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir() if p.is_file()}

    def busy(src: Any, dst: Any) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr("pickaxe.runs.folder.os.rename", busy)
    with pytest.raises(PickaxeError) as exc:
        Run(tmp_path / "r", config={"x": 2}, overwrite=True)
    assert re.fullmatch(
        rf"cannot move the run in {re.escape(str(tmp_path / 'r'))} aside to "
        rf"{re.escape(str(tmp_path))}/r\.old-\d{{8}}-\d{{6}} \(Device or resource busy\); move or delete it yourself",
        str(exc.value),
    ), str(exc.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir() if p.is_file()} == before  # nothing removed


def test_new_run_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Run(tmp_path / "r", config={"x": 1}).close()
    assert capsys.readouterr() == ("", "")  # the "started" event is recorded in events.jsonl, not echoed


def test_discard_twice_is_harmless(tmp_path: Path) -> None:
    run = Run(tmp_path / "a" / "r", config={"x": 1})
    run.discard()
    run.discard()  # e.g. once by a failed start and once by the caller's cleanup
    assert not (tmp_path / "a").exists()


def test_discarding_a_reopened_run_removes_nothing(tmp_path: Path) -> None:
    with Run(tmp_path / "r", config={"x": 1}) as run:
        run.log({"loss": 1.0}, 1)
    before = sorted(p.name for p in (tmp_path / "r").iterdir())
    Run.open(tmp_path / "r").discard()  # only a run's own failed start undoes anything
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before


def test_config_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    with Run(tmp_path / "r", config={"x": 1}) as run:
        (tmp_path / "r" / "config.json").write_bytes(b'{"x": "\xff"}')
        with pytest.raises(PickaxeError) as exc:
            run.config()
    assert str(exc.value) == (
        f"{tmp_path / 'r' / 'config.json'} is not UTF-8 text (byte 7 is b'\\xff'); "
        "restore it from a copy or delete the run"
    )


def test_set_status_records_the_fields(tmp_path: Path) -> None:
    with Run(tmp_path / "r", config={"x": 1}) as run:
        run.set_status("running", step=1000, total_steps=50000)
    status = read_status(tmp_path / "r")
    assert status is not None and (status["state"], status["step"], status["total_steps"]) == ("running", 1000, 50000)


def test_status_write_failing_before_its_temporary_file_exists_keeps_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(self: Path, *args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_text", read_only)
    with pytest.raises(OSError) as exc:
        write_status(tmp_path, "running", step=1)
    assert exc.value.errno == errno.EROFS  # not the FileNotFoundError of removing a file never made
    assert str(disk_error(exc.value, tmp_path)).startswith("read-only file system writing ")


def test_init_process_is_alive() -> None:
    assert process_alive(1)  # pid 1 always exists; only pids <= 0 are invalid


# ------------------------------------------------------------------------------------------ the final model


@pytest.mark.parametrize(
    ("given", "chosen"),
    [("final", "final"), (" latest ", "latest"), ("best", "best"), ("2048", 2048), ("step-2048", 2048), (7, 7)],
)
def test_checkpoint_names(given: Any, chosen: Any) -> None:
    assert checkpoint_choice(given) == chosen


def testcheckpoint_choice_refuses_a_bool() -> None:
    with pytest.raises(PickaxeError) as exc:
        checkpoint_choice(True)  # type: ignore[arg-type]  # an int to Python, but no env step
    assert str(exc.value) == "checkpoint must be final, latest, best or an env step, got True"


@pytest.mark.parametrize("given", ["step-", "step-x", "Step-5", "-5", "newest", "2048-step"])
def test_bad_checkpoint_names(given: str) -> None:
    with pytest.raises(PickaxeError) as exc:
        checkpoint_choice(given)
    assert str(exc.value) == f"--checkpoint must be final, latest, best or an env step (e.g. 10000), got {given!r}"


@pytest.mark.parametrize(
    "record",
    [
        [],
        {"sha256": "ab"},
        {"size": "12", "sha256": "ab"},
        {"size": True, "sha256": "ab"},
        {"size": 12},
        {"size": 12, "sha256": 5},
    ],
)
def test_malformed_model_digest_record_is_refused(tmp_path: Path, record: Any) -> None:
    net = nn.Linear(2, 2)
    save_model(tmp_path, {"net": net})
    (tmp_path / MODEL_DIGEST_FILE).write_text(json.dumps(record))
    with pytest.raises(PickaxeError) as exc:
        load_model(tmp_path, {"net": net})
    assert str(exc.value) == (
        f"{tmp_path / MODEL_DIGEST_FILE} is unreadable or malformed; delete it to load {MODEL_FILE} unverified"
    )
