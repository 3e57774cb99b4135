"""``pickaxe ui``'s command line: user errors are one line and exit status 2; a non-loopback host warns."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pickaxe.ui import app as app_module
from pickaxe.ui.command import main


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def test_a_missing_runs_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing")]) == 2
    assert _error_line(capsys) == (
        f"pickaxe: error: {tmp_path / 'missing'} is not a folder; `pickaxe ui RUNS_DIR` serves the runs under RUNS_DIR"
    )


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_a_bad_port_is_one_line(tmp_path: Path, port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--port", port]) == 2
    assert _error_line(capsys) == f"pickaxe: error: --port must be >= 1 and <= 65535, got {port}"


def test_a_port_in_use_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main([str(tmp_path), "--port", str(port)]) == 2
    err = _error_line(capsys)
    assert err.startswith(f"pickaxe: error: cannot listen on 127.0.0.1:{port} (")
    assert err.endswith("); choose another port with --port")


def test_an_unknown_option_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--prot", "8000"]) == 2
    assert (
        _error_line(capsys)
        == "pickaxe: error: unknown option --prot for pickaxe ui; did you mean --port? (pickaxe ui --help)"
    )


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--port" in out and "--host" in out and "--queue-db" in out


@pytest.mark.parametrize(("host", "warns"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_serving_beyond_loopback_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], host: str, warns: bool
) -> None:
    served: dict = {}

    def run(server, sockets):  # what uvicorn would serve, on the socket serve() bound
        served.update(host=server.config.host, port=server.config.port, app=server.config.app, sockets=sockets)

    monkeypatch.setattr("uvicorn.Server.run", run)
    monkeypatch.setattr(app_module, "listen", lambda h, p: socket.socket())
    assert main([str(tmp_path), "--host", host, "--port", "8123", "--queue-db", str(tmp_path / "q.db")]) == 0
    assert (served["host"], served["port"]) == (host, 8123) and len(served["sockets"]) == 1
    assert served["app"].state.queue_db == tmp_path / "q.db"
    err = capsys.readouterr().err
    warning = f"pickaxe ui: warning: serving on {host}, reachable from other machines; the app has no authentication"
    assert (warning in err) is warns
    assert f"pickaxe ui: http://{host}:8123/" in err
    from fastapi.testclient import TestClient

    client = TestClient(served["app"], base_url="http://127.0.0.1:8123")
    assert client.get("/api/runs").status_code == 200
    # on loopback, a page reaching the app under another name (DNS rebinding) is refused
    r = client.get("/api/runs", headers={"host": "evil.example:8123"})
    assert r.status_code == (400 if host == "127.0.0.1" else 200)
    assert client.get("/api/runs", headers={"host": "localhost:8123"}).status_code == 200


def test_the_app_starts_without_importing_torch() -> None:
    # torch (seconds to import) loads on the first playground generation, not when `pickaxe ui` starts
    code = (
        "import sys; import pickaxe.ui.app; from pickaxe.ui import arena, checkpoints, playground, queue, runs; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _start_ui(runs: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pickaxe.cli", "ui", str(runs), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _get_runs(port: int, proc: subprocess.Popen[str]) -> socket.socket:
    """A connection to the ``pickaxe ui`` of ``proc`` that has had one answer and stays open (keep-alive); fails when
    the process exits first (e.g. it could not listen)."""
    deadline = time.monotonic() + 120  # the start imports FastAPI; generous on a loaded machine
    while True:
        if proc.poll() is not None:
            pytest.fail(f"pickaxe ui exited {proc.returncode}: {proc.communicate()[1].strip()}")
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail("pickaxe ui did not listen within 120 s")
            time.sleep(0.1)
    conn.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert conn.recv(65536).startswith(b"HTTP/1.1 200")
    return conn


def test_a_killed_ui_can_listen_on_its_port_again_at_once(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = _start_ui(tmp_path, port)
    try:
        conn = _get_runs(port, first)
        first.kill()  # SIGKILL: no shutdown; the open connection is left to the kernel (FIN_WAIT / TIME_WAIT)
        first.wait(timeout=30)
        conn.close()
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    second = _start_ui(tmp_path, port)
    try:
        _get_runs(port, second).close()  # it listens on the same port, without waiting for TIME_WAIT to expire
    finally:
        second.terminate()
        second.communicate(timeout=30)
