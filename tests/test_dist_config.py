"""``--dist.*`` values are checked before a run folder exists: one line naming the fix, before Ray is asked to
join anything (Ray retries an absent cluster for minutes)."""

import socket
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.train.config import DistConfig, check_ray_address


def _closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_fails_before_joining_ray_and_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: joining an address where no Ray listens waited minutes (Ray retries) with a run folder made.
    Now the address is refused before ``ray.init`` is ever called."""
    ray = pytest.importorskip("ray")

    def join(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"ray.init was called ({kwargs}): the address should have been refused before")

    monkeypatch.setattr(ray, "init", join)
    port = _closed_port()
    args = ["train", "cartpole-ppo", "--dist.placement", "separate", "--dist.address", f"127.0.0.1:{port}"]
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Ray cluster answers there" in err[0] and "ray start --head" in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("address", ["nonsense", "host:", ":80", "ray://host:port"])
def test_a_malformed_ray_address_is_named(address: str) -> None:
    with pytest.raises(ConfigError, match="is not a Ray address: use auto, HOST:PORT or ray://HOST:PORT"):
        check_ray_address(address, "--dist.address")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "pipelined"}, "--dist.mode pipelined needs rollout workers: add --dist.placement separate"),
        ({"workers": 2}, "--dist.workers 2 needs rollout workers: add --dist.placement separate"),
        ({"address": "auto"}, "--dist.address joins a Ray cluster for workers: add --dist.placement separate"),
    ],
)
def test_worker_options_need_separate_placement(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DistConfig(**fields).check(llm=True)


def test_starting_ray_prints_no_notice_of_its_own(tmp_path: Path) -> None:
    """Regression: a local Ray announced "Token authentication is enabled for this Ray cluster..." on stderr."""
    import os
    import subprocess
    import sys

    code = (
        "from pickaxe.dist.runtime import ensure_ray\n"
        "ray = ensure_ray(None, num_cpus=1)\n"
        "print(ray.get(ray.put(41)) + 1)\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"
    assert "Token authentication" not in proc.stderr and "RAY_AUTH_MODE" not in proc.stderr, proc.stderr
    assert (tmp_path / ".ray" / "auth_token").is_file()  # authentication is on, as Ray chose it
