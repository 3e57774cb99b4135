"""The agents' Python sandbox: hostile code is stopped with the right status, leaves nothing behind (no files
outside its folder, no temp folder, no process), and the next ordinary call still works."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pickaxe.envs.agents.sandbox import ProcessSandbox, SandboxLimits, SandboxResult

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the process sandbox is Linux-only")

# wall_s: a safety limit for code that must end on its own, generous for a loaded machine (no test here is about it)
FAST = SandboxLimits(cpu_s=1, memory_mb=128, wall_s=60, output_chars=500, processes=8, file_mb=1)


# A test's sandboxes make their folders under a folder of the test's own (``tempfile.tempdir`` is pointed there), and
# the bootstrap's command line names that folder; forked children keep the command line. So a process is this
# test's exactly when its command line names the test's folder: no other program's sandbox (another test run, a
# user's training with the python tool) ever matches, and a child that left its process group or session still does.
SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
PF_EXITING = 0x4  # include/linux/sched.h: the process has started to exit


def _own_processes(root: Path) -> dict[int, dict[str, Any]]:
    """This test's sandbox processes (their command line names ``root``), not yet reaped: ``pid -> facts`` with
    ``state`` (Z: a zombie), ``flags`` (of /proc/PID/stat), ``pending`` (SigPnd | ShdPnd), ``pidns`` and ``nspid`` (its
    PID inside its own PID namespace)."""
    marker = str(root).encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in Path(entry.path, "cmdline").read_bytes():
                continue
            stat = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(
                line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines() if ":" in line
            )
        except OSError:  # gone meanwhile
            continue
        try:
            pidns: str | None = os.readlink(Path(entry.path, "ns", "pid"))
        except OSError:  # not ours to inspect this way: judged by its own state alone
            pidns = None
        pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
        found[int(entry.name)] = {
            "state": stat[0],
            "flags": int(stat[6]),
            "pending": pending,
            "pidns": pidns,
            "nspid": status.get("NSpid", "").split()[-1:],
        }
    return found


def _doomed(facts: dict[str, Any]) -> bool:
    """The process is dead (a zombie) or already on its way out: exiting, or a SIGKILL is pending."""
    return facts["state"] in ("Z", "X") or bool(facts["flags"] & PF_EXITING) or bool(facts["pending"] & SIGKILL_BIT)


def _survivors(procs: dict[int, dict[str, Any]]) -> list[int]:
    """Processes nothing is killing: neither doomed themselves nor in a PID namespace whose first process (its PID
    1, whose end makes the kernel kill the rest of the namespace) is doomed."""
    dying_namespaces = {f["pidns"] for f in procs.values() if f["nspid"] == ["1"] and _doomed(f)} - {None}
    return [pid for pid, f in procs.items() if not _doomed(f) and f["pidns"] not in dying_namespaces]


def _kill_own(root: Path, pids: list[int]) -> None:
    """SIGKILL these processes, each only if it is still one of this test's (a pidfd pins the process checked)."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if str(root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


@pytest.fixture(scope="module")
def sandbox() -> ProcessSandbox:
    return ProcessSandbox()


