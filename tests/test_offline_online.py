"""Offline-to-online: ``pickaxe train pendulum-td3 --warm-start.run DIR`` starts TD3 from a finished TD3+BC run's
final weights (actor, critics and targets) with its replay holding the offline run's dataset; bad warm starts are one
line before anything is built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from classic_runs import assert_killed_run_resumes_exactly
from cli_errors import train_error
from offline_data import random_dataset
from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.recipes import RECIPES
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer
from pickaxe.train.config import OnlineStartConfig

pytest.importorskip("minari")


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two episodes of random Pendulum actions as a dataset, and a 16-gradient-step pendulum-td3-bc run on it."""
    root = tmp_path_factory.mktemp("o2o")
    data = random_dataset(root / "data", "Pendulum-v1")
    run = root / "td3-bc"
    args = ["--data.dataset", str(data), "--trainer.total-steps", "4096", "--trainer.eval-every", "4096"]
    args += ["--trainer.eval-episodes", "2", "--run-dir", str(run), "--no-progress"]
    assert main(["train", "pendulum-td3-bc", *args]) == 0
    return {"root": root, "data": data, "run": run}


def test_td3_starts_from_the_offline_weights_with_the_dataset_in_its_replay(offline_run: dict[str, Path]) -> None:
    cfg = RECIPES["pendulum-td3"].make()
    cfg.warm_start = OnlineStartConfig(run=str(offline_run["run"]))
    cfg.check()
    trainer = build_trainer(cfg)
    try:
        saved = load_file(str(offline_run["run"] / "model.safetensors"))
        networks = trainer.algo.networks()
        assert set(networks) == {"actor", "critic", "q_target", "actor_target"}
        for name, net in networks.items():
            for key, value in net.state_dict().items():
                assert torch.equal(value, saved[f"{name}.{key}"]), f"{name}.{key}"
        stored = trainer.algo.buffer.state_dict()["storage"]
        data = read(offline_run["data"])
        assert len(trainer.algo.buffer) == len(data) == 400
        # every transition once, in a shuffled order: the rewards as a multiset, and each obs with its reward
        assert np.allclose(np.sort(stored["reward"].numpy()), np.sort(data.arrays["reward"]))
        order = np.argsort(stored["reward"].numpy())
        expected = np.argsort(data.arrays["reward"])
        assert np.allclose(stored["obs"].numpy()[order], data.arrays["obs"][expected])
        assert np.allclose(stored["next_obs"].numpy()[order], data.arrays["next_obs"][expected])
    finally:
        trainer.close()


def test_a_warm_started_run_trains_and_records_where_it_started(offline_run: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "td3"
    args = ["--warm-start.run", str(offline_run["run"]), "--trainer.total-steps", "600", "--trainer.eval-every", "600"]
    args += ["--trainer.eval-episodes", "2", "--algo.learning-starts", "0", "--run-dir", str(run), "--no-progress"]
    assert main(["train", "pendulum-td3", *args]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["warm_start"] == {"run": str(offline_run["run"]), "seed_replay": True}
    assert any("eval/return_mean" in r for r in read_metrics(run))


def test_bad_warm_starts_are_one_line(
    offline_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = str(offline_run["run"])
    out = ["--run-dir", str(tmp_path / "never")]
    assert "sac cannot continue an offline run" in train_error(capsys, "pendulum-sac", "--warm-start.run", src, *out)
    assert "not a readable run folder" in train_error(
        capsys, "pendulum-td3", "--warm-start.run", str(tmp_path / "nothing"), *out
    )
    assert "--model.hidden 64,64" in train_error(
        capsys, "pendulum-td3", "--warm-start.run", src, "--model.hidden", "32", *out
    )
    assert "drop --algo.twin false" in train_error(
        capsys, "pendulum-td3", "--warm-start.run", src, "--algo.twin", "false", *out
    )
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(offline_run["run"] / "config.json", unfinished / "config.json")
    err = train_error(capsys, "pendulum-td3", "--warm-start.run", str(unfinished), *out)
    assert "has not finished" in err and "pickaxe resume" in err
    other = json.loads((offline_run["run"] / "config.json").read_text())
    other["algo_name"] = "iql"
    (unfinished / "config.json").write_text(json.dumps(other))
    assert "is a iql run; td3 continues td3-bc runs only" in train_error(
        capsys, "pendulum-td3", "--warm-start.run", str(unfinished), *out
    )
    assert not (tmp_path / "never").exists()


def test_a_killed_warm_started_run_resumes_exactly(offline_run: dict[str, Path], tmp_path: Path) -> None:
    args = [
        "--warm-start.run", str(offline_run["run"]), "--algo.learning-starts", "0", "--trainer.total-steps", "1024",
        "--trainer.eval-every", "512", "--trainer.eval-episodes", "2", "--env.eval-envs", "2", "--save-every", "256",
        "--trainer.no-stop-at-target",
    ]  # fmt: skip
    assert_killed_run_resumes_exactly("pendulum-td3", args, tmp_path, "iteration:20")
