"""Run model-written Python in a separate, limited process: the sandbox behind the agents' ``python`` tool.

Each call is a fresh ``python -I -S`` process in its own session, temporary folder and (where the kernel lets an
unprivileged process make them) its own user, network, PID and mount namespaces, with resource limits and an audit
hook as a second layer. ``ProcessSandbox.isolation`` says which layers are active on this machine; docs/sandbox.md
says what each layer does and what none of them protect against.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import errno
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
from pathlib import Path
from typing import Any, Protocol

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "blocked", "sandbox_error")

# The child's stderr is kept from its end (the traceback's last line matters most), stdout from its start.
_STDERR_LINES = 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run; each must be > 0.

    ``cpu_s`` (RLIMIT_CPU, rounded up to whole seconds), ``memory_mb`` (RLIMIT_AS: address space per process),
    ``wall_s`` (after it the whole process group, and the PID namespace if there is one, is killed),
    ``output_chars`` (stdout and stderr each cut to this many characters, with a marker), ``processes`` (most
    processes and threads at once, the first one included), ``file_mb`` (RLIMIT_FSIZE: largest file it may write).
    """

    cpu_s: float = 2.0
    memory_mb: int = 256
    wall_s: float = 5.0
    output_chars: int = 2000
    processes: int = 16
    file_mb: int = 8

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


