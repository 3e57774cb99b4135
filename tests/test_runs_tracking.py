"""Metric sinks and what a resumed run keeps: the Prometheus exporter (loopback only, numbers only, the port
checks), W&B's init arguments and records, ``Run.open`` with ``--track`` / ``--prometheus-port`` and TensorBoard's
purge of the steps a killed run wrote past its checkpoint (mutation survivors of issue 8)."""

from __future__ import annotations

import errno
import re
import socket
import sys
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pickaxe.errors import PickaxeError
from pickaxe.runs.run import Run, read_metrics
from pickaxe.runs.tracking import PrometheusSink, WandbSink, check_port, check_tracker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, str]:
    """``name{labels}`` -> value of every ``pickaxe_`` sample the exporter serves."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120).read().decode()
    return dict(ln.rsplit(" ", 1) for ln in body.splitlines() if ln.startswith("pickaxe_"))


# ------------------------------------------------------------------------------------------ Prometheus


def test_prometheus_exporter_listens_on_loopback_only() -> None:
    sink = PrometheusSink(_free_port(), "r")
    try:
        # serving on every interface (0.0.0.0 / ::) would expose the metrics to the network
        assert sink._server.socket.getsockname()[0] == "127.0.0.1"
    finally:
        sink.close()


def test_prometheus_exports_numbers_only_under_sanitized_names() -> None:
    port = _free_port()
    sink = PrometheusSink(port, "cartpole-1")
    try:
        sink.log({"note": "text", "done": True, "step": 10, "eval/Return_mean": 12.5, "loss-total.x": 3})
        sink.log({"step": 20, "eval/Return_mean": 14.0})  # the same gauge again: its latest value
        samples = _scrape(port)
    finally:
        sink.close()
    assert samples == {
        'pickaxe_step{run="cartpole-1"}': "20.0",
        'pickaxe_eval_Return_mean{run="cartpole-1"}': "14.0",
        'pickaxe_loss_total_x{run="cartpole-1"}': "3.0",
    }
    with pytest.raises(urllib.error.URLError):  # close() stops serving
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120)


def test_prometheus_sink_on_a_busy_port_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PickaxeError) as exc:
            PrometheusSink(port, "r")
    assert re.fullmatch(
        rf"cannot serve Prometheus metrics on 127\.0\.0\.1:{port} \(.*Address already in use.*\); pick another port",
        str(exc.value),
    )


@pytest.mark.parametrize("port", [0, -1, 65536, 70000, "8000", 8000.0, True, None])
def test_check_port_refuses_what_is_not_a_port(port: Any) -> None:
    with pytest.raises(PickaxeError) as exc:
        check_port(port)
    assert str(exc.value) == f"--prometheus-port must be an integer in 1..65535, got {port!r}"


@pytest.mark.parametrize("port", [1, 65535])
def test_check_port_accepts_both_ends_of_the_range(port: int) -> None:
    try:
        check_port(port)
    except PickaxeError as e:  # in use here, or a privileged port for a non-root user: not a range error
        assert str(e).startswith(f"cannot serve Prometheus metrics on 127.0.0.1:{port} (")


def test_check_port_binds_the_loopback_port_it_checks() -> None:
    check_port(_free_port())  # a free port passes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PickaxeError) as exc:
            check_port(port)
    assert str(exc.value) == (
        f"cannot serve Prometheus metrics on 127.0.0.1:{port} (Address already in use); pick another "
        "--prometheus-port or stop what uses it"
    )


# ------------------------------------------------------------------------------------------ W&B


class FakeWandb:
    """A stand-in for the wandb module: records ``init``'s arguments and every ``log`` / ``finish``."""

    def __init__(self) -> None:
        self.inits: list[dict[str, Any]] = []
        self.calls: list[tuple[str, Any, Any]] = []

    def init(self, **kwargs: Any) -> FakeWandb:
        self.inits.append(kwargs)
        return self

    def log(self, data: dict[str, Any], step: int) -> None:
        self.calls.append(("log", data, step))

    def finish(self) -> None:
        self.calls.append(("finish", None, None))


@pytest.fixture
def wandb(monkeypatch: pytest.MonkeyPatch) -> FakeWandb:
    fake = FakeWandb()
    module = types.ModuleType("wandb")
    module.__spec__ = types.SimpleNamespace(name="wandb")  # type: ignore[assignment]
    module.init = fake.init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "wandb" else None)
    return fake


def test_wandb_run_is_named_and_resumable_by_the_run_folder(tmp_path: Path, wandb: FakeWandb) -> None:
    sink = WandbSink(tmp_path / "cartpole-7", {"algo": {"lr": 0.1}})
    assert wandb.inits == [
        {"dir": str(tmp_path / "cartpole-7"), "name": "cartpole-7", "config": {"algo": {"lr": 0.1}},
         "resume": "allow", "id": "cartpole-7"}
    ]  # fmt: skip  # the folder name as id: a resumed run continues the same W&B run
    sink.log({"step": 512.0, "loss": 0.5, "n": 3, "note": "text"})
    sink.close()
    assert wandb.calls == [("log", {"loss": 0.5, "n": 3}, 512), ("finish", None, None)]
    assert type(wandb.calls[0][2]) is int


