"""Cgroups for the process sandbox: a pids limit and a memory limit over every process of one call.

``find_bases()`` finds, once per process, the folders of this process's own cgroups in which it may make children
with a ``pids`` or a ``memory`` controller (cgroup v1 hierarchies, or a cgroup v2 tree whose
``cgroup.subtree_control`` already enables the controller). ``CGROUPS.take`` hands out a child (one folder per
hierarchy) for one call and ``give_back`` keeps empty ones for reuse: making and removing a cgroup costs ~15 ms of
kernel time (RCU) each. The sandbox's bootstrap joins the folders (``cgroup.procs``) before it drops privileges.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CgroupBases:
    """Folders where this process may make child cgroups: ``pids`` and ``memory`` (None where it may not);
    ``memory_v2``: the memory folder is cgroup v2 (``memory.max``) rather than v1 (``memory.limit_in_bytes``)."""

    pids: str | None
    memory: str | None
    memory_v2: bool


@dataclass(frozen=True)
class CallCgroups:
    """The child cgroups of one call: ``dirs`` (each joined by the sandboxed process), and which of them holds the
    pids and the memory limit."""

    dirs: tuple[str, ...]
    pids: str | None
    memory: str | None
    memory_v2: bool

    def set_limits(self, processes: int | None, memory_bytes: int | None) -> None:
        """Write ``pids.max`` and the memory limit (no swap beyond it) before the call joins."""
        if self.pids is not None and processes is not None:
            Path(self.pids, "pids.max").write_text(str(processes))
        if self.memory is None or memory_bytes is None:
            return
        if self.memory_v2:
            Path(self.memory, "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # absent where the kernel has no swap accounting
                Path(self.memory, "memory.swap.max").write_text("0")
            return
        # v1: memory+swap (memsw) must stay >= memory at every step, so the order depends on the direction
        limit, memsw = Path(self.memory, "memory.limit_in_bytes"), Path(self.memory, "memory.memsw.limit_in_bytes")
        try:
            limit.write_text(str(memory_bytes))
        except OSError:  # raising it above the old memsw limit: raise memsw first
            memsw.write_text(str(memory_bytes))
            limit.write_text(str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # absent without swap accounting
            memsw.write_text(str(memory_bytes))

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed in this cgroup so far (0 without one)."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.memory_v2 else "memory.oom_control"
        try:
            for line in Path(self.memory, name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0


def _own_cgroup_dir(controller: str) -> tuple[Path, bool] | None:
    """This process's cgroup folder in the hierarchy that has ``controller``, and whether it is cgroup v2."""
    try:
        own = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return None
    for fields in mounts:
        sep = fields.index("-")
        fstype, options, root, point = fields[sep + 1], fields[sep + 3].split(","), fields[3], fields[4]
        if fstype == "cgroup" and controller in options:
            wanted = [path for _, names, path in own if controller in names.split(",")]
            v2 = False
        elif fstype == "cgroup2":
            wanted = [path for _, names, path in own if names == ""]
            v2 = True
            try:
                if controller not in (Path(point) / "cgroup.controllers").read_text().split():
                    continue
            except OSError:
                continue
        else:
            continue
        if not wanted or not (wanted[0] + "/").startswith(root.rstrip("/") + "/"):
            continue
        folder = Path(point) / wanted[0][len(root.rstrip("/")) :].lstrip("/")
        if v2:  # children get the controller only where this folder enables it for them
            try:
                if controller not in (folder / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        return folder, v2
    return None


def _usable(folder: Path, limit_file: str, value: str) -> bool:
    """Whether a child cgroup can be made in ``folder`` and given a limit."""
    probe = folder / f"pickaxe-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / limit_file).write_text(value)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def find_bases() -> CgroupBases:
    """The folders where this process may make pids and memory cgroups (see the module docstring)."""
    pids = _own_cgroup_dir("pids")
    memory = _own_cgroup_dir("memory")
    pids_base = str(pids[0]) if pids and _usable(pids[0], "pids.max", "4") else None
    memory_base = None
    if memory is not None:
        limit_file = "memory.max" if memory[1] else "memory.limit_in_bytes"
        memory_base = str(memory[0]) if _usable(memory[0], limit_file, str(64 * 2**20)) else None
    return CgroupBases(pids_base, memory_base, bool(memory and memory[1]))


class CgroupPool:
    """Empty call cgroups kept for reuse, by which controllers they carry."""

    def __init__(self) -> None:
        self.free: dict[tuple[str | None, str | None], list[CallCgroups]] = {}
        self.made: set[str] = set()
        self.lock = threading.Lock()
        self.counter = 0
        self.registered = False

    def take(self, bases: CgroupBases, pids: bool, memory: bool) -> CallCgroups:
        """Child cgroups with a pids controller (if ``pids``) and a memory controller (if ``memory``)."""
        key = (bases.pids if pids else None, bases.memory if memory else None)
        with self.lock:
            if self.free.get(key):
                return self.free[key].pop()
            self.counter += 1
            name = f"pickaxe-sandbox-{os.getpid()}-{self.counter}"
            if not self.registered:
                atexit.register(self.remove_all)
                self.registered = True
        folders = {base: os.path.join(base, name) for base in key if base is not None}
        for folder in folders.values():
            with self.lock:
                self.made.add(folder)
            os.mkdir(folder)
        return CallCgroups(
            tuple(folders.values()),
            folders.get(key[0]) if key[0] else None,
            folders.get(key[1]) if key[1] else None,
            bases.memory_v2,
        )

    def give_back(self, cgroups: CallCgroups) -> None:
        """Reuse them if empty; otherwise kill what is left and remove them in the background."""
        try:  # pids.current also counts exited processes nobody has reaped yet, which cgroup.procs omits
            empty = all(not Path(d, "cgroup.procs").read_text().split() for d in cgroups.dirs)
            if empty and cgroups.pids is not None:
                empty = Path(cgroups.pids, "pids.current").read_text().strip() == "0"
        except OSError:
            empty = False
        if empty:
            key = (os.path.dirname(cgroups.pids) if cgroups.pids else None,
                   os.path.dirname(cgroups.memory) if cgroups.memory else None)  # fmt: skip
            with self.lock:
                self.free.setdefault(key, []).append(cgroups)
            return
        threading.Thread(target=self._remove, args=(cgroups.dirs,), daemon=True).start()

    def _remove(self, dirs: tuple[str, ...]) -> None:
        for path in dirs:
            if remove_cgroup(path):
                with self.lock:
                    self.made.discard(path)

    def remove_all(self) -> None:
        """Remove every cgroup this pool made (at exit)."""
        with self.lock:
            paths, self.made, self.free = list(self.made), set(), {}
        for path in paths:
            remove_cgroup(path, tries=20)


CGROUPS = CgroupPool()


def remove_cgroup(path: str, tries: int = 200) -> bool:
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
