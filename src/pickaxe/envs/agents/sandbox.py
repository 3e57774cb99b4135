"""Run model-written Python in a separate, limited process: the sandbox behind the agents' ``python`` tool.

Each call is a fresh ``python -I -S`` process in its own session, temporary folder and (where the kernel lets an
unprivileged process make them) its own user, network, IPC, PID and mount namespaces, with resource limits, a
memory cgroup where one can be made (sandbox_cgroups.py) and an audit hook as a second layer (sandbox_boot.py).
``ProcessSandbox.isolation`` says which layers are active on this machine; docs/sandbox.md says what each layer
does and what none of them protect against.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Protocol

from pickaxe.envs.agents.sandbox_boot import BLOCKED_EXIT, BLOCKED_PREFIX, BOOTSTRAP
from pickaxe.envs.agents.sandbox_cgroups import CGROUPS, CallCgroups, CgroupBases, find_bases

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "disk_limit", "blocked", "sandbox_error")

# Files and folders its folder may hold per MB of ``disk_mb`` (each costs kernel memory, not counted in its size).
INODES_PER_MB = 64
# How often the parent measures the folder where no tmpfs bounds it (no mount namespace).
_FOLDER_POLL_S = 0.02

# The child's stderr is kept from its end (the traceback's last line matters most), stdout from its start.
_STDERR_LINES = 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run; each must be > 0.

    ``cpu_s`` (RLIMIT_CPU, rounded up to whole seconds), ``memory_mb`` (all the memory its processes hold together,
    shared memory and its folder's files included, where a memory cgroup can be made; RLIMIT_AS per process always),
    ``wall_s`` (after it the whole process group, and the PID namespace if there is one, is killed),
    ``output_chars`` (stdout and stderr each cut to this many characters, with a marker), ``processes`` (most
    processes and threads at once, the first one included), ``file_mb`` (RLIMIT_FSIZE: largest file it may write),
    ``disk_mb`` (the total size of its folder). docs/sandbox.md says which mechanism holds each where.
    """

    cpu_s: float = 2.0
    memory_mb: int = 256
    wall_s: float = 5.0
    output_chars: int = 2000
    processes: int = 16
    file_mb: int = 8
    disk_mb: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"SandboxLimits.{f.name} must be a number > 0, got {value!r}; pass a positive value")
            if f.type in (int, "int") and not isinstance(value, int):
                raise ValueError(f"SandboxLimits.{f.name} must be a whole number, got {value!r}; pass an int")


