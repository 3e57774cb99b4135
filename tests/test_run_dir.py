"""The run folder: never mixing or destroying a run, checks before anything is written, disk errors as one line,
a verified final model, evaluating kept checkpoints, the "started" event, a config.json that is not UTF-8."""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from pickaxe.cli import main
from pickaxe.errors import PickaxeError
from pickaxe.recipes import get_recipe
from pickaxe.runs.checkpoint import CheckpointManager
from pickaxe.runs.folder import disk_error
from pickaxe.runs.model import MODEL_DIGEST_FILE, MODEL_FILE, load_model
from pickaxe.runs.run import Run, read_metrics
from pickaxe.runs.tracking import JsonlLogger
from pickaxe.train.build import build_algorithm, evaluate_run, resume, train


def _small_cfg(recipe: str = "cartpole-ppo", total: int = 1024):
    cfg = get_recipe(recipe)
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.save_every = total, 512, 512
    cfg.trainer.eval_episodes, cfg.env.eval_envs = 2, 2
    if recipe == "cartpole-ppo":
        cfg.env.num_envs, cfg.collector.steps = 4, 256
    return cfg


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One finished PPO run (checkpoints at 512 and 1024, evaluated at both)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train(_small_cfg(), run_dir=run_dir)
    return run_dir


# ------------------------------------------------------------------------------------ never mix two runs


def test_train_into_a_folder_holding_a_run_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_small_cfg(total=256), run_dir=run_dir)
    before = _snapshot(run_dir)
    with pytest.raises(PickaxeError) as info:
        train(_small_cfg(total=256), run_dir=run_dir)
    message = str(info.value)
    assert "\n" not in message and f"pickaxe resume {run_dir}" in message and "--overwrite" in message
    assert _snapshot(run_dir) == before


@pytest.mark.parametrize("marker", ["config.json", "metrics.jsonl", "checkpoints", MODEL_FILE])
def test_run_refuses_any_sign_of_a_run(tmp_path: Path, marker: str) -> None:
    (tmp_path / "r").mkdir()
    target = tmp_path / "r" / marker
    target.mkdir() if marker == "checkpoints" else target.write_text("{}\n")
    with pytest.raises(PickaxeError, match="already holds a run"):
        Run(tmp_path / "r", config={"a": 1}, tensorboard=False)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [marker]


def test_empty_or_unrelated_existing_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "job.log").write_text("queue worker log\n")  # what the job queue writes first
    with Run(tmp_path / "r", config={"a": 1}, tensorboard=False) as run:
        run.log({"x": 1.0}, step=1)
    assert (tmp_path / "r" / "job.log").read_text() == "queue worker log\n"
    assert [r["step"] for r in read_metrics(tmp_path / "r")] == [1]


def test_overwrite_moves_the_old_run_aside(tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    train(_small_cfg(total=256), run_dir=run_dir)
    old = _snapshot(run_dir)
    cfg = _small_cfg(total=512)
    train(cfg, run_dir=run_dir, overwrite=True)
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(moved) == 1 and _snapshot(moved[0]) == old  # nothing lost
    assert json.loads((run_dir / "config.json").read_text())["trainer"]["total_steps"] == 512
    assert [r["step"] for r in read_metrics(run_dir)] == [256, 512]  # only the new run's records
    assert str(moved[0]) in capsys.readouterr().err
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("moved_to") == str(moved[0]) for e in events)


# ------------------------------------------------------------------------ every check before any write