# Runs as ``python -I -S -c _BOOTSTRAP CONFIG_JSON``. Order matters: the cgroup is joined while still privileged,
# the namespaces are made before the rlimits (RLIMIT_NPROC set inside a new user namespace counts only that
# namespace's processes), capabilities are dropped after the mounts, and the audit hook comes last.
_BOOTSTRAP = r"""
import os, sys
cfg = eval(sys.argv[1], {"__builtins__": {}})  # a dict literal written by ProcessSandbox (no json: it costs ~20 ms)
sfd = cfg["status_fd"]
def report(kind, **kw):
    try:
        os.write(sfd, (repr(dict(kind=kind, **kw)) + "\n").encode())
    except OSError:
        pass
try:
    import _signal as signal, ctypes, resource  # _signal: the signal module imports enum (~10 ms)
    libc = ctypes.CDLL(None, use_errno=True)
    def check(ok, what):
        if not ok:
            e = ctypes.get_errno()
            raise OSError(e, what + ": " + os.strerror(e))
    if cfg["cgroup"]:
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write("0")
    if cfg["userns"]:
        uid, gid = os.getuid(), os.getgid()
        flags = 0x10000000 | 0x40000000  # CLONE_NEWUSER | CLONE_NEWNET
        if cfg["pidns"]:
            flags |= 0x20000000
        if cfg["mountns"]:
            flags |= 0x00020000
        check(libc.unshare(flags) == 0, "unshare")
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write("0 %d 1" % uid)
        with open("/proc/self/gid_map", "w") as f:
            f.write("0 %d 1" % gid)
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
except BaseException as e:
    report("setup_failed", reason="%s: %s" % (type(e).__name__, e))
    os._exit(70)
if cfg["pidns"]:
    # This process stays outside the PID namespace and relays the outcome of the namespace's first process
    # (its PID 1: when it ends the kernel kills everything else in the namespace).
    try:
        pid = os.fork()
    except BaseException as e:
        report("setup_failed", reason="fork: %s" % e)
        os._exit(70)
    if pid:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                pass
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (9, 19):  # SIGKILL and SIGSTOP cannot be handled
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL: die with the relay
try:
    proc_private = False
    if cfg["mountns"]:
        class MountAttr(ctypes.Structure):
            _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64),
                        ("userns_fd", ctypes.c_uint64)]
        def setattr_(path, rec, set_, clr):
            a = MountAttr(set_, clr, 0, 0)
            # mount_setattr(AT_FDCWD, path, AT_RECURSIVE?, &attr, size); syscall 442 on x86_64 and arm64
            L = ctypes.c_long
            r = libc.syscall(L(442), L(-100), path.encode(), L(0x8000 if rec else 0), ctypes.byref(a),
                             L(ctypes.sizeof(a)))
            check(r == 0, "mount_setattr " + path)
        check(libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None) == 0, "mount private")  # MS_PRIVATE|MS_REC
        # a /proc of its own PID namespace: the host's processes and their command lines vanish from view
        proc_private = cfg["pidns"] and libc.mount(b"proc", b"/proc", b"proc", 0x2 | 0x4 | 0x8, None) == 0
        setattr_("/", True, 1, 0)  # MOUNT_ATTR_RDONLY on every mount
        d = cfg["dir"].encode()
        check(libc.mount(d, d, None, 0x1000, None) == 0, "bind " + cfg["dir"])  # MS_BIND
        setattr_(cfg["dir"], False, 0, 1)  # its folder alone writable again
    # Keep no way back to privilege: no_new_privs, root gets no capabilities on exec, then drop them all.
    libc.prctl(38, 1, 0, 0, 0)
    libc.prctl(28, 0x2F, 0, 0, 0)
    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    caps_dropped = libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()) == 0
    limits = [
        (resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"])),  # SIGKILL at the limit: PID 1 ignores SIGXCPU
        (resource.RLIMIT_AS, (cfg["memory"], cfg["memory"])),
        (resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if cfg["nproc"]:
        limits.append((resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"])))
    for which, value in limits:
        resource.setrlimit(which, value)
    os.chdir(cfg["dir"])
    if cfg["probe"]:
        nproc_works = False
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
        except OSError:
            nproc_works = True
        report("probe", caps_dropped=caps_dropped, nproc=nproc_works, proc=proc_private)
        os._exit(0)
    del libc, check, limits
except BaseException as e:
    report("setup_failed", reason="%s: %s" % (type(e).__name__, e))
    os._exit(70)

import builtins

class SandboxBlocked(PermissionError):
    pass

def _run(code, cfg, report):
    home = os.path.realpath(cfg["dir"])
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    realpath, fspath, isabs, join = os.path.realpath, os.fspath, os.path.isabs, os.path.join
    process_events = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                      "subprocess.Popen", "os.startfile", "pty.spawn"}
    path_events = {"os.remove": (0,), "os.rename": (0, 1), "os.mkdir": (0,), "os.rmdir": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,), "os.utime": (0,),
                   "shutil.rmtree": (0,), "os.chflags": (0,), "os.lchflags": (0,), "os.lchmod": (0,),
                   "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
    me = os.getpid()

    def inside(path):
        if isinstance(path, int):
            return True
        path = fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = realpath(path)
        return full == home or full.startswith(home + os.sep) or full == "/dev/null"

    def deny(what):
        report("blocked", what=what)
        raise SandboxBlocked("blocked by the sandbox: " + what)

    def hook(event, args):
        if event.startswith("socket.") or event == "urllib.Request":
            deny("network access")
        if event in process_events:
            deny("starting processes")
        if event.startswith("ctypes.") and event != "ctypes.set_errno":
            deny("ctypes (native calls)")
        if event in ("os.kill", "os.killpg") and args[0] not in (0, me):
            deny("signalling other processes")
        if event == "open":
            path, mode, flags = args[0], args[1], args[2] or 0
            writes = (flags & write_flags) or (isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writes and not inside(path):
                deny("writing outside its folder (%s)" % path)
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    deny("changing files outside its folder (%s)" % args[i])

    import _posixsubprocess  # its fork_exec raises no audit event

    def no_fork_exec(*args, **kwargs):
        deny("starting processes")

    _posixsubprocess.fork_exec = no_fork_exec
    sys.addaudithook(hook)
    sys.argv = ["<code>"]
    glb = {"__name__": "__main__", "__builtins__": builtins}
    exit_code = 0
    try:
        exec(compile(code, "<code>", "exec"), glb)
    except SystemExit as e:
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code
        else:
            print(e.code, file=sys.stderr)
            exit_code = 1
    except BaseException as e:
        report("exception", type=type(e).__name__, blocked=isinstance(e, SandboxBlocked))
        import linecache, traceback  # only now: they cost ~10 ms of start-up
        linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
        # the user's frames and the library frames they called, not the sandbox's own ("<string>")
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != "<string>"]
        lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
        sys.stderr.write("".join(lines + traceback.format_exception_only(type(e), e)))
        exit_code = 1
    return exit_code

if cfg["hook"]:
    rc = _run(code, cfg, report)
else:
    exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    rc = 0
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    pass
os._exit(rc & 0xFF)
"""


@dataclass(frozen=True)
class _Layers:
    userns: bool
    pidns: bool
    mountns: bool
    nproc: bool
    caps_dropped: bool
    private_proc: bool
    cgroup_base: str | None
    reason: str


