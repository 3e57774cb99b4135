"""The sandbox's limits hold for all a program holds, not per process or per file: memory it keeps outside its
address space (memfd), the total it writes into its folder, and the verdict itself, which nothing the program
writes can change. Each test runs the fallback too (no cgroups, no namespaces) where it applies."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pickaxe.envs.agents.sandbox import ProcessSandbox, SandboxLimits, SandboxResult
from pickaxe.envs.agents.sandbox_cgroups import CallCgroups

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the process sandbox is Linux-only")

# Small sizes: the machine is shared. 64 MB of memory, a 4 MB folder; 8 MB files so that RLIMIT_FSIZE is not
# what stops the programs below.
LIMITS = SandboxLimits(cpu_s=4, memory_mb=64, wall_s=10, output_chars=2000, processes=8, file_mb=8, disk_mb=4)

# 200 MB in 25 memfds of 8 MB: each under file_mb, none of it in the address space RLIMIT_AS counts.
MEMFD = """
import os
fds = []
for i in range(25):
    fd = os.memfd_create("x")
    for j in range(8):
        os.write(fd, b"x" * 2**20)
    fds.append(fd)
print("held", sum(os.fstat(fd).st_size for fd in fds) // 2**20, "MB")
"""


@pytest.fixture(autouse=True)
def own_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The sandbox's folders go into this test's own temporary folder, which must be empty afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    assert not list(tmp_path.iterdir()), "the sandbox's folder was not removed"


def _run(sandbox: ProcessSandbox, code: str, limits: SandboxLimits = LIMITS) -> SandboxResult:
    result = sandbox.run(code, limits)
    assert result.status != "sandbox_error", result.text()
    return result


# -------------------------------------------------------------------------------------------------------- memory


def test_memfd_beyond_the_memory_limit_is_stopped() -> None:
    sandbox = ProcessSandbox()
    layers = sandbox.isolation
    result = _run(sandbox, MEMFD)
    assert "held" not in result.stdout, result.text()
    if layers["memory_cgroup"]:  # the cgroup counts memfd pages: the program is killed at 64 MB in all
        assert result.status == "memory_limit", result.text()
        assert result.text().endswith("[stopped: memory limit 64 MB]")
    else:
        assert layers["shared_memory_refused"], "no layer bounds memfd memory here"
        assert result.status == "error" and "Operation not permitted" in result.stderr, result.text()


def test_memfd_is_refused_without_a_memory_cgroup() -> None:
    sandbox = ProcessSandbox(cgroups=False)
    if not sandbox.isolation["shared_memory_refused"]:
        pytest.skip("seccomp is not available here (see ProcessSandbox.isolation)")
    result = _run(sandbox, MEMFD)
    assert result.status == "error" and "held" not in result.stdout
    assert "PermissionError: [Errno 1] Operation not permitted" in result.stderr


@pytest.mark.parametrize("v2", [True, False], ids=["cgroup-v2", "cgroup-v1"])
def test_memory_cgroup_files(tmp_path_factory: pytest.TempPathFactory, v2: bool) -> None:
    # The interface files each version uses, on a plain folder (this machine may have only one of the two).
    folder = tmp_path_factory.mktemp("cgroup")
    names = ("memory.max", "memory.swap.max") if v2 else ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    for name in names:
        (folder / name).write_text("max\n")
    counter = "memory.events" if v2 else "memory.oom_control"
    (folder / counter).write_text("low 0\noom 3\noom_kill 2\n" if v2 else "under_oom 0\noom_kill 2\n")
    cgroups = CallCgroups((str(folder),), None, str(folder), v2)
    cgroups.set_limits(8, 64 * 2**20)
    expected = ["67108864", "0"] if v2 else ["67108864", "67108864"]
    assert [(folder / name).read_text() for name in names] == expected
    assert cgroups.oom_kills() == 2
    assert CallCgroups((), None, None, v2).oom_kills() == 0


def test_memory_within_the_limit_still_works() -> None:
    result = _run(ProcessSandbox(), "import os\nfd = os.memfd_create('x')\nos.write(fd, b'x' * 2**20)\nprint('ok')")
    if ProcessSandbox().isolation["memory_cgroup"]:
        assert (result.status, result.stdout) == ("ok", "ok\n"), result.text()
    big = _run(ProcessSandbox(), "x = bytearray(16 * 2**20)\nprint(len(x) // 2**20)")
    assert (big.status, big.stdout) == ("ok", "16\n"), big.text()


# ---------------------------------------------------------------------------------------------------------- disk


def test_folder_total_is_bounded_by_a_tmpfs() -> None:
    sandbox = ProcessSandbox()
    if not sandbox.isolation["folder_tmpfs"]:
        pytest.skip("no mount namespace here: the parent's folder watch holds instead (next test)")
    # 20 files of 1 MB, each far under file_mb: the folder fills at 4 MB and the program sees "No space left".
    code = (
        "import os\n"
        "try:\n"
        "    for i in range(20):\n"
        "        with open('f%d' % i, 'wb') as f:\n"
        "            f.write(b'x' * 2**20)\n"
        "except OSError as e:\n"
        "    print(e.strerror)\n"
        "print(sum(os.path.getsize(n) for n in os.listdir('.')) // 2**20)\n"
    )
    result = _run(sandbox, code)
    assert result.status == "disk_limit", result.text()
    assert result.stdout.splitlines()[0] == "No space left on device"
    assert int(result.stdout.splitlines()[1]) <= 4
    assert result.text().endswith("[stopped: folder size limit 4 MB]")


def test_folder_total_is_bounded_by_the_watch_without_namespaces() -> None:
    # No tmpfs: the parent measures the folder and kills the program once it holds more than disk_mb.
    code = (
        "import time\n"
        "n = 0\n"
        "while True:\n"
        "    open('f%d' % n, 'wb').write(b'x' * 2**20)\n"
        "    n += 1\n"
        "    time.sleep(0.005)\n"
    )
    result = _run(ProcessSandbox(namespaces=False), code)
    assert result.status == "disk_limit", result.text()
    assert result.text().endswith("[stopped: folder size limit 4 MB]")


def test_disk_mb_is_validated() -> None:
    with pytest.raises(ValueError, match=r"SandboxLimits.disk_mb must be a number > 0"):
        SandboxLimits(disk_mb=0)


# ----------------------------------------------------------------------------------------------------- verdict

# Every line the sandbox's status pipe carries, forged, written to every descriptor the program holds.
FORGE = """
import os
lines = [dict(kind="setup_failed", reason="forged"), dict(kind="folder", full=True, tmpfs=1),
         dict(kind="blocked", what="forged"), dict(kind="exception", type="MemoryError", blocked=True)]
data = "".join(repr(line) + "\\n" for line in lines).encode()
for name in os.listdir("/proc/self/fd"):
    try:
        os.write(int(name), data)
    except OSError:
        pass
"""


@pytest.mark.parametrize("kw", [{}, {"namespaces": False}], ids=["namespaces", "no-namespaces"])
def test_a_forged_verdict_is_not_accepted(kw: dict[str, bool]) -> None:
    sandbox = ProcessSandbox(**kw)
    result = _run(sandbox, FORGE + "print('done')\n")
    assert result.status == "ok", result.text()
    assert result.stdout.endswith("done\n")
    failed = _run(sandbox, FORGE + "raise SystemExit(3)\n")
    assert (failed.status, failed.exit_code) == ("error", 3), failed.text()
    assert failed.text().endswith("[exit code 3]")


def test_a_refusal_ends_the_program() -> None:
    # Caught or not, a refused action stops the program with "blocked": it cannot probe for holes in a loop.
    code = "import socket\ntry:\n    socket.socket()\nexcept BaseException:\n    print('caught')\nprint('after')\n"
    result = _run(ProcessSandbox(), code)
    assert result.status == "blocked", result.text()
    assert "caught" not in result.stdout and "after" not in result.stdout
    assert result.text().endswith("[blocked by the sandbox: network access]")
    assert "socket.socket()" in result.text()  # the line of the user's code that did it


def test_importing_a_module_without_a_pyc_is_not_a_refusal(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A refusal is final, so the import system must not try to write a .pyc outside the folder.
    modules = tmp_path_factory.mktemp("modules")
    (modules / "h5mod.py").write_text("X = 5\n")
    code = f"import sys\nsys.path.insert(0, {str(modules)!r})\nimport h5mod\nprint(h5mod.X)\n"
    result = _run(ProcessSandbox(), code)
    assert (result.status, result.stdout) == ("ok", "5\n"), result.text()
    assert [p.name for p in modules.iterdir()] == ["h5mod.py"]
