"""Monitoring: per-phase times and resource readings in metrics.jsonl, Prometheus endpoint, optional trackers."""

import socket
import sys
import types
import urllib.request
from pathlib import Path

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import Run, read_metrics
from pickaxe.train.build import build_trainer, train


def _small_cfg():
    cfg = get_recipe("cartpole-ppo")
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.save_every = 1024, 512, 512
    return cfg


def test_records_carry_phase_times_and_resources(tmp_path: Path) -> None:
    train(_small_cfg(), run_dir=tmp_path / "r")
    records = read_metrics(tmp_path / "r")
    for key in (
        "time/collect_s",
        "time/update_s",
        "time/update_cpu_s",
        "time/checkpoint_s",
        "time/steps_per_s",
        "sys/rss_mb",
        "sys/cpu_percent",
        "time/collect_steps_per_s",
    ):
        assert all(key in r for r in records), key
    assert any("time/eval_s" in r for r in records)
    assert records[0]["sys/rss_mb"] > 10
    assert all(r["time/update_cpu_s"] > 0 for r in records)  # the update's CPU seconds in this process
    assert any(r["time/checkpoint_s"] > 0 for r in records)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_endpoint_serves_latest_metrics(tmp_path: Path) -> None:
    cfg = _small_cfg()
    port = _free_port()
    run = Run(tmp_path / "r", config=cfg.to_dict(), prometheus_port=port)
    try:
        build_trainer(cfg, run=run).fit()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120).read().decode()
    finally:
        run.close()
    line = next(ln for ln in body.splitlines() if ln.startswith("pickaxe_eval_return_mean{"))
    assert 'run="r"' in line and float(line.split()[-1]) == read_metrics(tmp_path / "r")[-1]["eval/return_mean"]
    assert "pickaxe_sys_rss_mb" in body


def test_prometheus_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(PickaxeError, match=r"cannot serve Prometheus metrics on 127\.0\.0\.1"):
            Run(tmp_path / "r", prometheus_port=s.getsockname()[1])


def test_missing_tracker_fails_before_the_run_directory_exists(tmp_path: Path) -> None:
    if "mlflow" in sys.modules or __import__("importlib").util.find_spec("mlflow"):
        pytest.skip("mlflow is installed here")
    with pytest.raises(PickaxeError, match=r"--track mlflow needs the mlflow package: pip install 'pickaxe\[mlflow\]'"):
        Run(tmp_path / "r", track=("mlflow",))
    assert not (tmp_path / "r").exists()
    with pytest.raises(PickaxeError, match="unknown tracker 'tensorbored'"):
        Run(tmp_path / "r", track=("tensorbored",))


def test_wandb_tracker_receives_the_same_metrics(tmp_path: Path, monkeypatch) -> None:
    logged: list[tuple[dict, int]] = []

    class FakeRun:
        def log(self, data, step):
            logged.append((data, step))

        def finish(self):
            logged.append(({"finished": True}, -1))

    fake = types.ModuleType("wandb")
    fake.__spec__ = types.SimpleNamespace(name="wandb")  # type: ignore[assignment]
    fake.init = lambda **kwargs: FakeRun()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "wandb" else None)
    train(_small_cfg(), run_dir=tmp_path / "r", track=("wandb",))
    records = read_metrics(tmp_path / "r")
    assert [step for _, step in logged[:-1]] == [r["step"] for r in records]
    assert logged[-2][0]["eval/return_mean"] == records[-1]["eval/return_mean"]
    assert logged[-1][0] == {"finished": True}
