"""The agents' Python sandbox: hostile code is stopped with the right status, leaves nothing behind (no files
outside its folder, no temp folder, no process), and the next ordinary call still works."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pickaxe.envs.agents.sandbox import ProcessSandbox, SandboxLimits, SandboxResult

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the process sandbox is Linux-only")

FAST = SandboxLimits(cpu_s=1, memory_mb=128, wall_s=3, output_chars=500, processes=8, file_mb=1)


def _sandbox_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("pickaxe-sandbox-*")}


def _sandbox_processes() -> list[int]:
    """PIDs of live processes running the sandbox's bootstrap (zombies excluded)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"-I" in cmdline and b"-S" in cmdline and any(b"status_fd" in a for a in cmdline):
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def sandbox() -> ProcessSandbox:
    return ProcessSandbox()


@pytest.fixture
def clean(sandbox: ProcessSandbox):
    """Each test: no sandbox folder or process left afterwards, and an ordinary call right after still works."""
    before = _sandbox_dirs()
    yield
    deadline = time.monotonic() + 2
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _sandbox_processes()
    for pid in left:  # never leave a runaway behind for the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"sandbox processes survived: {left}"
    assert _sandbox_dirs() <= before, "the sandbox's temporary folder was not removed"
    after = sandbox.run("print(6 * 7)", FAST)
    assert (after.status, after.stdout) == ("ok", "42\n"), after


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
    start = time.monotonic()
    result = _run(bare, spin, limits)
    assert result.status == "timeout" and time.monotonic() - start < 4


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


@pytest.mark.parametrize("wait", ["time.sleep(30)", "while True:\n    pass"])
def test_wall_limit(sandbox: ProcessSandbox, clean: None, wait: str) -> None:
    limits = SandboxLimits(cpu_s=5, memory_mb=128, wall_s=1)
    start = time.monotonic()
    result = _run(sandbox, f"import time\nprint('started', flush=True)\n{wait}", limits)
    assert time.monotonic() - start < 2.5
    assert result.status == "timeout" and result.exit_code == -signal.SIGKILL
    assert result.text() == "started\n[killed: wall time limit 1s]"


def test_cpu_limit(sandbox: ProcessSandbox, clean: None) -> None:
    limits = SandboxLimits(cpu_s=1, memory_mb=128, wall_s=4)
    result = _run(sandbox, "while True:\n    pass\n", limits)
    assert result.status == "cpu_limit", result.text()
    assert result.text().endswith("[killed: CPU time limit 1s]")
    assert result.duration_s < 3.5


def test_output_is_capped(sandbox: ProcessSandbox, clean: None) -> None:
    result = _run(sandbox, "import sys\nsys.stdout.write('x' * 10**7)\nsys.stderr.write('e' * 10**6 + 'END')")
    assert result.status == "ok" and result.truncated
    assert result.stdout.startswith("x" * 500)
    assert len(result.stdout) < 600 and "output truncated" in result.stdout
    assert len(result.stderr) < 600 and result.stderr.endswith("END")


# ------------------------------------------------------------------------------------------------------- writing


def test_writing_outside_its_folder_is_blocked(sandbox: ProcessSandbox, clean: None, tmp_path: Path) -> None:
    for target in (tmp_path / "owned.txt", Path.home() / "pickaxe-sandbox-test.txt"):
        result = _run(sandbox, f"open({str(target)!r}, 'w').write('pwned')")
        assert result.status == "blocked", result.text()
        assert "writing outside its folder" in result.text()
        assert not target.exists()
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