@dataclass
class SandboxResult:
    """What one run did. ``status``: one of ``STATUSES``; ``detail``: the one-line note ``text`` adds when not ok."""

    stdout: str
    stderr: str
    exit_code: int | None
    status: str
    duration_s: float
    truncated: bool
    detail: str = ""

    def text(self) -> str:
        """What the model sees: stdout, then (when not ok) the last lines of stderr and a one-line status note."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.status != "ok":
            tail = self.stderr.rstrip("\n").splitlines()[-_STDERR_LINES:]
            if tail:
                parts.append("\n".join(tail))
            parts.append(self.detail or f"[{self.status}]")
        return "\n".join(parts)


class Executor(Protocol):
    """Anything that runs a piece of Python under limits and never raises for what the code does."""

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        """Run ``code`` as a program; stdout, stderr and the outcome come back in the result."""
        ...


@dataclass(frozen=True)
class _Layers:
    userns: bool
    pidns: bool
    mountns: bool
    nproc: bool
    caps_dropped: bool
    private_proc: bool
    seccomp: bool
    cgroups: CgroupBases
    reason: str


class ProcessSandbox:
    """The default ``Executor``: a fresh ``python -I -S`` process per call (see the module docstring).

    ``python``: the interpreter to run (the sandbox sees only its standard library: ``-S`` skips site-packages).
    ``audit_hook``: the in-process second layer; turn it off only to test the kernel layers on their own.
    ``namespaces`` and ``cgroups``: use them where the machine allows; turn them off only to test the fallbacks that
    hold without them (docs/sandbox.md).
    """

    def __init__(
        self, python: str = sys.executable, *, audit_hook: bool = True, namespaces: bool = True, cgroups: bool = True
    ) -> None:
        self.python = python
        self.audit_hook = audit_hook
        self.namespaces = namespaces
        self.cgroups = cgroups

    @property
    def isolation(self) -> dict[str, bool]:
        """Which layers are active on this machine (probed once per process and interpreter)."""
        layers = _probe(self.python, self.namespaces, self.cgroups)
        return {
            "process": True,
            "rlimits": True,
            "user_namespace": layers.userns,
            "network_namespace": layers.userns,
            "pid_namespace": layers.pidns,
            "read_only_filesystem": layers.mountns,
            "private_proc": layers.private_proc,
            "capabilities_dropped": layers.caps_dropped,
            "fork_limit": layers.nproc or layers.cgroups.pids is not None,
            "pids_cgroup": layers.cgroups.pids is not None and not layers.nproc,
            "memory_cgroup": layers.cgroups.memory is not None,
            "shared_memory_refused": layers.cgroups.memory is None and layers.seccomp,
            "folder_tmpfs": layers.mountns,
            "audit_hook": self.audit_hook,
        }

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        """Run ``code`` under ``limits``; never raises for anything the code does (``sandbox_error`` if it cannot
        start)."""
        start = time.monotonic()
        try:
            return self._run(code, limits, _probe(self.python, self.namespaces, self.cgroups), start)
        except Exception as e:  # the sandbox's own failure, never the code's
            return SandboxResult("", "", None, "sandbox_error", time.monotonic() - start, False, _note_error(e))

    def _run(self, code: str, limits: SandboxLimits, layers: _Layers, start: float) -> SandboxResult:
        workdir = tempfile.mkdtemp(prefix="pickaxe-sandbox-")
        cgroups: CallCgroups | None = None
        oom_before = 0
        proc: subprocess.Popen[bytes] | None = None
        status_r, status_w = os.pipe()
        try:
            # pids only where RLIMIT_NPROC does not hold (root): joining a v1 cgroup costs ~20 ms (RCU sync)
            use_pids = layers.cgroups.pids is not None and not layers.nproc
            use_memory = layers.cgroups.memory is not None
            if use_pids or use_memory:
                cgroups = CGROUPS.take(layers.cgroups, use_pids, use_memory)
                # +1: the relay process outside the PID namespace is in the cgroup too
                cgroups.set_limits(limits.processes + (1 if layers.pidns else 0), limits.memory_mb * 2**20)
                oom_before = cgroups.oom_kills()
            cfg = {
                "status_fd": status_w,
                "dir": workdir,
                "cgroups": list(cgroups.dirs) if cgroups else [],
                "userns": layers.userns,
                "pidns": layers.pidns,
                "mountns": layers.mountns,
                "nproc": True,
                "processes": limits.processes,
                "cpu_s": max(1, math.ceil(limits.cpu_s)),
                "memory": limits.memory_mb * 2**20,
                "fsize": limits.file_mb * 2**20,
                "disk": limits.disk_mb * 2**20,
                "inodes": limits.disk_mb * INODES_PER_MB,
                "seccomp": layers.seccomp and not use_memory,
                "hook": self.audit_hook,
                "blocked_exit": BLOCKED_EXIT,
                "blocked_prefix": BLOCKED_PREFIX,
                "probe": False,
            }
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-c", BOOTSTRAP, repr(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LC_ALL": "C.UTF-8", "TMPDIR": workdir},
                pass_fds=(status_w,),
                start_new_session=True,
            )
            os.close(status_w)
            status_w = -1
            # without a tmpfs of its own (no mount namespace) the parent measures the folder and kills on excess
            watch = None if layers.mountns else workdir
            out, err, timed_out, exit_status, over_disk = _communicate(proc, code, limits, start, watch)
            duration = time.monotonic() - start
            outcome = _Outcome(timed_out, exit_status, _read_reports(status_r), over_disk,
                               cgroups.oom_kills() - oom_before if cgroups else 0)  # fmt: skip
            return _result(out, err, outcome, limits, duration)
        finally:
            if proc is not None:
                _kill_group(proc)
            if cgroups is not None:
                CGROUPS.give_back(cgroups)
            for fd in (status_r, status_w):
                if fd >= 0:
                    os.close(fd)
            _remove_tree(workdir)


class _Capped:
    """Bytes read from a pipe, keeping only the first (``head``) or last ``limit`` bytes; counts the rest."""

    def __init__(self, limit: int, head: bool) -> None:
        self.limit, self.head = limit, head
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.head:
            room = self.limit - len(self.data)
            if room > 0:
                self.data += chunk[:room]
        else:
            self.data += chunk
            if len(self.data) > 2 * self.limit:
                del self.data[: len(self.data) - self.limit]


class _FolderWatch:
    """The parent's measure of the sandbox folder where no tmpfs bounds it: ``over()`` is True once the files in it
    take more than ``limit`` bytes (checked at most every ``_FOLDER_POLL_S``)."""

    def __init__(self, folder: str | None, limit: int) -> None:
        self.folder, self.limit = folder, limit
        self.next = time.monotonic()

    def wait(self, remaining: float) -> float:
        """How long the caller may block before the next check is due."""
        return remaining if self.folder is None else max(0.0, min(remaining, self.next - time.monotonic()))

    def over(self) -> bool:
        if self.folder is None or time.monotonic() < self.next:
            return False
        self.next = time.monotonic() + _FOLDER_POLL_S
        return _folder_bytes(self.folder) > self.limit


def _folder_bytes(folder: str) -> int:
    """Bytes the files under ``folder`` take on disk (each inode once; sparse holes take nothing)."""
    seen: set[int] = set()
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


def _communicate(
    proc: subprocess.Popen[bytes], code: str, limits: SandboxLimits, start: float, watch_folder: str | None
) -> tuple[_Capped, _Capped, bool, int | None, bool]:
    """Feed the code, read both pipes with a cap until they close or the wall limit, and (``watch_folder``) kill
    the group once that folder holds more than ``disk_mb``; returns the wait status and whether that happened."""
    cap = limits.output_chars * 4 + 4  # bytes; cut to characters after decoding
    out, err = _Capped(cap, head=True), _Capped(cap, head=False)
    deadline = start + limits.wall_s
    watch = _FolderWatch(watch_folder, limits.disk_mb * 2**20)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    writer = threading.Thread(target=_feed, args=(proc.stdin, code.encode("utf-8", "surrogateescape")), daemon=True)
    writer.start()
    timed_out = over_disk = False
    with selectors.DefaultSelector() as sel:
        for pipe, sink in ((proc.stdout, out), (proc.stderr, err)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, sink)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if watch.over():
                over_disk = True
                break
            for key, _ in sel.select(watch.wait(remaining)):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if chunk:
                    key.data.add(chunk)
                else:
                    sel.unregister(key.fileobj)
    exit_status = None
    pidfd = _pidfd(proc.pid)
    try:
        while not timed_out and not over_disk:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                exit_status = status
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if watch.over():
                over_disk = True
                break
            if pidfd >= 0:  # wakes the moment the process exits
                select.select([pidfd], [], [], watch.wait(remaining))
            else:
                time.sleep(min(0.005, remaining))
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    if timed_out or over_disk:
        _kill_group(proc)
        _, exit_status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(exit_status)
    writer.join(timeout=1)
    return out, err, timed_out, exit_status, over_disk


def _pidfd(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: poll instead
        return -1


def _feed(stdin: Any, data: bytes) -> None:
    try:
        stdin.write(data)
        stdin.close()
    except OSError:  # the child died before reading its code; its exit status says why
        pass


def _read_reports(fd: int) -> list[dict[str, Any]]:
    os.set_blocking(fd, False)
    data = bytearray()
    while len(data) < 1 << 16:
        try:
            chunk = os.read(fd, 1 << 14)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    reports = []
    for line in bytes(data).decode("utf-8", "replace").splitlines():
        try:
            item = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(item, dict):
            reports.append(item)
    return reports


def _decode(capped: _Capped, chars: int) -> tuple[str, bool]:
    text = bytes(capped.data).decode("utf-8", "replace")
    if capped.head:
        more = capped.total - len(capped.data)
        if len(text) > chars or more > 0:
            return text[:chars] + f"\n[... output truncated: more than {chars:,} characters]", True
        return text, False
    if len(text) > chars or capped.total > len(capped.data):
        return f"[... earlier output truncated; the last {chars:,} characters follow]\n" + text[-chars:], True
    return text, False


@dataclass(frozen=True)
class _Outcome:
    """What the parent itself saw of one call (nothing here comes from the program's own process): whether the
    wall limit or the folder watch killed it, its wait status, the reports of the bootstrap (before the code ran)
    and of the relay, and how many processes the memory cgroup killed."""

    timed_out: bool
    exit_status: int | None
    reports: list[dict[str, Any]]
    over_disk: bool
    oom_kills: int


def _result(out: _Capped, err: _Capped, seen: _Outcome, limits: SandboxLimits, duration: float) -> SandboxResult:
    stdout, cut_out = _decode(out, limits.output_chars)
    stderr, cut_err = _decode(err, limits.output_chars)
    truncated = cut_out or cut_err
    code = None if seen.exit_status is None else os.waitstatus_to_exitcode(seen.exit_status)
    kinds = {r.get("kind"): r for r in seen.reports}
    signum = -code if code is not None and code < 0 else None
    # The last line of stderr is the program's own word: it only names why a program that failed did so, and
    # only as a reason the program could also have met honestly (a MemoryError, a refused action).
    last = (stderr.rstrip("\n").rpartition("\n")[2] if stderr else "") if code else ""

    def done(status: str, detail: str) -> SandboxResult:
        return SandboxResult(stdout, stderr, code, status, duration, truncated, detail)

    memory_note = f"[stopped: memory limit {limits.memory_mb} MB]"
    if "setup_failed" in kinds:
        return done("sandbox_error", f"[sandbox error: {kinds['setup_failed'].get('reason', '?')}]")
    if seen.timed_out:
        return done("timeout", f"[killed: wall time limit {limits.wall_s:g}s]")
    if seen.oom_kills > 0:
        return done("memory_limit", memory_note)
    if seen.over_disk or kinds.get("folder", {}).get("full"):
        return done("disk_limit", f"[stopped: folder size limit {limits.disk_mb} MB]")
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and _cpu_limit_hit(limits, duration)):
        return done("cpu_limit", f"[killed: CPU time limit {math.ceil(limits.cpu_s)}s]")
    if last.startswith("MemoryError") or "[Errno 12] Cannot allocate memory" in last:
        return done("memory_limit", memory_note)
    if code == BLOCKED_EXIT and last.startswith(BLOCKED_PREFIX):
        return done("blocked", f"[blocked by the sandbox: {last[len(BLOCKED_PREFIX) :]}]")
    if signum == signal.SIGXFSZ:
        return done("error", f"[killed: file size limit {limits.file_mb} MB]")
    if code == 0:
        return done("ok", "")
    if signum is not None:
        return done("error", f"[killed by signal {signal.Signals(signum).name}]")
    return done("error", f"[exit code {code}]")


def _cpu_limit_hit(limits: SandboxLimits, duration: float) -> bool:
    # SIGKILL comes at the CPU limit (soft = hard); a single-threaded process cannot use more CPU than wall time.
    return duration >= math.ceil(limits.cpu_s)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    def retry(func: Any, p: str, _exc: Any) -> None:
        try:  # the code may have taken away its own permissions on a file or folder
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _note_error(e: BaseException) -> str:
    return f"[sandbox error: {type(e).__name__}: {e}]"


@functools.cache
def _probe(python: str, namespaces: bool, cgroups: bool) -> _Layers:
    """Find which layers work here by running the bootstrap in probe mode: all namespaces, then fewer (none if not
    ``namespaces``), and where this process may make cgroups (nowhere if not ``cgroups``)."""
    bases = find_bases() if cgroups else CgroupBases(None, None, False)
    attempts = [(True, True, True), (True, True, False), (True, False, False)] if namespaces else []
    attempts.append((False, False, False))
    reason = ""
    for userns, pidns, mountns in attempts:
        ok, info = _probe_once(python, userns, pidns, mountns)
        if ok:
            return _Layers(
                userns,
                pidns,
                mountns,
                bool(info.get("nproc")),
                bool(info.get("caps_dropped")),
                bool(info.get("proc")),
                bool(info.get("seccomp")),
                bases,
                reason,
            )
        reason = reason or str(info.get("reason", ""))
    return _Layers(False, False, False, False, False, False, False, bases, reason)


def _probe_once(python: str, userns: bool, pidns: bool, mountns: bool) -> tuple[bool, dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="pickaxe-sandbox-probe-")
    status_r, status_w = os.pipe()
    try:
        cfg = {
            "status_fd": status_w, "dir": workdir, "cgroups": [], "userns": userns, "pidns": pidns,
            "mountns": mountns, "nproc": False, "processes": 4, "cpu_s": 5, "memory": 512 * 2**20,
            "fsize": 2**20, "disk": 2**20, "inodes": 64, "seccomp": True, "hook": True,
            "blocked_exit": BLOCKED_EXIT, "blocked_prefix": BLOCKED_PREFIX, "probe": True,
        }  # fmt: skip
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", BOOTSTRAP, repr(cfg)],
                input=b"",
                capture_output=True,
                pass_fds=(status_w,),
                timeout=20,
                start_new_session=True,
                cwd=workdir,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return False, {"reason": str(e)}
        os.close(status_w)
        status_w = -1
        reports = {r.get("kind"): r for r in _read_reports(status_r)}
        if "probe" in reports:
            return True, reports["probe"]
        return False, reports.get("setup_failed", {"reason": "the probe reported nothing"})
    finally:
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        _remove_tree(workdir)
