"""``pickaxe train cartpole-iql`` with no ``--data.dataset`` makes its ``--data.make`` dataset (a source run of
cartpole-ppo, then ``pickaxe collect``) once, in the dataset cache, says so, records where the data came from, and
later runs reuse it; an env pickaxe makes no datasets of is one line. A tiny source budget throughout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.offline.dataset import read

pytest.importorskip("minari")

TINY = ["--data.source-steps", "2048", "--trainer.total-steps", "2048", "--trainer.eval-every", "2048"]
TINY += ["--trainer.eval-episodes", "2", "--env.eval-envs", "2", "--collector.steps", "1024", "--no-progress"]


def test_an_offline_recipe_makes_its_dataset_once_and_records_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PICKAXE_DATASETS", str(cache))
    assert main(["train", "cartpole-iql", *TINY, "--run-dir", str(tmp_path / "iql")]) == 0
    err = capsys.readouterr().err
    made = [p for p in cache.iterdir() if p.name.startswith("cartpole-medium-")]
    assert len(made) == 1 and f"making the CartPole-v1 medium dataset in {made[0]}" in err
    data = read(made[0])
    assert data.metadata["pickaxe_source"]["recipe"] == "cartpole-ppo"
    assert data.metadata["pickaxe_source"]["step"] == 2048
    assert data.metadata["pickaxe_collect"]["epsilon"] == 0.5
    config = json.loads((tmp_path / "iql" / "config.json").read_text())
    assert config["data"]["dataset"] == str(made[0]) and config["data"]["make"] == "medium"
    events = [json.loads(line) for line in (tmp_path / "iql" / "events.jsonl").read_text().splitlines()]
    recorded = [e for e in events if e["message"].startswith("dataset ")]
    assert recorded and recorded[0]["source"]["weights_sha256"] == data.metadata["pickaxe_source"]["weights_sha256"]
    # another algorithm on the same env and kind reuses it: no second source run
    source_model = next((cache / "sources").iterdir()) / "model.safetensors"
    stamp = source_model.stat().st_mtime_ns
    assert main(["train", "cartpole-cql", *TINY, "--run-dir", str(tmp_path / "cql")]) == 0
    assert "dataset made before" in capsys.readouterr().err
    assert source_model.stat().st_mtime_ns == stamp
    assert len([p for p in cache.iterdir() if p.name.startswith("cartpole-")]) == 1
    # another kind of the same source: a second dataset from the same source run
    assert main(["train", "cartpole-bc", *TINY, "--data.make", "random", "--run-dir", str(tmp_path / "bc")]) == 0
    assert source_model.stat().st_mtime_ns == stamp
    assert read(next(cache.glob("cartpole-random-*"))).metadata["pickaxe_collect"]["epsilon"] == 1.0


def test_no_dataset_for_an_env_without_a_source_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PICKAXE_DATASETS", str(tmp_path / "cache"))
    code = main(["train", "cartpole-iql", "--env.id", "Acrobot-v1", *TINY, "--run-dir", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "pickaxe makes datasets of CartPole-v1" in err and "not of Acrobot-v1: give --data.dataset DIR" in err
    assert not (tmp_path / "never").exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["hopper-iql", "halfcheetah-td3-bc"])
def test_a_mujoco_offline_recipe_makes_its_dataset_and_trains(
    recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mujoco")
    monkeypatch.setenv("PICKAXE_DATASETS", str(tmp_path / "cache"))
    tiny = ["--data.source-steps", "2048", "--trainer.total-steps", "1024", "--trainer.eval-every", "1024"]
    tiny += ["--trainer.eval-episodes", "1", "--env.eval-envs", "1", "--collector.steps", "512", "--no-progress"]
    assert main(["train", recipe, *tiny, "--run-dir", str(tmp_path / "run")]) == 0
    data = read(next((tmp_path / "cache").glob("*-medium-*")))
    assert data.metadata["pickaxe_source"]["recipe"] == {"hopper-iql": "hopper-ppo"}.get(recipe, "halfcheetah-sac")
    assert data.metadata["pickaxe_collect"]["noise"] == 0.5