def _assert_user_error(call, folder: Path, *needles: str) -> None:
    with pytest.raises(PickaxeError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(n in message for n in needles), message
    assert not folder.exists()


def test_bad_config_value_creates_nothing(tmp_path: Path) -> None:
    cfg = _small_cfg()
    cfg.algo.lr = -1.0  # set after construction: cfg.check() catches it
    _assert_user_error(lambda: train(cfg, run_dir=tmp_path / "r"), tmp_path / "r", "algo.lr")
    cfg = _small_cfg()
    cfg.env.id = "CartPol-v1"
    _assert_user_error(lambda: train(cfg, run_dir=tmp_path / "r"), tmp_path / "r", "CartPol-v1")


def test_busy_prometheus_port_creates_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _assert_user_error(
            lambda: train(_small_cfg(), run_dir=tmp_path / "r", prometheus_port=port),
            tmp_path / "r",
            f"127.0.0.1:{port}",
            "--prometheus-port",
        )


def test_busy_port_leaves_an_existing_run_untouched(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(PickaxeError, match="cannot serve Prometheus metrics"):
            Run(tmp_path / "r", config={"a": 1}, prometheus_port=s.getsockname()[1])
    assert list((tmp_path / "r").iterdir()) == []


def test_unknown_tracker_creates_nothing(tmp_path: Path) -> None:
    _assert_user_error(
        lambda: train(_small_cfg(), run_dir=tmp_path / "r", track=("tensorbored",)), tmp_path / "r", "tensorbored"
    )


def test_run_dir_under_a_regular_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "somefile").write_text("x")
    _assert_user_error(
        lambda: train(_small_cfg(), run_dir=tmp_path / "somefile" / "x"), tmp_path / "somefile" / "x", "is a file"
    )
    argv = ["train", "cartpole-ppo", "--run-dir", str(tmp_path / "somefile" / "x" / "y"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pickaxe: error: ") and "\n" not in err and str(tmp_path / "somefile") in err
    assert (tmp_path / "somefile").read_text() == "x"


def _refuse_writes_in(monkeypatch, folder: Path) -> None:
    """Make ``folder`` read-only for pickaxe's write probe (chmod does not stop root, who runs many CI jobs)."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if Path(kwargs.get("dir", "")).resolve() == folder.resolve():
            raise OSError(errno.EROFS, "Read-only file system", str(folder))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_unwritable_parent_creates_nothing(tmp_path: Path, monkeypatch) -> None:
    _refuse_writes_in(monkeypatch, tmp_path)
    _assert_user_error(
        lambda: train(_small_cfg(), run_dir=tmp_path / "a" / "r"), tmp_path / "a", str(tmp_path), "not writable"
    )


def test_read_only_run_folder_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "r").mkdir()
    _refuse_writes_in(monkeypatch, tmp_path / "r")
    with pytest.raises(PickaxeError, match="not writable"):
        train(_small_cfg(), run_dir=tmp_path / "r")
    assert list((tmp_path / "r").iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_run_folder_by_permissions(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r").chmod(0o555)
    try:
        with pytest.raises(PickaxeError, match="not writable"):
            train(_small_cfg(), run_dir=tmp_path / "r")
        assert list((tmp_path / "r").iterdir()) == []
    finally:
        (tmp_path / "r").chmod(0o755)


def test_failure_while_creating_the_run_removes_it(tmp_path: Path, monkeypatch) -> None:
    def broken_sinks(*args, **kwargs):
        raise PickaxeError("tracker refused the run")

    monkeypatch.setattr("pickaxe.runs.run._extra_sinks", broken_sinks)
    with pytest.raises(PickaxeError, match="tracker refused"):
        Run(tmp_path / "a" / "b" / "r", config={"a": 1})
    assert not (tmp_path / "a").exists()


def test_failed_overwrite_puts_the_old_run_back(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text('{"old": true}')
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1}\n')
    before = _snapshot(tmp_path / "r")

    def broken_sinks(*args, **kwargs):
        raise PickaxeError("tracker refused the run")

    monkeypatch.setattr("pickaxe.runs.run._extra_sinks", broken_sinks)
    with pytest.raises(PickaxeError, match="tracker refused"):
        Run(tmp_path / "r", config={"a": 1}, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["r"] and _snapshot(tmp_path / "r") == before


# --------------------------------------------------------------------------- a full disk during training


def test_full_disk_during_training_is_one_line_and_keeps_what_was_written(tmp_path: Path, monkeypatch) -> None:
    real_init = JsonlLogger.__init__

    class FillingFile:
        """A metrics file on a disk that fills up after two records."""

        def __init__(self, f) -> None:
            self._f, self.lines = f, 0

        def write(self, text: str) -> int:
            if self.lines == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.lines += 1
            return self._f.write(text)

        def __getattr__(self, name: str):
            return getattr(self._f, name)

    def init(self, path: Path) -> None:
        real_init(self, path)
        self._file = FillingFile(self._file)

    monkeypatch.setattr(JsonlLogger, "__init__", init)
    run_dir = tmp_path / "r"
    cfg = _small_cfg(total=1024)
    cfg.trainer.save_every = 256
    with pytest.raises(PickaxeError) as info:
        train(cfg, run_dir=run_dir)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"no space left on device writing {run_dir / 'metrics.jsonl'}")
    assert f"free space and run `pickaxe resume {run_dir}`" in message
    assert [r["step"] for r in read_metrics(run_dir)] == [256, 512]
    monkeypatch.setattr(JsonlLogger, "__init__", real_init)
    result, _ = resume(run_dir)  # and the advice works
    assert result.steps == 1024 and [r["step"] for r in read_metrics(run_dir)] == [256, 512, 768, 1024]


def test_disk_errors_from_safetensors_and_while_creating_the_run(tmp_path: Path, monkeypatch) -> None:
    class SafetensorError(Exception):
        """What safetensors raises for an I/O error (it is no OSError)."""

    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    message = str(disk_error(full, Path("runs/x")))
    assert message.startswith("no space left on device writing runs/x;") and "`pickaxe resume runs/x`" in message
    assert disk_error(SafetensorError("header too large"), Path("runs/x")) is None
    assert disk_error(OSError(errno.ENOENT, "No such file"), Path("runs/x")) is None

    def full_manifest(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / ".manifest.json.tmp"))

    monkeypatch.setattr("pickaxe.runs.run.build_manifest", full_manifest)
    with pytest.raises(PickaxeError, match="no run was created: free space and run the command again"):
        train(_small_cfg(), run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def _read_only_mount(monkeypatch, folder: Path) -> None:
    """Make every write under ``folder`` fail as on a read-only mount (EROFS, root included): ``open`` and
    ``io.open`` in a writing mode and ``os.open`` with a writing flag, each naming the path as it was given
    (TensorBoard gives bytes)."""
    import builtins
    import io

    folder = folder.resolve()
    real_open, real_os_open = builtins.open, os.open

    def inside(path) -> bool:
        return isinstance(path, str | bytes | os.PathLike) and Path(os.fsdecode(path)).resolve().is_relative_to(folder)

    def fake_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and inside(file):
            raise OSError(errno.EROFS, "Read-only file system", file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and inside(path):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)


def test_resuming_a_read_only_run_folder_is_one_line_before_anything_is_built(
    trained: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    import shutil

    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir)
    before = _snapshot(run_dir)
    _read_only_mount(monkeypatch, run_dir)
    monkeypatch.setattr("pickaxe.train.build.builder_for", lambda cfg: pytest.fail("built before the check"))
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"pickaxe: error: cannot write run folder {run_dir} (Read-only file system); make it writable and run the "
        "command again"
    )
    monkeypatch.undo()
    assert _snapshot(run_dir) == before


def test_a_read_only_tensorboard_folder_is_one_line_with_its_path_as_text(
    trained: Path, tmp_path: Path, monkeypatch, capfd
) -> None:
    import shutil

    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir)
    _read_only_mount(monkeypatch, run_dir / "tensorboard")
    capfd.readouterr()
    assert main(["resume", str(run_dir), "--no-progress"]) == 2
    err = capfd.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"pickaxe: error: read-only file system writing {run_dir / 'tensorboard'}; what was written before is kept: "
        f"make {run_dir} writable and run `pickaxe resume {run_dir}`"
    )
    # TensorBoard's writer is never started in the folder: no traceback of its thread before the line
    assert "Traceback" not in err and "Exception in thread" not in err and "b'" not in err


# ----------------------------------------------------------------------------------- the verified model


def _evaluate(run_dir: Path, checkpoint: str | int = "final") -> float:
    returns, _ = evaluate_run(_small_cfg(), run_dir, episodes=2, checkpoint=checkpoint)
    return float(returns.mean())


def test_model_digest_is_recorded_and_verified(trained: Path, tmp_path: Path) -> None:
    record = json.loads((trained / MODEL_DIGEST_FILE).read_text())
    assert record["size"] == (trained / MODEL_FILE).stat().st_size and len(record["sha256"]) == 64
    assert record["step"] == 1024  # the env step the final weights belong to
    good = _evaluate(trained)

    flipped = tmp_path / "flipped"
    flipped.mkdir()
    for name in ("config.json", MODEL_DIGEST_FILE):
        (flipped / name).write_bytes((trained / name).read_bytes())
    data = bytearray((trained / MODEL_FILE).read_bytes())
    data[-5] ^= 0x10  # a bit in the last weight
    (flipped / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(PickaxeError, match="does not match its sha256") as info:
        _evaluate(flipped)
    assert str(flipped / MODEL_FILE) in str(info.value) and "\n" not in str(info.value)

    (flipped / MODEL_FILE).write_bytes((trained / MODEL_FILE).read_bytes()[:-100])
    with pytest.raises(PickaxeError, match="truncated"):
        _evaluate(flipped)

    (flipped / MODEL_FILE).write_bytes((trained / MODEL_FILE).read_bytes())
    assert _evaluate(flipped) == good
    (flipped / MODEL_DIGEST_FILE).unlink()  # a run from before digests: loads, with a warning
    with pytest.warns(UserWarning, match="no recorded size and sha256"):
        assert _evaluate(flipped) == good


def test_missing_model_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PickaxeError, match="--checkpoint latest"):
        load_model(tmp_path, {}, "cpu")


# ------------------------------------------------------------------------------ evaluating checkpoints


def _weights(cfg, run_dir: Path, checkpoint: str | int) -> dict[str, torch.Tensor]:
    import gymnasium as gym

    algo = build_algorithm(cfg, gym.vector.SyncVectorEnv([lambda: gym.make(cfg.env.id)]))
    load_model(run_dir, algo.networks(), "cpu", checkpoint=checkpoint)
    return {f"{n}.{k}": v.clone() for n, net in algo.networks().items() for k, v in net.state_dict().items()}


def test_load_any_kept_checkpoint(trained: Path) -> None:
    cfg = _small_cfg()
    infos = CheckpointManager(trained).list()
    assert [i.step for i in infos] == [512, 1024]
    state, _ = CheckpointManager(trained).load(infos[0].path)
    at_512 = _weights(cfg, trained, 512)
    assert all(torch.equal(at_512[f"policy.{k}"], v) for k, v in state["algo"]["policy"].items())
    final, latest = _weights(cfg, trained, "final"), _weights(cfg, trained, "latest")
    assert final.keys() == latest.keys() and all(torch.equal(final[k], latest[k]) for k in final)
    assert any(not torch.equal(final[k], at_512[k]) for k in final)
    scored = [i for i in infos if i.metric is not None]
    assert scored  # evaluated checkpoints record their eval return
    # best: the step the run's selection rule recorded (its weights kept as a checkpoint or a policy)
    selected = json.loads((trained / "selection.json").read_text())["step"]
    best, expected = _weights(cfg, trained, "best"), _weights(cfg, trained, selected)
    assert all(torch.equal(best[k], expected[k]) for k in best)
    # a run without selection.json (an older pickaxe): the checkpoint with the highest recorded metric
    (trained / "selection.json").rename(trained / "selection.json.away")
    try:
        best_step = max(scored, key=lambda i: (i.metric, i.step)).step
        best, expected = _weights(cfg, trained, "best"), _weights(cfg, trained, best_step)
        assert all(torch.equal(best[k], expected[k]) for k in best)
    finally:
        (trained / "selection.json.away").rename(trained / "selection.json")
    assert _evaluate(trained, "latest") == _evaluate(trained, "final")
    with pytest.raises(PickaxeError, match="no checkpoint at env step 700; kept checkpoints: 512, 1024"):
        _weights(cfg, trained, 700)
    with pytest.raises(PickaxeError, match="final, latest, best or an env step"):
        _weights(cfg, trained, "newest")


def _fake_checkpoints(run_dir: Path, metrics: list[float | None]) -> list[nn.Linear]:
    nets = []
    manager = CheckpointManager(run_dir, keep_last=10, keep_best=10)
    for i, metric in enumerate(metrics):
        torch.manual_seed(i)
        net = nn.Linear(2, 2)
        manager.save((i + 1) * 100, {"algo": {"policy": net.state_dict(), "optimizer": {}}}, metric=metric)
        nets.append(net)
    return nets


def test_best_checkpoint_is_highest_metric_newest_on_ties(tmp_path: Path) -> None:
    nets = _fake_checkpoints(tmp_path, [1.0, 3.0, None, 3.0, 2.0])
    net = nn.Linear(2, 2)
    load_model(tmp_path, {"policy": net}, checkpoint="best")
    assert torch.equal(net.weight, nets[3].weight)  # step 400: metric 3.0, newer than step 200
    load_model(tmp_path, {"policy": net}, checkpoint="300")
    assert torch.equal(net.weight, nets[2].weight)


def test_best_without_metrics_and_no_checkpoints_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(PickaxeError, match="has no checkpoints"):
        load_model(tmp_path, {"policy": nn.Linear(2, 2)}, checkpoint="latest")
    _fake_checkpoints(tmp_path, [None, None])
    with pytest.raises(PickaxeError, match="none is best"):
        load_model(tmp_path, {"policy": nn.Linear(2, 2)}, checkpoint="best")
    with pytest.raises(PickaxeError, match="no weights for network 'q'"):
        load_model(tmp_path, {"q": nn.Linear(2, 2)}, checkpoint="latest")


def test_every_algorithm_keeps_its_networks_in_its_state_under_the_same_names() -> None:
    import gymnasium as gym

    from pickaxe.algos.configs import GRPOConfig, SFTConfig
    from pickaxe.algos.grpo import GRPO
    from pickaxe.algos.sft import SFT
    from pickaxe.models.lm import tiny_lm
    from pickaxe.rollout.engines.base import SamplingParams

    algos = []
    for recipe in ("cartpole-ppo", "cartpole-dqn"):
        cfg = _small_cfg(recipe)
        algos.append(build_algorithm(cfg, gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])))
    lm = tiny_lm(16, hidden=8, layers=1, heads=1, kv_heads=1, intermediate=8, max_positions=16, seed=0)
    algos += [SFT(lm, SFTConfig()), GRPO(lm, GRPOConfig(), SamplingParams(4), seed=0)]
    for algo in algos:
        state = algo.state_dict()
        for name, net in algo.networks().items():
            assert state[name].keys() == net.state_dict().keys(), (type(algo).__name__, name)


# -------------------------------------------------------------------------------- events and config.json


def test_every_run_starts_with_a_started_event(tmp_path: Path) -> None:
    Run(tmp_path / "r", config={"a": 1}, tensorboard=False).close()
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert events[0]["message"] == "started" and events[0]["step"] == 0 and events[0]["pid"] == os.getpid()


def test_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    Run(tmp_path / "r", config={"a": 1}, tensorboard=False).close()
    (tmp_path / "r" / "config.json").write_bytes(b'{"recipe": "caf\xe9"}')
    with pytest.raises(PickaxeError) as info:
        Run.open(tmp_path / "r").config()
    assert str(tmp_path / "r" / "config.json") in str(info.value) and "UTF-8" in str(info.value)
    assert "\n" not in str(info.value)


def test_resume_without_a_checkpoint_is_refused_but_a_supervisor_restart_starts_over(tmp_path: Path) -> None:
    cfg = _small_cfg()
    run = Run(tmp_path / "run", config=cfg.to_dict(), seed=cfg.seed)  # killed before its first checkpoint
    run.close()
    with pytest.raises(PickaxeError, match="has no checkpoint to resume from"):
        resume(tmp_path / "run")
    assert not (tmp_path / "run" / MODEL_FILE).exists()
    result, _ = resume(tmp_path / "run", allow_no_checkpoint=True)  # what `pickaxe resume --restart` does
    assert result.steps == cfg.trainer.total_steps
    train(cfg, run_dir=tmp_path / "fresh")
    assert read_metrics(tmp_path / "run", deterministic=True) == read_metrics(tmp_path / "fresh", deterministic=True)