def test_missing_wandb_package_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(PickaxeError) as exc:
        WandbSink(tmp_path / "r", None)
    assert str(exc.value) == "--track wandb needs the wandb package: pip install 'pickaxe[wandb]'"


def test_unknown_tracker_lists_the_known_ones() -> None:
    with pytest.raises(PickaxeError) as exc:
        check_tracker("tensorbored")
    assert str(exc.value) == "unknown tracker 'tensorbored'; choose from mlflow, wandb"


# ------------------------------------------------------------------------------------------ metrics.jsonl


def test_read_metrics_skips_damaged_lines_anywhere(tmp_path: Path) -> None:
    lines = [b'{"step": 1, "loss": 0.5, "time/s": 1.0, "sys/rss_mb": 9}', b'{"step": 2, "lo', b"\xff\xfe not text",
             b"[1, 2]", b'{"step": 3, "loss": 0.25}']  # fmt: skip
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert read_metrics(tmp_path) == [
        {"step": 1, "loss": 0.5, "time/s": 1.0, "sys/rss_mb": 9},
        {"step": 3, "loss": 0.25},
    ]
    assert read_metrics(tmp_path, deterministic=True) == [{"step": 1, "loss": 0.5}, {"step": 3, "loss": 0.25}]


def test_new_run_gives_wandb_its_config(tmp_path: Path, wandb: FakeWandb) -> None:
    with Run(tmp_path / "r", config={"algo": {"lr": 0.1}}, track=("wandb",)):
        pass
    assert wandb.inits[0]["config"] == {"algo": {"lr": 0.1}}


def test_full_disk_while_logging_names_the_metrics_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Run(tmp_path / "r") as run:
        logger = run._sinks[0]

        def full(text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(logger._file, "write", full)
        with pytest.raises(OSError) as exc:
            run.log({"loss": 1.0}, 1)
    assert str(exc.value) == f"[Errno 28] No space left on device: '{tmp_path / 'r' / 'metrics.jsonl'}'"


# ------------------------------------------------------------------------------------------ resuming


def _finished_segment(path: Path) -> None:
    """A run that logged steps 1..5 (metrics.jsonl and TensorBoard) and was then killed."""
    with Run(path, config={"a": 1}) as run:
        for step in range(1, 6):
            run.log({"loss": float(step), "note": "text", "done": True}, step)


def test_resume_keeps_wandb_and_prometheus(tmp_path: Path, wandb: FakeWandb) -> None:
    _finished_segment(tmp_path / "r")
    port = _free_port()
    run = Run.open(tmp_path / "r", track=("wandb",), prometheus_port=port)
    try:
        run.rewind(3)
        run.log({"loss": 40.0}, 4)
        assert _scrape(port)['pickaxe_loss{run="r"}'] == "40.0"
    finally:
        run.close()
    assert wandb.inits == [{"dir": str(tmp_path / "r"), "name": "r", "config": None, "resume": "allow", "id": "r"}]
    assert wandb.calls == [("log", {"loss": 40.0}, 4), ("finish", None, None)]
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "r")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


@pytest.mark.parametrize("which", ["track", "prometheus"])
def test_resume_with_one_extra_sink(tmp_path: Path, wandb: FakeWandb, which: str) -> None:
    _finished_segment(tmp_path / "r")
    port = _free_port()
    kwargs: dict[str, Any] = {"track": ("wandb",)} if which == "track" else {"prometheus_port": port}
    run = Run.open(tmp_path / "r", **kwargs)
    try:
        run.rewind(5)
        run.log({"loss": 6.0}, 6)
        if which == "prometheus":
            assert _scrape(port)['pickaxe_loss{run="r"}'] == "6.0"
    finally:
        run.close()
    assert len(wandb.calls) == (2 if which == "track" else 0)


def test_resume_without_extra_sinks_logs_to_the_files_only(tmp_path: Path, wandb: FakeWandb) -> None:
    _finished_segment(tmp_path / "r")
    with Run.open(tmp_path / "r") as run:
        run.rewind(5)
        run.log({"loss": 6.0}, 6)
        run.flush()
    assert wandb.inits == [] and read_metrics(tmp_path / "r")[-1] == {"step": 6, "loss": 6.0}


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == [tag]  # numbers only, and not the step itself
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_rewind_purges_tensorboard_steps_past_the_checkpoint(tmp_path: Path) -> None:
    _finished_segment(tmp_path / "r")
    with Run.open(tmp_path / "r") as run:  # TensorBoard on by default, as for a new run
        run.rewind(3)
        run.log({"loss": 40.0}, 4)
    # steps 4 and 5 of the killed segment are hidden; step 3 and the new step 4 are shown once each
    assert _scalars(tmp_path / "r", "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_tensorboard_shows_every_metric_of_a_record_at_its_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Run(tmp_path / "r", config={"a": 1}) as run:
        run.log({"loss/policy": -0.5, "grad_norm": 3, "ok": True, "note": "text"}, 256)
        run.log({"loss/policy": -0.25, "grad_norm": 2.5, "eval/return_mean": 500.0}, 512)
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["eval/return_mean", "grad_norm", "loss/policy"]  # numbers, not bools
    assert [(e.step, e.value) for e in acc.Scalars("loss/policy")] == [(256, -0.5), (512, -0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("grad_norm")] == [(256, 3.0), (512, 2.5)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/return_mean")] == [(512, 500.0)]
