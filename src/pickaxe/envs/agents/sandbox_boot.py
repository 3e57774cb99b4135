"""The program each sandboxed call runs first: ``python -I -S -c BOOTSTRAP CONFIG``, written by ``ProcessSandbox``.

It joins the call's cgroups, makes the namespaces, mounts, drops privileges, sets the rlimits, closes the status pipe
and installs the audit hook, then runs the model's code (read from stdin). Everything it reports on the status pipe
it writes before the model's code runs, or from a process that code cannot reach (the relay outside the PID
namespace): see docs/sandbox.md.
"""

from __future__ import annotations

# The exit status of a program the audit hook stopped; its stderr then ends with ``BLOCKED_PREFIX`` + what it tried.
BLOCKED_EXIT = 86
BLOCKED_PREFIX = "SandboxBlocked: blocked by the sandbox: "

# Order matters: the cgroups are joined while still privileged, the namespaces are made before the rlimits
# (RLIMIT_NPROC set inside a new user namespace counts only that namespace's processes), capabilities are dropped
# after the mounts, the status pipe is closed before the code is read, and the audit hook comes last.
BOOTSTRAP = r"""
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
    for cgroup in cfg["cgroups"]:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write("0")
    if cfg["userns"]:
        uid, gid = os.getuid(), os.getgid()
        flags = 0x10000000 | 0x40000000 | 0x08000000  # CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC
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
        # The relay keeps the status pipe: the code runs in the child, which closes its copy and cannot see this
        # process (another PID namespace) nor open its /proc files (it has no capabilities; this one has all).
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                pass
        if cfg["mountns"]:  # the child's tmpfs over the folder is in this mount namespace too
            try:
                st = os.statvfs(cfg["dir"])
                report("folder", full=st.f_bavail == 0 or st.f_favail == 0, tmpfs=st.f_blocks * st.f_frsize)
            except OSError:
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
        # its folder alone writable: a tmpfs of its own, whose size bounds what it can write in all
        opts = "size=%d,nr_inodes=%d,mode=0700" % (cfg["disk"], cfg["inodes"])
        check(libc.mount(b"tmpfs", cfg["dir"].encode(), b"tmpfs", 0x2 | 0x4, opts.encode()) == 0, "tmpfs")
    # Keep no way back to privilege: no_new_privs, root gets no capabilities on exec, then drop them all.
    libc.prctl(38, 1, 0, 0, 0)
    libc.prctl(28, 0x2F, 0, 0, 0)
    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    caps_dropped = libc.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()) == 0
    seccomp = False
    if cfg["seccomp"]:
        # Without a memory cgroup, refuse the memory RLIMIT_AS does not count: memfd_create, memfd_secret and
        # SysV shmget (a BPF filter: EPERM for those, and for x32 calls; everything else allowed).
        arch, nrs = {"x86_64": (0xC000003E, (319, 447, 29)), "aarch64": (0xC00000B7, (279, 447, 194))}.get(
            os.uname().machine, (0, ()))
        n = len(nrs)
        prog = [(0x20, 0, 0, 4), (0x15, 0, n + 2, arch), (0x20, 0, 0, 0), (0x35, n + 1, 0, 0x40000000)]
        prog += [(0x15, n - i, 0, nr) for i, nr in enumerate(nrs)]
        prog += [(0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050001)]
        class SockFilter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                        ("k", ctypes.c_uint32)]
        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]
        insns = (SockFilter * len(prog))(*[SockFilter(*i) for i in prog])
        seccomp = arch != 0 and libc.prctl(22, 2, ctypes.byref(SockFprog(len(prog), insns)), 0, 0) == 0
        if not seccomp and not cfg["probe"]:
            check(False, "seccomp")
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
        if seccomp:
            try:
                os.memfd_create("probe")
                seccomp = False
            except OSError:
                pass
        report("probe", caps_dropped=caps_dropped, nproc=nproc_works, proc=proc_private, seccomp=seccomp)
        os._exit(0)
    del libc, check, limits
except BaseException as e:
    report("setup_failed", reason="%s: %s" % (type(e).__name__, e))
    os._exit(70)
# Nothing the code does can write to the status pipe: this process's copy is closed before the code runs
# (and there is no other: the pipe is not inherited by anything the code starts).
os.close(sfd)
del report

import builtins

def show_traceback(tb, frame, last_line):
    # the user's frames and the library frames they called, not the sandbox's own ("<string>")
    import linecache, traceback  # only now: they cost ~10 ms of start-up
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack(frame)
    frames = [f for f in frames if f.filename != "<string>"]
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
    sys.stderr.write("".join(lines) + last_line)

def _run(code, cfg):
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
        # A refusal ends the program (it cannot be caught): its exit status and the last line of its stderr say so.
        try:
            sys.stdout.flush()
            show_traceback(None, sys._getframe(1), "%s%s\n" % (cfg["blocked_prefix"], what))
            sys.stderr.flush()
        finally:
            os._exit(cfg["blocked_exit"])

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
    try:  # shm_open raises no audit event either; /dev/shm is outside its folder (read-only with a mount namespace)
        import _posixshmem

        def no_shm_open(*args, **kwargs):
            deny("shared memory outside its folder (shm_open)")

        _posixshmem.shm_open = no_shm_open
    except ImportError:
        pass
    sys.dont_write_bytecode = True  # importing a module without a .pyc must not try to write one next to it
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
        import traceback
        show_traceback(e.__traceback__, None, "".join(traceback.format_exception_only(type(e), e)))
        exit_code = 1
    return exit_code

if cfg["hook"]:
    rc = _run(code, cfg)
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
