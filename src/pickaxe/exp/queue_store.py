"""The job queue's SQLite storage: jobs, their attempts, workers, and every state change as one transaction.

Jobs are command lines (usually ``pickaxe train ...``) with a priority, dependencies and a cpu/gpu request.
They live in one SQLite file (``~/.pickaxe/queue.db``; ``PICKAXE_QUEUE`` or ``db=`` / ``--db`` choose
another), which any number of processes share: the CLI adds and cancels, workers
(:mod:`pickaxe.exp.worker`) claim and run. The command line is :mod:`pickaxe.exp.queue_cli`.

Storage choices:

- WAL journal: readers (``queue list``, a worker polling for cancellations) never block the writer and the
  writer never blocks them.
- ``synchronous=FULL``: every commit is fsynced, so a machine that loses power or reboots keeps every
  job added and every state change made before it went down (``NORMAL`` keeps the file intact but may
  drop the last commits; a lost ``add`` is a lost job, a lost ``finish`` is a job run twice). Queue
  transactions are a handful per job, so the fsyncs cost nothing measurable.
- every state change is one ``BEGIN IMMEDIATE`` transaction (the write lock is taken first, so a read
  and the write that depends on it cannot interleave with another process), with a 30 s busy timeout;
- the schema version is ``PRAGMA user_version``; a newer file than this code understands is refused.

Exactly-once finishing: a job's attempt number and worker id act as a fencing token. A worker's
``finish`` applies only if the job is still ``running`` under the same worker and attempt, so a job that
was requeued (its worker judged dead) can never be finished by the old attempt too.

Liveness: a worker on this machine is alive while its pid exists with the same process start time in the
same boot (``/proc/sys/kernel/random/boot_id``); that check never mistakes a slow or stopped worker for a
dead one. Only a worker on another host is judged by its heartbeat (stale after ``stale_after`` seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pickaxe.errors import PickaxeError
from pickaxe.exp.processes import boot_id, kill_group, process_alive, process_start
from pickaxe.exp.queue_jobs import (
    Attempt,
    Job,
    Timing,
    attempt_from_row,
    check_states,
    default_job_name,
    exit_text,
    train_run_dir,
)

__all__ = ["JobQueue", "NoQueueError", "default_db_path"]

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
STALE_AFTER_S = 60.0
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "blocked"})
BAD_FOR_DEPENDENTS = ("failed", "cancelled", "blocked")
HOST = socket.gethostname()

_SCHEMA = [
    """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        argv TEXT NOT NULL,
        cwd TEXT NOT NULL,
        run_dir TEXT,
        priority INTEGER NOT NULL DEFAULT 0,
        cpus INTEGER NOT NULL CHECK (cpus >= 1),
        gpus INTEGER NOT NULL CHECK (gpus >= 0),
        state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled','blocked')),
        reason TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        exit_status INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        worker_id TEXT,
        pid INTEGER,
        gpu_ids TEXT NOT NULL DEFAULT '[]',
        created REAL NOT NULL,
        started REAL,
        finished REAL
    )""",
    "CREATE INDEX jobs_by_state ON jobs (state, priority DESC, id)",
    """CREATE TABLE deps (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        dep_id INTEGER NOT NULL REFERENCES jobs(id),
        PRIMARY KEY (job_id, dep_id)
    )""",
    "CREATE INDEX deps_by_dep ON deps (dep_id)",
    """CREATE TABLE attempts (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        attempt INTEGER NOT NULL,
        worker_id TEXT NOT NULL,
        argv TEXT,
        log_path TEXT NOT NULL,
        pid INTEGER,
        pid_start INTEGER,
        started REAL NOT NULL,
        ended REAL,
        exit_status INTEGER,
        outcome TEXT NOT NULL,
        PRIMARY KEY (job_id, attempt)
    )""",
    """CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        pid_start INTEGER,
        boot_id TEXT NOT NULL,
        slots INTEGER,
        gpus TEXT,
        started REAL NOT NULL,
        heartbeat REAL NOT NULL,
        stopped REAL
    )""",
]


class NoQueueError(PickaxeError):
    """The queue database does not exist (and was not to be created)."""


def default_db_path() -> Path:
    """``$PICKAXE_QUEUE`` if set, else ``~/.pickaxe/queue.db``."""
    env = os.environ.get("PICKAXE_QUEUE")
    return Path(env).expanduser() if env else Path.home() / ".pickaxe" / "queue.db"


# -------------------------------------------------------------------------------------------------- queue
class JobQueue:
    """The job queue in one SQLite file, safe to share between processes (and threads of one process).

    ``db`` defaults to :func:`default_db_path`; with ``create=False`` a missing file raises :class:`NoQueueError`
    instead of being created. Methods raise :class:`~pickaxe.errors.PickaxeError` with one
    line for user errors: an unknown job id, a transition a job's state does not allow.
    """

    def __init__(self, db: str | os.PathLike[str] | None = None, create: bool = True) -> None:
        self.path = (Path(db).expanduser() if db is not None else default_db_path()).absolute()
        if not create and not self.path.exists():
            raise NoQueueError(f"there is no job queue at {self.path} yet; `pickaxe queue add -- COMMAND` creates it")
        self._lock = threading.RLock()
        self._conn = self._connect()

    # ------------------------------------------------------------------------------------------ plumbing
    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise PickaxeError(f"cannot open the job queue {self.path}: {e}") from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = ""
            for _ in range(100):  # switching to WAL needs a moment alone with the file; the busy handler may not wait
                try:
                    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise
                    time.sleep(0.05)
            if str(mode).lower() != "wal":
                raise PickaxeError(f"{self.path}: SQLite cannot use WAL mode there (got {mode!r}); use a local disk")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise PickaxeError(f"{self.path} is not a usable job queue database: {e}") from None
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have done it
            if version > SCHEMA_VERSION:
                raise PickaxeError(
                    f"{self.path} has queue schema version {version}, newer than this pickaxe understands "
                    f"({SCHEMA_VERSION}); upgrade pickaxe"
                )
            if version == 0:
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the write lock is taken at BEGIN so read-then-write is atomic."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot across several SELECTs."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> JobQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result: ``"ok"`` for a sound file."""
        with self._lock:
            return "\n".join(str(r[0]) for r in self._conn.execute("PRAGMA integrity_check"))

    def log_path_for(self, job_id: int, attempt: int, run_dir: str | None) -> Path:
        """Where an attempt's stdout+stderr go: ``RUN_DIR/job.log`` (all attempts appended, each with a
        header line), else ``<db dir>/logs/<job id>-<attempt>.log`` (``<db dir>/<db name>-logs/...`` for a
        database not named ``queue.db``, so queues sharing a folder keep their logs apart)."""
        if run_dir:
            return Path(run_dir) / "job.log"
        folder = "logs" if self.path.name == "queue.db" else f"{self.path.stem}-logs"
        return self.path.parent / folder / f"{job_id}-{attempt}.log"

    # ---------------------------------------------------------------------------------------- reading
    def _job(self, c: sqlite3.Connection, row: sqlite3.Row) -> Job:
        deps = tuple(r[0] for r in c.execute("SELECT dep_id FROM deps WHERE job_id = ? ORDER BY dep_id", (row["id"],)))
        log = c.execute(
            "SELECT log_path FROM attempts WHERE job_id = ? AND attempt = ?", (row["id"], row["attempts"])
        ).fetchone()
        return Job(
            id=row["id"],
            name=row["name"],
            argv=json.loads(row["argv"]),
            cwd=row["cwd"],
            run_dir=row["run_dir"],
            priority=row["priority"],
            depends_on=deps,
            cpus=row["cpus"],
            gpus=row["gpus"],
            state=row["state"],
            reason=row["reason"],
            attempts=row["attempts"],
            exit_status=row["exit_status"],
            cancel_requested=bool(row["cancel_requested"]),
            worker_id=row["worker_id"],
            pid=row["pid"],
            gpu_ids=tuple(json.loads(row["gpu_ids"])),
            created=row["created"],
            started=row["started"],
            finished=row["finished"],
            log_path=log[0] if log else None,
        )

    def _row(self, c: sqlite3.Connection, job_id: int) -> sqlite3.Row:
        row = c.execute("SELECT * FROM jobs WHERE id = ?", (int(job_id),)).fetchone()
        if row is None:
            top = c.execute("SELECT MAX(id) FROM jobs").fetchone()[0]
            known = f"ids run from 1 to {top}" if top else "the queue is empty"
            raise PickaxeError(f"no job {job_id} in {self.path} ({known}; `pickaxe queue list` shows them)")
        return row

    def get(self, job_id: int) -> Job:
        """The job with this id; ``PickaxeError`` if there is none."""
        with self._read() as c:
            return self._job(c, self._row(c, job_id))

    def list(self, states: Iterable[str] | str | None = None) -> list[Job]:
        """Jobs in id order, optionally only those in ``states``."""
        wanted = check_states([states] if isinstance(states, str) else states)
        with self._read() as c:
            if wanted is None:
                rows = c.execute("SELECT * FROM jobs ORDER BY id").fetchall()
            else:
                marks = ",".join("?" * len(wanted))
                rows = c.execute(f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY id", wanted).fetchall()
            return [self._job(c, r) for r in rows]

    def attempts(self, job_id: int) -> list[Attempt]:
        """Every attempt of a job, oldest first."""
        with self._read() as c:
            self._row(c, job_id)
            rows = c.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (int(job_id),)).fetchall()
        return [attempt_from_row(r) for r in rows]

    def timing(self, job_ids: Iterable[int] | None = None) -> Timing:
        """Wall time spent inside the jobs' processes against the time the jobs took in all (see :class:`Timing`)."""
        with self._read() as c:
            if job_ids is None:
                ids = [r[0] for r in c.execute("SELECT id FROM jobs")]
            else:
                ids = [int(i) for i in job_ids]
                for i in ids:
                    self._row(c, i)
            created, starts, ends, per_job, n_attempts = [], [], [], {}, 0
            for i in ids:
                created.append(c.execute("SELECT created FROM jobs WHERE id = ?", (i,)).fetchone()[0])
                for a in c.execute("SELECT started, ended FROM attempts WHERE job_id = ?", (i,)):
                    n_attempts += 1
                    starts.append(a[0])
                    if a[1] is not None:
                        ends.append(a[1])
                        per_job[i] = per_job.get(i, 0.0) + a[1] - a[0]
        last = max(ends, default=None)
        return Timing(
            jobs=len(ids),
            attempts=n_attempts,
            job_s=sum(per_job.values()),
            span_s=(last - min(created)) if last is not None and created else 0.0,
            run_span_s=(last - min(starts)) if last is not None and starts else 0.0,
            per_job=per_job,
        )

    def counts(self, max_cpus: int | None = None, max_gpus: int | None = None) -> tuple[int, int]:
        """(queued jobs that fit ``max_cpus``/``max_gpus``, running jobs anywhere)."""
        with self._read() as c:
            queued = c.execute(
                "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND cpus <= ? AND gpus <= ?",
                (max_cpus if max_cpus is not None else 1 << 30, max_gpus if max_gpus is not None else 1 << 30),
            ).fetchone()[0]
            running = c.execute("SELECT COUNT(*) FROM jobs WHERE state = 'running'").fetchone()[0]
        return queued, running

    def dependency_closure(self, job_ids: Iterable[int]) -> set[int]:
        """The jobs and, transitively, every job they depend on."""
        with self._read() as c:
            todo = [int(i) for i in job_ids]
            for i in todo:
                self._row(c, i)
            seen: set[int] = set()
            while todo:
                j = todo.pop()
                if j not in seen:
                    seen.add(j)
                    todo.extend(r[0] for r in c.execute("SELECT dep_id FROM deps WHERE job_id = ?", (j,)))
        return seen

    # ---------------------------------------------------------------------------------------- writing
    def add(
        self,
        argv: Sequence[str],
        name: str | None = None,
        priority: int = 0,
        depends_on: Iterable[int] = (),
        cpus: int = 1,
        gpus: int = 0,
        run_dir: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> int:
        """Queue ``argv`` (run in ``cwd``, default the current directory) and return its job id.

        Higher ``priority`` runs first, FIFO within a priority. The job starts only after every job in
        ``depends_on`` succeeded; it is ``blocked`` at once if one of them already failed or was cancelled.
        ``run_dir`` (the pickaxe run directory the command writes) lets a later attempt resume the run; for a
        ``pickaxe train ... --run-dir DIR`` command it defaults to that ``DIR``. A string ``argv`` is split like
        a shell would (``shlex.split``); it is not run by a shell.
        """
        argv = shlex.split(argv) if isinstance(argv, str) else [str(a) for a in argv]
        if not argv or not argv[0]:
            raise PickaxeError("a job needs a command, e.g. `pickaxe queue add -- pickaxe train cartpole-ppo`")
        for key, value, low in (("cpus", cpus, 1), ("gpus", gpus, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PickaxeError(f"{key} must be an integer >= {low}, got {value!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise PickaxeError(f"priority must be an integer, got {priority!r}")
        deps = sorted({int(d) for d in depends_on})
        name = name or default_job_name(argv)
        run_dir = run_dir or train_run_dir(argv)
        workdir = str(Path(cwd or os.getcwd()).resolve())
        run = str((Path(workdir) / Path(run_dir).expanduser()).resolve()) if run_dir else None
        with self._tx() as c:
            state, reason = "queued", None
            for d in deps:
                dep_state = self._row(c, d)["state"]
                if dep_state in BAD_FOR_DEPENDENTS and state == "queued":
                    state, reason = "blocked", f"job {d} {dep_state}"
            cur = c.execute(
                "INSERT INTO jobs (name, argv, cwd, run_dir, priority, cpus, gpus, state, reason, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (name, json.dumps(argv), workdir, run, priority, cpus, gpus, state, reason, time.time()),
            )
            job_id = int(cur.lastrowid)
            c.executemany("INSERT INTO deps (job_id, dep_id) VALUES (?, ?)", [(job_id, d) for d in deps])
        return job_id

    def cancel(self, job_id: int) -> Job:
        """Cancel a job: queued or blocked ones at once; a running one is killed by its worker (the state
        turns ``cancelled`` when the worker has ended its process group; at once if that worker is dead). Jobs
        depending on it become blocked."""
        with self._tx() as c:
            row = self._row(c, job_id)
            if row["state"] in ("queued", "blocked"):
                c.execute(
                    "UPDATE jobs SET state = 'cancelled', reason = 'cancelled by user', finished = ? WHERE id = ?",
                    (time.time(), row["id"]),
                )
                self._block_dependents(c, row["id"])
            elif row["state"] == "running":
                c.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (row["id"],))
            else:
                raise PickaxeError(
                    f"job {job_id} is already {row['state']}; only queued, blocked or running jobs can be cancelled"
                )
            worker = row["worker_id"] if row["state"] == "running" else None
        if worker is not None and not self.worker_alive(worker):
            self.recover()  # nobody would act on the request: kill what is left of the job and mark it
        return self.get(job_id)

    def retry(self, job_id: int) -> Job:
        """Queue a failed, cancelled or blocked job again (its attempt count and old logs are kept), and
        unblock the jobs that were blocked only because of it. A job with a ``run_dir`` holding a pickaxe run
        resumes that run on its next attempt."""
        with self._tx() as c:
            row = self._row(c, job_id)
            if row["state"] not in BAD_FOR_DEPENDENTS:
                raise PickaxeError(
                    f"job {job_id} is {row['state']}; only failed, cancelled or blocked jobs can be retried"
                )
            bad = self._bad_dependency(c, row["id"])
            if bad is not None:
                raise PickaxeError(f"job {job_id} depends on job {bad[0]}, which is {bad[1]}; retry job {bad[0]} first")
            c.execute(
                "UPDATE jobs SET state = 'queued', reason = NULL, exit_status = NULL, cancel_requested = 0, "
                "worker_id = NULL, pid = NULL, finished = NULL WHERE id = ?",
                (row["id"],),
            )
            self._unblock_dependents(c, row["id"])
            return self._job(c, self._row(c, job_id))

    def _bad_dependency(self, c: sqlite3.Connection, job_id: int) -> tuple[int, str] | None:
        marks = ",".join("?" * len(BAD_FOR_DEPENDENTS))
        row = c.execute(
            f"SELECT j.id, j.state FROM deps d JOIN jobs j ON j.id = d.dep_id "
            f"WHERE d.job_id = ? AND j.state IN ({marks}) ORDER BY j.id LIMIT 1",
            (job_id, *BAD_FOR_DEPENDENTS),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def _block_dependents(self, c: sqlite3.Connection, job_id: int) -> None:
        todo = [job_id]
        while todo:
            j = todo.pop()
            state = c.execute("SELECT state FROM jobs WHERE id = ?", (j,)).fetchone()[0]
            for (d,) in c.execute(
                "SELECT d.job_id FROM deps d JOIN jobs j ON j.id = d.job_id WHERE d.dep_id = ? AND j.state = 'queued'",
                (j,),
            ).fetchall():
                c.execute("UPDATE jobs SET state = 'blocked', reason = ? WHERE id = ?", (f"job {j} {state}", d))
                todo.append(d)

    def _unblock_dependents(self, c: sqlite3.Connection, job_id: int) -> None:
        todo = [job_id]
        while todo:
            j = todo.pop()
            for (d,) in c.execute(
                "SELECT d.job_id FROM deps d JOIN jobs j ON j.id = d.job_id WHERE d.dep_id = ? AND j.state = 'blocked'",
                (j,),
            ).fetchall():
                if self._bad_dependency(c, d) is None:
                    c.execute("UPDATE jobs SET state = 'queued', reason = NULL WHERE id = ?", (d,))
                    todo.append(d)

    # ----------------------------------------------------------------------------------- worker side
    def register_worker(self, worker_id: str, slots: int | None = None, gpus: Sequence[str] = ()) -> None:
        """Record that the calling process is worker ``worker_id`` (its pid, boot, start time, heartbeat)."""
        with self._tx() as c:
            self._upsert_worker(c, worker_id, slots, gpus, replace=True)

    def _upsert_worker(
        self, c: sqlite3.Connection, worker_id: str, slots: int | None, gpus: Sequence[str], replace: bool
    ) -> None:
        now, pid = time.time(), os.getpid()
        c.execute(
            f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO workers "
            "(id, host, pid, pid_start, boot_id, slots, gpus, started, heartbeat) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (worker_id, HOST, pid, process_start(pid), boot_id(), slots, json.dumps(list(gpus)), now, now),
        )

    def heartbeat(self, worker_id: str) -> None:
        """Refresh a worker's heartbeat (only consulted for workers on other hosts)."""
        with self._tx() as c:
            c.execute("UPDATE workers SET heartbeat = ? WHERE id = ?", (time.time(), worker_id))

    def stop_worker(self, worker_id: str) -> None:
        """Mark a worker as stopped."""
        with self._tx() as c:
            c.execute("UPDATE workers SET stopped = ? WHERE id = ? AND stopped IS NULL", (time.time(), worker_id))

    def claim(
        self,
        worker_id: str,
        free_cpus: int,
        free_gpu_ids: Sequence[str] = (),
        *,
        max_cpus: int | None = None,
        max_gpus: int | None = None,
        only: Iterable[int] | None = None,
    ) -> Job | None:
        """Atomically take the next runnable job that fits ``free_cpus`` and ``free_gpu_ids`` for ``worker_id``.

        Runnable: ``queued`` with every dependency succeeded; order: priority (high first), then id. The job
        turns ``running``, its attempt count grows by one and it gets the first ``gpus`` of ``free_gpu_ids``.
        With ``max_cpus``/``max_gpus`` (the worker's whole capacity) the order is strict: if the first
        runnable job does not fit now but would on an idle worker, nothing is claimed, so big jobs are not
        starved by small ones; jobs too big for the worker are left to other workers. Without them, the
        first job that fits is taken. ``only`` restricts the choice to those job ids.
        """
        allowed = None if only is None else {int(i) for i in only}
        gpu_ids = [str(g) for g in free_gpu_ids]
        with self._lock:  # cheap check without the write lock: idle workers poll often
            if self._conn.execute("SELECT 1 FROM jobs WHERE state = 'queued' LIMIT 1").fetchone() is None:
                return None
        with self._tx() as c:
            self._upsert_worker(c, worker_id, None, (), replace=False)
            rows = c.execute(
                "SELECT * FROM jobs WHERE state = 'queued' AND NOT EXISTS (SELECT 1 FROM deps d "
                "JOIN jobs p ON p.id = d.dep_id WHERE d.job_id = jobs.id AND p.state != 'succeeded') "
                "ORDER BY priority DESC, id"
            ).fetchall()
            for row in rows:
                if allowed is not None and row["id"] not in allowed:
                    continue
                if row["cpus"] <= free_cpus and row["gpus"] <= len(gpu_ids):
                    return self._take(c, row, worker_id, gpu_ids[: row["gpus"]])
                cap_cpus = free_cpus if max_cpus is None else max_cpus
                cap_gpus = len(gpu_ids) if max_gpus is None else max_gpus
                if row["cpus"] <= cap_cpus and row["gpus"] <= cap_gpus:
                    return None  # its turn: wait until enough is free
            return None

    def _take(self, c: sqlite3.Connection, row: sqlite3.Row, worker_id: str, gpu_ids: list[str]) -> Job:
        now, attempt = time.time(), row["attempts"] + 1
        log = self.log_path_for(row["id"], attempt, row["run_dir"])
        c.execute(
            "UPDATE jobs SET state = 'running', attempts = ?, worker_id = ?, pid = NULL, gpu_ids = ?, started = ?, "
            "finished = NULL, exit_status = NULL, reason = NULL, cancel_requested = 0 WHERE id = ?",
            (attempt, worker_id, json.dumps(gpu_ids), now, row["id"]),
        )
        c.execute(
            "INSERT OR REPLACE INTO attempts (job_id, attempt, worker_id, log_path, started, outcome) "
            "VALUES (?, ?, ?, ?, ?, 'running')",
            (row["id"], attempt, worker_id, str(log), now),
        )
        return self._job(c, self._row(c, row["id"]))

    def set_process(
        self, job_id: int, attempt: int, worker_id: str, pid: int, pid_start: int | None, argv: Sequence[str]
    ) -> bool:
        """Record the process a worker started for an attempt (and the command it actually ran).

        Returns False (and records nothing) if the attempt is no longer this worker's."""
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "UPDATE jobs SET pid = ?, started = ? WHERE id = ? AND state = 'running' AND attempts = ? "
                "AND worker_id = ?",
                (pid, now, job_id, attempt, worker_id),
            )
            if cur.rowcount != 1:
                return False
            c.execute(
                "UPDATE attempts SET pid = ?, pid_start = ?, argv = ?, started = ? WHERE job_id = ? AND attempt = ?",
                (pid, pid_start, json.dumps(list(argv)), now, job_id, attempt),
            )
            return True

    def finish(
        self, job_id: int, exit_status: int, *, attempt: int | None = None, worker_id: str | None = None
    ) -> bool:
        """Record the end of a running job: ``succeeded`` on exit status 0, else ``cancelled`` if a cancel was
        requested, else ``failed`` (and the jobs depending on it become blocked).

        With ``attempt``/``worker_id`` (a worker's fencing token) it applies only if the job is still running
        that attempt under that worker. Returns whether it applied; a job finishes exactly once."""
        now = time.time()
        with self._tx() as c:
            row = self._row(c, job_id)
            if (
                row["state"] != "running"
                or (attempt is not None and row["attempts"] != attempt)
                or (worker_id is not None and row["worker_id"] != worker_id)
            ):
                return False
            if exit_status == 0:
                state, reason = "succeeded", None
            elif row["cancel_requested"]:
                state, reason = "cancelled", "cancelled by user while running"
            else:
                state, reason = "failed", exit_text(exit_status)
            c.execute(
                "UPDATE jobs SET state = ?, reason = ?, exit_status = ?, finished = ? WHERE id = ?",
                (state, reason, int(exit_status), now, row["id"]),
            )
            c.execute(
                "UPDATE attempts SET ended = ?, exit_status = ?, outcome = ? WHERE job_id = ? AND attempt = ?",
                (now, int(exit_status), state, row["id"], row["attempts"]),
            )
            if state != "succeeded":
                self._block_dependents(c, row["id"])
            return True

    def release(self, job_id: int, attempt: int, worker_id: str, outcome: str = "interrupted") -> bool:
        """Put a running attempt's job back in the queue (its worker stopped it, or died): ``queued`` again, or
        ``cancelled`` if a cancel was requested. Fenced like :meth:`finish`; returns whether it applied."""
        now = time.time()
        with self._tx() as c:
            row = self._row(c, job_id)
            if row["state"] != "running" or row["attempts"] != attempt or row["worker_id"] != worker_id:
                return False
            if row["cancel_requested"]:
                c.execute(
                    "UPDATE jobs SET state = 'cancelled', reason = 'cancelled by user while running', finished = ?, "
                    "pid = NULL WHERE id = ?",
                    (now, job_id),
                )
                self._block_dependents(c, job_id)
            else:
                c.execute(
                    "UPDATE jobs SET state = 'queued', reason = ?, worker_id = NULL, pid = NULL, gpu_ids = '[]' "
                    "WHERE id = ?",
                    (f"attempt {attempt} {outcome}; requeued", job_id),
                )
            c.execute(
                "UPDATE attempts SET ended = ?, outcome = ? WHERE job_id = ? AND attempt = ?",
                (now, outcome, job_id, attempt),
            )
            return True

    def worker_alive(self, worker_id: str | None, stale_after: float = STALE_AFTER_S) -> bool:
        """Whether worker ``worker_id`` is still running (see the module docstring for how this is judged)."""
        if worker_id is None:
            return False
        with self._lock:
            w = self._conn.execute("SELECT * FROM workers WHERE id = ?", (worker_id,)).fetchone()
        return _alive(w, stale_after)

    def recover(self, worker_id: str | None = None, stale_after: float = STALE_AFTER_S) -> list[int]:
        """Requeue the jobs left ``running`` by dead workers and return their ids.

        ``worker_id`` is the caller's own id (never judged dead). A dead worker's job processes on this
        machine, if any survived it, are killed (their whole process group) before the job is requeued, so
        a resumed attempt never runs beside the old one. A job whose cancel was requested becomes
        ``cancelled`` instead. The next attempt of a job with a ``run_dir`` resumes its run.
        """
        with self._read() as c:
            rows = c.execute(
                "SELECT j.id, j.attempts, j.worker_id, a.pid, a.pid_start FROM jobs j "
                "LEFT JOIN attempts a ON a.job_id = j.id AND a.attempt = j.attempts WHERE j.state = 'running'"
            ).fetchall()
            workers = {r["id"]: r for r in c.execute("SELECT * FROM workers")}
        dead = [r for r in rows if r["worker_id"] != worker_id and not _alive(workers.get(r["worker_id"]), stale_after)]
        here = boot_id()
        for r in dead:
            w = workers.get(r["worker_id"])
            same_boot = w is not None and w["host"] == HOST and (not here or w["boot_id"] == here)
            if r["pid"] and same_boot:
                kill_group(r["pid"], r["pid_start"])
        if not dead:
            return []
        recovered = []
        for r in dead:
            if self.release(r["id"], r["attempts"], r["worker_id"], outcome="lost"):
                recovered.append(r["id"])
        with self._tx() as c:
            for wid in {r["worker_id"] for r in dead if r["worker_id"] in workers}:
                c.execute("UPDATE workers SET stopped = ? WHERE id = ? AND stopped IS NULL", (time.time(), wid))
        return recovered


def _alive(w: sqlite3.Row | None, stale_after: float) -> bool:
    if w is None or w["stopped"] is not None:
        return False
    if w["host"] == HOST:
        here = boot_id()
        if here and w["boot_id"] and w["boot_id"] != here:
            return False  # the machine rebooted since
        return process_alive(w["pid"], w["pid_start"])
    return time.time() - w["heartbeat"] < stale_after
