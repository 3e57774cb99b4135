"""``pickaxe queue`` and ``pickaxe worker`` in-process: the list table's columns and figures, messages, help.

The table is read back cell by cell (rich draws ``│`` between cells), so a figure in the wrong column, a
column justified the wrong way or a mis-formatted time fails here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.exp.queue_cli import _duration, main_queue, main_worker
from pickaxe.exp.queue_store import JobQueue

COLUMNS = ["id", "name", "state", "prio", "after", "cpu", "gpu", "tries", "exit", "time", "note"]
RIGHT = {"id", "prio", "cpu", "gpu", "tries", "exit"}


def _sql(db: Path, statement: str, *params: object) -> None:
    conn = sqlite3.connect(db)
    conn.execute(statement, params)
    conn.commit()
    conn.close()


def _table(out: str) -> tuple[str, list[str], list[list[str]]]:
    """(title line, header names, rows of raw cells with their padding) of a table printed to a pipe."""
    lines = out.splitlines()
    headers = [c.strip() for c in lines[2].split("┃")[1:-1]]
    rows = [ln.split("│")[1:-1] for ln in lines if ln.startswith("│")]
    return lines[0], headers, rows


def _cells(row: list[str]) -> dict[str, str]:
    return {col: cell.strip() for col, cell in zip(COLUMNS, row, strict=True)}


def test_list_shows_each_figure_in_its_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "q.db"
    with JobQueue(db) as q:
        failed = q.add(["sh", "-c", "exit 3"], name="fails", priority=2)
        after = q.add(["true"], name="after-it", depends_on=[failed], cpus=2, gpus=1)
        running = q.add(["sleep", "9"], name="runs", gpus=2)
        quick = q.add(["true"], name="quick", priority=-1, gpus=1)
        slow = q.add(["true"], name="slow")
        waiting = q.add(["true"], name="waits", depends_on=[quick, slow])
        for job_id, status, gpus in ((failed, 3, []), (quick, 0, ["3"]), (slow, 0, [])):
            job = q.claim("w", free_cpus=8, free_gpu_ids=gpus, only=[job_id])
            assert q.finish(job_id, status, attempt=job.attempts, worker_id="w")
        assert q.claim("w", free_cpus=8, free_gpu_ids=["4", "7", "9"], only=[running]) is not None
        log, running_log = q.get(failed).log_path, q.get(running).log_path
    now = time.time()
    for job_id, started, finished in ((failed, 1000.0, 1042.34), (quick, 10.0, 69.9), (slow, 0.0, 3 * 3600 + 425.0)):
        _sql(db, "UPDATE jobs SET started = ?, finished = ? WHERE id = ?", started, finished, job_id)
    _sql(db, "UPDATE jobs SET started = ? WHERE id = ?", now - 125.5, running)
    capsys.readouterr()

    assert main_queue(["list", "--db", str(db)]) == 0
    title, headers, rows = _table(capsys.readouterr().out)
    assert title.startswith(f"jobs in {db}")  # left-justified title
    assert headers == COLUMNS
    cells = {int(_cells(r)["id"]): _cells(r) for r in rows}
    assert sorted(cells) == [failed, after, running, quick, slow, waiting]  # one line per job, nothing wrapped
    expect = {  # name, state, prio, after, cpu, gpu, tries, exit, time, note
        failed: ["fails", "failed", "2", "", "1", "0", "1", "3", "42.3s", f"exit status 3; log {log}"],
        after: ["after-it", "blocked", "0", str(failed), "2", "1", "0", "", "", f"job {failed} failed"],
        running: ["runs", "running", "0", "", "1", "2 (4,7)", "1", "", "2m05s", f"log {running_log}"],
        quick: ["quick", "succeeded", "-1", "", "1", "1", "1", "0", "59.9s", ""],  # its GPU is free again
        slow: ["slow", "succeeded", "0", "", "1", "0", "1", "0", "3h07m", ""],
        waiting: ["waits", "queued", "0", f"{quick},{slow}", "1", "0", "0", "", "", ""],
    }  # fmt: skip
    for job_id, values in expect.items():
        assert [cells[job_id][c] for c in COLUMNS[1:]] == values, job_id
    for row in rows:  # numbers are right-justified, text left-justified
        for col, cell in zip(COLUMNS, row, strict=True):
            if cell.strip() and len(cell.strip()) + 2 < len(cell):
                assert cell.endswith(cell.strip() + " ") == (col in RIGHT), (col, cell)
                assert cell.startswith(" " + cell.strip()) == (col not in RIGHT), (col, cell)

    with JobQueue(db) as q:
        q.cancel(running)  # its worker "w" is this live process: the cancel waits for the worker
    main_queue(["list", "--db", str(db), "--state", "running"])
    (row,) = _table(capsys.readouterr().out)[2]
    assert (_cells(row)["state"], _cells(row)["note"]) == ("running", "cancelling")


def test_list_fits_long_names_and_notes_in_a_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "q.db"
    name = "sweep/" + "x" * 110 + "/seed-3"
    with JobQueue(db) as q:
        job = q.add(["false"], name=name)
        q.claim("w", free_cpus=1)
        q.finish(job, 1)
        note = f"exit status 1; log {q.get(job).log_path}"
    main_queue(["list", "--db", str(db)])
    (row,) = _table(capsys.readouterr().out)[2]  # no cell folded onto a second line
    assert (_cells(row)["name"], _cells(row)["note"]) == (name, note)


def test_list_on_a_terminal_colours_states_and_keeps_names_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "q.db"
    long_name = "lr=0.001_clip=0.2_ent-coef=0.01_vf-coef=0.5_gae-lambda=0.95/seed-7"
    with JobQueue(db) as q:
        ids = {state: q.add(["true"], name=long_name if state == "queued" else state) for state in
               ("succeeded", "failed", "cancelled", "running", "queued")}  # fmt: skip
        for state, status in (("succeeded", 0), ("failed", 1)):
            q.claim("w", free_cpus=1, only=[ids[state]])
            q.finish(ids[state], status)
        q.cancel(ids["cancelled"])
        q.claim("w", free_cpus=1, only=[ids["running"]])
        assert q.get(q.add(["true"], name="blocked", depends_on=[ids["failed"]])).state == "blocked"
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("COLUMNS", "250")
    main_queue(["list", "--db", str(db)])
    out = capsys.readouterr().out
    codes = {"queued": 36, "running": 33, "succeeded": 32, "failed": 31, "cancelled": 35, "blocked": 31}
    for state, code in codes.items():
        assert f"\x1b[{code}m{state}\x1b[0m" in out, state
    monkeypatch.setenv("COLUMNS", "90")
    main_queue(["list", "--db", str(db), "--state", "queued"])
    assert long_name in capsys.readouterr().out  # a narrow terminal folds the other columns, never the name
    main_queue(["list", "--db", str(db), "--state", "failed"])
    assert "…" not in capsys.readouterr().out  # a log path too long for its column is folded, not cut


def test_durations() -> None:
    cases = {-3.0: "0.0s", 0.5: "0.5s", 59.94: "59.9s", 60.0: "1m00s", 61.9: "1m01s", 3599.0: "59m59s",
             3600.0: "1h00m", 3661.0: "1h01m", 26 * 3600 + 59 * 60: "26h59m"}  # fmt: skip
    assert {s: _duration(s) for s in cases} == cases


def test_queue_help_and_job_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["-h"], ["--help"]):
        assert main_queue(argv) == 0
        assert capsys.readouterr().out.startswith("usage: pickaxe queue COMMAND")
    for command, description in (("cancel", "Cancel a job."), ("retry", "Retry a job.")):
        with pytest.raises(SystemExit) as stop:
            main_queue([command, "--help"])
        out = capsys.readouterr().out
        assert stop.value.code == 0 and f"pickaxe queue {command}" in out and description in out
    with pytest.raises(SystemExit):
        main_queue(["add", "--help"])
    assert "pickaxe queue add [OPTIONS] -- COMMAND..." in capsys.readouterr().out
    for command, prog in ((main_queue, "pickaxe queue list"), (main_worker, "pickaxe worker")):
        argv = ["list"] if command is main_queue else []
        with pytest.raises(SystemExit):
            command([*argv, "--help"])
        assert f"usage: {prog} " in capsys.readouterr().out
        with pytest.raises(PickaxeError, match=f"^unknown option --dbx for {prog}; did you mean --db"):
            command([*argv, "--dbx", "x"])

    db = str(tmp_path / "q.db")
    with JobQueue(db) as q:
        running, queued = q.add(["sleep", "9"]), q.add(["true"])
        q.register_worker("w1")  # this live process: a cancel waits for it
        q.claim("w1", free_cpus=1, only=[running])
    assert main_queue(["cancel", str(running), "--db", db]) == 0
    assert capsys.readouterr().out == f"job {running} is running on worker w1; it will stop and be marked cancelled\n"
    assert main_queue(["cancel", "--db", db, str(queued)]) == 0
    assert capsys.readouterr().out == f"job {queued} cancelled\n"
    assert main_queue(["retry", str(queued), "--db", db]) == 0
    assert capsys.readouterr().out == f"job {queued} queued\n"
    for bad, message in [
        (["cancel", "--db", db, "x"], "pickaxe queue cancel: job ids are integers, got 'x'"),
        (["retry", "1", f"--dbb={db}"], "did you mean --db"),  # an unknown option, not a job id
        (["frobnicate"], "unknown queue command 'frobnicate'; did you mean"),
        (["add", "--db", db, "--"], "pickaxe queue add: the command after -- is empty"),
    ]:
        with pytest.raises(PickaxeError, match=message):
            main_queue(bad)


def test_add_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "q.db")
    base = ["add", "--db", db]
    ids = []
    for _ in range(2):
        main_queue([*base, "--", "true"])
        ids.append(int(capsys.readouterr().out))
    argv = [*base, f"--after={ids[0]}", "--priority", "3", "--after", str(ids[1]), "--cpus", "2", "--gpus", "1",
            "--name", "mine", "--run-dir", "runs/x", "--", "echo", "--after", "hi"]  # fmt: skip
    assert main_queue(argv) == 0
    with JobQueue(db) as q:
        job = q.get(int(capsys.readouterr().out))
    assert (job.depends_on, job.priority, job.cpus, job.gpus, job.name) == (tuple(ids), 3, 2, 1, "mine")
    assert job.argv == ["echo", "--after", "hi"] and job.run_dir == str(Path.cwd() / "runs" / "x")
    assert main_queue(["list", "--db", db, "--json", "--state=queued", "--state", "blocked"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_worker_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    db = str(tmp_path / "q.db")
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    for gpus, shown in ((["--gpus", " 0, 1"], "['0', '1']"), (["--gpus", "NONE"], "none"), ([], "['4', '5']")):
        assert main_worker(["--db", db, "--slots", "3", *gpus, "--until-empty"]) == 0
        err = capsys.readouterr().err
        assert err.startswith("pickaxe worker: ") and f"on {tmp_path / 'q.db'}: 3 slots, gpus {shown}\n" in err
    main_worker(["--db", db, "--gpus", "", "--until-empty"])
    assert f": {os.cpu_count()} slots, gpus none" in capsys.readouterr().err
    with JobQueue(db) as q:
        job = q.add(["true"], gpus=1)
    assert main_worker(["--db", db, "--slots", "1", "--gpus", "7", "--until-empty", "--poll", "0.01"]) == 0
    err = capsys.readouterr().err
    assert f"pickaxe worker: job {job} started (attempt 1): true" in err
    assert f"pickaxe worker: job {job} succeeded (exit status 0)" in err
    assert signal.getsignal(signal.SIGTERM) == before  # its SIGTERM handler is gone once it returns


def test_sigterm_to_the_worker_requeues_its_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "q.db")
    before = signal.getsignal(signal.SIGTERM)
    with JobQueue(db) as q:  # the job signals its parent, the worker (this process), once it runs
        job = q.add(["sh", "-c", "sleep 0.2; kill -TERM $PPID; sleep 30"])
    with pytest.raises(KeyboardInterrupt):  # at once: a worker that waited for its job would see it succeed
        main_worker(["--db", db, "--slots", "1", "--gpus", "none", "--poll", "0.01"])
    assert signal.getsignal(signal.SIGTERM) == before
    with JobQueue(db) as q:
        assert (q.get(job).state, [a.outcome for a in q.attempts(job)]) == ("queued", ["interrupted"])
    assert "stopped and the job requeued" in capsys.readouterr().err


def test_a_stop_signal_inside_a_queue_read_still_requeues_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: SIGTERM landing while a queue transaction was open raised KeyboardInterrupt there, left the
    transaction open, and the worker's release of the job failed, so it stayed ``running``. The signal now only
    sets a flag: the read it interrupted completes, and the job is requeued."""
    db = str(tmp_path / "q.db")
    with JobQueue(db) as q:
        job = q.add(["sleep", "30"])
    completed: list[bool] = []
    original = JobQueue._job

    def signalled_inside_the_read(self: JobQueue, c: sqlite3.Connection, row: sqlite3.Row) -> object:
        if row["state"] == "running" and not completed:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside the open read transaction
            completed.append(True)
        return original(self, c, row)

    monkeypatch.setattr(JobQueue, "_job", signalled_inside_the_read)
    with pytest.raises(KeyboardInterrupt):
        main_worker(["--db", db, "--slots", "1", "--gpus", "none", "--poll", "0.01"])
    assert completed == [True]  # the signal did not break off the read
    monkeypatch.undo()
    with JobQueue(db) as q:
        assert (q.get(job).state, [a.outcome for a in q.attempts(job)]) == ("queued", ["interrupted"])


def test_worker_command_runs_outside_the_main_thread(tmp_path: Path) -> None:
    results: list[object] = []
    before = signal.getsignal(signal.SIGTERM)
    args = ["--db", str(tmp_path / "q.db"), "--gpus", "none", "--until-empty"]
    thread = threading.Thread(target=lambda: results.append(main_worker(args)))  # e.g. a notebook's helper
    thread.start()
    thread.join(timeout=120)
    assert results == [0] and signal.getsignal(signal.SIGTERM) == before  # only the main thread sets handlers