@pytest.fixture
def sandbox_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder this test's sandboxes make their temporary folders in (``tempfile.tempdir``)."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def clean(sandbox: ProcessSandbox, sandbox_root: Path):
    """Each test: when its runs have returned, every process they started is gone or already being killed by the
    kernel, their folders are removed, and an ordinary call right after still works. Only this test's own
    processes are looked at or signalled."""
    yield
    left = _survivors(_own_processes(sandbox_root))
    _kill_own(sandbox_root, left)  # never leave a runaway behind for the rest of the suite
    deadline = time.monotonic() + 60  # a safety net for the killed ones to finish dying, not the property tested
    while (lingering := [p for p, f in _own_processes(sandbox_root).items() if f["state"] != "Z"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not left, f"sandbox processes survived, nothing was killing them: {left}"
    assert not lingering, f"sandbox processes still dying after 60 s: {lingering}"
    assert not list(sandbox_root.iterdir()), "the sandbox's temporary folder was not removed"
    after = sandbox.run("print(6 * 7)", FAST)
    assert (after.status, after.stdout) == ("ok", "42\n"), after
    assert not list(sandbox_root.iterdir()), "the sandbox's temporary folder was not removed"


def _run(sandbox: ProcessSandbox, code: str, limits: SandboxLimits = FAST) -> SandboxResult:
    result = sandbox.run(code, limits)
    assert isinstance(result, SandboxResult)
    return result


def _need(sandbox: ProcessSandbox, layer: str) -> None:
    if not sandbox.isolation[layer]:
        pytest.skip(f"{layer} is not available on this machine (see ProcessSandbox.isolation)")


# ------------------------------------------------------------------------------------------------- ordinary code


def test_ordinary_code_runs_and_can_use_its_own_folder(sandbox: ProcessSandbox, clean: None) -> None:
    code = (
        "import json, math\n"
        "with open('data.json', 'w') as f:\n"
        "    json.dump({'pi': round(math.pi, 5), 'fact': math.factorial(20)}, f)\n"
        "with open('data.json') as f:\n"
        "    print(json.load(f))\n"
    )
    result = _run(sandbox, code)
    assert result.status == "ok", result.text()
    assert result.stdout == "{'pi': 3.14159, 'fact': 2432902008176640000}\n"
    assert result.exit_code == 0 and not result.truncated
    assert result.text() == "{'pi': 3.14159, 'fact': 2432902008176640000}"


def test_errors_show_the_users_traceback_not_the_sandboxs(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "x = 1\ny = x / 0\n")
    assert result.status == "error" and result.exit_code == 1
    text = result.text()
    assert 'File "<code>", line 2' in text and "y = x / 0" in text
    assert text.splitlines()[-2:] == ["ZeroDivisionError: division by zero", "[exit code 1]"]
    assert "<string>" not in text  # the bootstrap's frames are hidden
    assert _run(sandbox, "import sys; sys.exit(3)").exit_code == 3


def test_the_leak_check_finds_a_live_run_and_nothing_after_it(
    sandbox: ProcessSandbox, clean: None, sandbox_root: Path
) -> None:
    """What ``clean`` relies on: while a run is live, its processes are found by this test's folder and count as
    survivors (nothing is killing them yet); once the run has returned, none is left and its folder is gone."""
    assert sandbox.isolation["process"]  # probe first: the probe's own process and folder are not the run's
    go = sandbox_root.parent / "go"  # outside the run's folder, which may be a tmpfs only the run sees
    code = f"import os, time\nprint('up', flush=True)\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.01)\n"
    results: list[SandboxResult] = []
    run = threading.Thread(target=lambda: results.append(sandbox.run(code, SandboxLimits(wall_s=300))))
    run.start()
    try:
        deadline = time.monotonic() + 60  # a safety net, not the property tested
        while not (live := _survivors(_own_processes(sandbox_root))) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live, "the running sandbox's processes were not found"
    finally:
        go.touch()
        run.join(timeout=300)
    assert [(r.status, r.stdout) for r in results] == [("ok", "up\n")], results
    assert not _own_processes(sandbox_root) and not list(sandbox_root.iterdir())


def test_isolation_reports_the_layers(sandbox: ProcessSandbox) -> None:
    layers = sandbox.isolation
    assert layers["process"] and layers["rlimits"] and layers["audit_hook"]
    assert set(layers) >= {"user_namespace", "network_namespace", "pid_namespace", "fork_limit"}
    assert ProcessSandbox(audit_hook=False).isolation["audit_hook"] is False
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0:
        assert layers["user_namespace"] and layers["network_namespace"]


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match=r"SandboxLimits.wall_s must be a number > 0"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ValueError, match=r"SandboxLimits.memory_mb must be a whole number"):
        SandboxLimits(memory_mb=1.5)


def test_sandbox_that_cannot_start_is_a_sandbox_error(clean: None) -> None:
    result = ProcessSandbox(python="/nonexistent/python").run("print(1)", FAST)
    assert result.status == "sandbox_error"
    assert "sandbox error" in result.text()


# ------------------------------------------------------------------------------------------------------- network


@pytest.mark.parametrize("address", ["127.0.0.1", "1.1.1.1"])
def test_network_is_blocked(sandbox: ProcessSandbox, clean: None, address: str) -> None:
    code = f"import socket\ns = socket.create_connection(({address!r}, 80), timeout=1)\nprint('connected')"
    result = _run(sandbox, code)
    assert result.status == "blocked", result.text()
    assert "connected" not in result.stdout
    assert result.text().endswith("[blocked by the sandbox: network access]")


@pytest.mark.parametrize("address", ["127.0.0.1", "1.1.1.1"])
def test_network_namespace_alone_has_no_route(clean: None, address: str) -> None:
    bare = ProcessSandbox(audit_hook=False)
    _need(bare, "network_namespace")
    code = f"import socket\ns = socket.create_connection(({address!r}, 80), timeout=1)\nprint('connected')"
    result = _run(bare, code)
    assert result.status == "error" and "connected" not in result.stdout
    assert "Network is unreachable" in result.stderr


# --------------------------------------------------------------------------------------------------- processes


def test_fork_bomb_is_blocked(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "import os\nwhile True:\n    os.fork()\n")
    assert result.status == "blocked"
    assert result.text().endswith("[blocked by the sandbox: starting processes]")
    assert _run(sandbox, "import subprocess; subprocess.run(['true'])").status == "blocked"
    assert _run(sandbox, "import _posixsubprocess as p; p.fork_exec()").status == "blocked"


def test_fork_bomb_without_the_audit_hook_is_stopped_by_the_kernel(clean: None) -> None:
    bare = ProcessSandbox(audit_hook=False)
    _need(bare, "fork_limit")
    # Every process forks until the limit: then fork fails and each exits with the error.
    result = _run(bare, "import os\nwhile True:\n    os.fork()\n")
    assert result.status == "error", result.text()
    assert "Resource temporarily unavailable" in result.stderr
    # A bomb that survives its failed forks holds at most `processes` processes until the wall limit kills all.
    spin = (
        "import os, time\n"
        "n = 0\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    limits = SandboxLimits(cpu_s=1, memory_mb=128, wall_s=1.5, processes=8)
    result = _run(bare, spin, limits)
    assert result.status == "timeout" and result.exit_code == -signal.SIGKILL, result.text()


def test_other_processes_cannot_be_signalled(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    assert result.status == "blocked"


def test_host_processes_are_invisible(clean: None) -> None:
    sandbox = ProcessSandbox()
    _need(sandbox, "private_proc")
    result = _run(sandbox, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert result.stdout == "[1]\n", result.text()  # its own PID namespace's /proc: only itself


# -------------------------------------------------------------------------------------------------------- limits


def test_memory_limit(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "x = bytearray(512 * 2**20)\nprint('allocated')")
    assert result.status == "memory_limit", result.text()
    assert "allocated" not in result.stdout
    assert result.text().endswith("[stopped: memory limit 128 MB]")


@pytest.mark.parametrize("wait", ["time.sleep(3600)", "while True:\n    pass"])
def test_wall_limit(sandbox: ProcessSandbox, clean: None, wait: str) -> None:
    """The wall limit kills a program that would otherwise run on: asleep for an hour (it would end with status 0)
    or spinning (the CPU limit, 5 s, would end it with cpu_limit)."""
    limits = SandboxLimits(cpu_s=5, memory_mb=128, wall_s=1)
    result = _run(sandbox, f"import time\nprint('started', flush=True)\n{wait}", limits)
    assert result.status == "timeout" and result.exit_code == -signal.SIGKILL, result.text()
    assert result.text() == "started\n[killed: wall time limit 1s]"


def test_cpu_limit(sandbox: ProcessSandbox, clean: None) -> None:
    """A spinning program is stopped by its CPU limit, however slowly a loaded machine lets it use its second: it
    reports its own CPU time as it goes, and the last report is just short of the limit (not past it, and not far
    before it, as when some other limit stops it first). The wall limit is only a safety net here."""
    limits = SandboxLimits(cpu_s=1, memory_mb=128, wall_s=300)
    code = (
        "import time\n"
        "mark = 0.0\n"
        "while True:\n"
        "    used = time.process_time()\n"
        "    if used >= mark:\n"
        "        print(f'{used:.3f}', flush=True)\n"
        "        mark = used + 0.02\n"
    )
    result = _run(sandbox, code, limits)
    assert result.status == "cpu_limit", result.text()
    assert result.text().endswith("[killed: CPU time limit 1s]")
    assert 0.8 <= float(result.stdout.split()[-1]) <= 1.05, result.stdout


def test_output_is_capped(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "import sys\nsys.stdout.write('x' * 10**7)\nsys.stderr.write('e' * 10**6 + 'END')")
    assert result.status == "ok" and result.truncated
    assert result.stdout.startswith("x" * 500)
    assert len(result.stdout) < 600 and "output truncated" in result.stdout
    assert len(result.stderr) < 600 and result.stderr.endswith("END")


# ------------------------------------------------------------------------------------------------------- writing


def test_writing_outside_its_folder_is_blocked(sandbox: ProcessSandbox, clean: None, tmp_path: Path) -> None:
    # a name no one else uses in the home folder; removed should the sandbox fail and write it
    home_target = Path.home() / f"pickaxe-sandbox-test-{os.getpid()}-{tmp_path.name}.txt"
    for target in (tmp_path / "owned.txt", home_target):
        try:
            result = _run(sandbox, f"open({str(target)!r}, 'w').write('pwned')")
            assert result.status == "blocked", result.text()
            assert "writing outside its folder" in result.text()
            assert not target.exists()
        finally:
            if target == home_target:
                target.unlink(missing_ok=True)
    result = _run(sandbox, f"import os\nos.mkdir({str(tmp_path / 'made')!r})")
    assert result.status == "blocked" and not (tmp_path / "made").exists()


def test_read_only_filesystem_without_the_audit_hook(clean: None, tmp_path: Path) -> None:
    bare = ProcessSandbox(audit_hook=False)
    _need(bare, "read_only_filesystem")
    target = tmp_path / "owned.txt"
    result = _run(bare, f"open({str(target)!r}, 'w').write('pwned')")
    assert result.status == "error" and "Read-only file system" in result.stderr
    assert not target.exists()
    assert _run(bare, "open('mine.txt', 'w').write('ok'); print(open('mine.txt').read())").stdout == "ok\n"


def test_file_size_limit(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "with open('big', 'wb') as f:\n    f.write(b'x' * 2 * 2**20)\n")
    assert result.status == "error", result.text()
    assert "File too large" in result.stderr