def _pids_cgroup_base() -> str | None:
    """A pids-cgroup folder this process may make children in (cgroup v1 or v2), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
            break
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                if "pids" not in (base / "cgroup.subtree_control").read_text().split():
                    return None
            except OSError:
                return None
            break
    else:
        return None
    probe = base / f"pickaxe-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return None
    try:
        (probe / "pids.max").write_text("4")
        return str(base)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


class _CgroupPool:
    """Empty pids cgroups kept for reuse: making and removing one costs ~15 ms of kernel time (RCU) per call."""

    def __init__(self) -> None:
        self.free: list[str] = []
        self.made: set[str] = set()
        self.lock = threading.Lock()
        self.counter = 0
        self.registered = False

    def take(self, base: str) -> str:
        with self.lock:
            if self.free:
                return self.free.pop()
            self.counter += 1
            path = os.path.join(base, f"pickaxe-sandbox-{os.getpid()}-{self.counter}")
            if not self.registered:
                atexit.register(self.remove_all)
                self.registered = True
            self.made.add(path)
        os.mkdir(path)
        return path

    def give_back(self, path: str) -> None:
        """Reuse it if empty; otherwise kill what is left and remove it in the background."""
        try:  # pids.current also counts exited processes nobody has reaped yet, which cgroup.procs omits
            empty = not Path(path, "cgroup.procs").read_text().split()
            empty = empty and Path(path, "pids.current").read_text().strip() == "0"
        except OSError:
            empty = False
        if empty:
            with self.lock:
                self.free.append(path)
            return
        threading.Thread(target=self._remove, args=(path,), daemon=True).start()

    def _remove(self, path: str) -> None:
        if _remove_cgroup(path):
            with self.lock:
                self.made.discard(path)

    def remove_all(self) -> None:
        with self.lock:
            paths, self.made, self.free = list(self.made), set(), []
        for path in paths:
            _remove_cgroup(path, tries=20)


_cgroups = _CgroupPool()


class ProcessSandbox:
    """The default ``Executor``: a fresh ``python -I -S`` process per call (see the module docstring).

    ``python``: the interpreter to run (the sandbox sees only its standard library: ``-S`` skips site-packages).
    ``audit_hook``: the in-process second layer; turn it off only to test the kernel layers on their own.
    """

    def __init__(self, python: str = sys.executable, *, audit_hook: bool = True) -> None:
        self.python = python
        self.audit_hook = audit_hook

    @property
    def isolation(self) -> dict[str, bool]:
        """Which layers are active on this machine (probed once per process and interpreter)."""
        layers = _probe(self.python)
        return {
            "process": True,
            "rlimits": True,
            "user_namespace": layers.userns,
            "network_namespace": layers.userns,
            "pid_namespace": layers.pidns,
            "read_only_filesystem": layers.mountns,
            "private_proc": layers.private_proc,
            "capabilities_dropped": layers.caps_dropped,
            "fork_limit": layers.nproc or layers.cgroup_base is not None,
            "pids_cgroup": layers.cgroup_base is not None and not layers.nproc,
            "audit_hook": self.audit_hook,
        }

    def run(self, code: str, limits: SandboxLimits) -> SandboxResult:
        """Run ``code`` under ``limits``; never raises for anything the code does (``sandbox_error`` if it cannot
        start)."""
        start = time.monotonic()
        try:
            return self._run(code, limits, _probe(self.python), start)
        except Exception as e:  # the sandbox's own failure, never the code's
            return SandboxResult("", "", None, "sandbox_error", time.monotonic() - start, False, _note_error(e))

    def _run(self, code: str, limits: SandboxLimits, layers: _Layers, start: float) -> SandboxResult:
        workdir = tempfile.mkdtemp(prefix="pickaxe-sandbox-")
        cgroup = None
        proc: subprocess.Popen[bytes] | None = None
        status_r, status_w = os.pipe()
        try:
            if layers.cgroup_base is not None and not layers.nproc:
                # only where RLIMIT_NPROC does not hold (root): joining a v1 cgroup costs ~20 ms (RCU sync)
                cgroup = _cgroups.take(layers.cgroup_base)
                # +1: the relay process outside the PID namespace is in the cgroup too
                Path(cgroup, "pids.max").write_text(str(limits.processes + (1 if layers.pidns else 0)))
            cfg = {
                "status_fd": status_w,
                "dir": workdir,
                "cgroup": cgroup,
                "userns": layers.userns,
                "pidns": layers.pidns,
                "mountns": layers.mountns,
                "nproc": True,
                "processes": limits.processes,
                "cpu_s": max(1, math.ceil(limits.cpu_s)),
                "memory": limits.memory_mb * 2**20,
                "fsize": limits.file_mb * 2**20,
                "hook": self.audit_hook,
                "probe": False,
            }
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-c", _BOOTSTRAP, repr(cfg)],
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
            out, err, timed_out, exit_status = _communicate(proc, code, limits, start)
            duration = time.monotonic() - start
            reports = _read_reports(status_r)
            return _result(out, err, timed_out, exit_status, reports, limits, duration)
        finally:
            if proc is not None:
                _kill_group(proc)
            if cgroup is not None:
                _cgroups.give_back(cgroup)
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


def _communicate(
    proc: subprocess.Popen[bytes], code: str, limits: SandboxLimits, start: float
) -> tuple[_Capped, _Capped, bool, int | None]:
    """Feed the code, read both pipes with a cap until they close or the wall limit; returns the wait status."""
    cap = limits.output_chars * 4 + 4  # bytes; cut to characters after decoding
    out, err = _Capped(cap, head=True), _Capped(cap, head=False)
    deadline = start + limits.wall_s
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    writer = threading.Thread(target=_feed, args=(proc.stdin, code.encode("utf-8", "surrogateescape")), daemon=True)
    writer.start()
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for pipe, sink in ((proc.stdout, out), (proc.stderr, err)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, sink)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
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
        while not timed_out:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                exit_status = status
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if pidfd >= 0:  # wakes the moment the process exits
                select.select([pidfd], [], [], remaining)
            else:
                time.sleep(0.005)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    if timed_out:
        _kill_group(proc)
        _, exit_status = os.waitpid(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(exit_status)
    writer.join(timeout=1)
    return out, err, timed_out, exit_status


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


def _result(
    out: _Capped,
    err: _Capped,
    timed_out: bool,
    exit_status: int | None,
    reports: list[dict[str, Any]],
    limits: SandboxLimits,
    duration: float,
) -> SandboxResult:
    stdout, cut_out = _decode(out, limits.output_chars)
    stderr, cut_err = _decode(err, limits.output_chars)
    truncated = cut_out or cut_err
    code = None if exit_status is None else os.waitstatus_to_exitcode(exit_status)
    kinds = {r.get("kind"): r for r in reports}
    signum = -code if code is not None and code < 0 else None
    exc_type = kinds.get("exception", {}).get("type")

    def done(status: str, detail: str) -> SandboxResult:
        return SandboxResult(stdout, stderr, code, status, duration, truncated, detail)

    if "setup_failed" in kinds:
        return done("sandbox_error", f"[sandbox error: {kinds['setup_failed'].get('reason', '?')}]")
    if timed_out:
        return done("timeout", f"[killed: wall time limit {limits.wall_s:g}s]")
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and _cpu_limit_hit(limits, duration)):
        return done("cpu_limit", f"[killed: CPU time limit {math.ceil(limits.cpu_s)}s]")
    if exc_type == "MemoryError" or "MemoryError" in stderr[-500:] or "Cannot allocate memory" in stderr[-500:]:
        return done("memory_limit", f"[stopped: memory limit {limits.memory_mb} MB]")
    if "blocked" in kinds:
        return done("blocked", f"[blocked by the sandbox: {kinds['blocked'].get('what', '?')}]")
    if signum == signal.SIGXFSZ:
        return done("error", f"[killed: file size limit {limits.file_mb} MB]")
    if code == 0:
        return done("ok", "")
    if signum is not None:
        return done("error", f"[killed by signal {signal.Signals(signum).name}]")
    if code == 70 and "setup_failed" in kinds:  # pragma: no cover - handled above
        return done("sandbox_error", "[sandbox error]")
    return done("error", f"[exit code {code}]")


def _cpu_limit_hit(limits: SandboxLimits, duration: float) -> bool:
    # SIGKILL comes at the CPU limit (soft = hard); a single-threaded process cannot use more CPU than wall time.
    return duration >= math.ceil(limits.cpu_s)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _remove_cgroup(path: str, tries: int = 200) -> bool:
    """Kill what is left in the cgroup and remove it; True when it is gone."""
    procs = Path(path, "cgroup.procs")
    for _ in range(tries):
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:  # stragglers that left the process group (setsid) still sit in the cgroup
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY:
                return True  # nothing more this code can do about it
        if tries > 1:
            time.sleep(0.01)
    return False


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
def _probe(python: str) -> _Layers:
    """Find which layers work here by running the bootstrap in probe mode: all namespaces, then fewer."""
    cgroup_base = _pids_cgroup_base()
    attempts = [(True, True, True), (True, True, False), (True, False, False), (False, False, False)]
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
                cgroup_base,
                reason,
            )
        reason = reason or str(info.get("reason", ""))
    return _Layers(False, False, False, False, False, False, cgroup_base, reason)


def _probe_once(python: str, userns: bool, pidns: bool, mountns: bool) -> tuple[bool, dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="pickaxe-sandbox-probe-")
    status_r, status_w = os.pipe()
    try:
        cfg = {
            "status_fd": status_w, "dir": workdir, "cgroup": None, "userns": userns, "pidns": pidns,
            "mountns": mountns, "nproc": False, "processes": 4, "cpu_s": 5, "memory": 512 * 2**20,
            "fsize": 2**20, "hook": True, "probe": True,
        }  # fmt: skip
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", _BOOTSTRAP, repr(cfg)],
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
