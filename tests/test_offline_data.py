"""Offline datasets: ``pickaxe collect`` writes Minari datasets that read back as the transitions played (by pickaxe
and by Minari itself), with the policy's provenance; damaged, truncated or ill-fitting datasets are one line before
any training; the dataset sampler's stream is exact across a save and load, and a killed offline run resumes to the
same numbers as one never stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from classic_runs import assert_killed_run_resumes_exactly
from cli_errors import train_error
from pickaxe.cli import main
from pickaxe.envs.make import make
from pickaxe.offline.dataset import DatasetError, Episode, read, read_mixed, write
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.runs.model import load_model
from pickaxe.runs.policies import acting_networks
from pickaxe.train.build import build_algorithm
from pickaxe.train.collect import play_episodes, run_config, weights_sha256

pytest.importorskip("minari")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A short cartpole-dqn run (checkpoints and kept policies) and an expert-less 12-episode dataset of it."""
    root = tmp_path_factory.mktemp("offline")
    run = root / "dqn"
    args = ["--trainer.total-steps", "3072", "--trainer.eval-every", "1536", "--trainer.eval-episodes", "2"]
    assert main(["train", "cartpole-dqn", *args, "--run-dir", str(run), "--no-progress"]) == 0
    data = root / "data"
    assert main(["collect", str(run), "--episodes", "12", "--epsilon", "0.3", "--out", str(data)]) == 0
    return {"run": run, "data": data, "root": root}


def test_collect_round_trip_equals_the_transitions_played(source: dict[str, Path], tmp_path: Path) -> None:
    cfg = run_config(source["run"])
    envs = make(cfg.env.id, 3, 123)
    try:
        algo = build_algorithm(cfg, envs)
        load_model(source["run"], acting_networks(algo.networks()), "cpu", checkpoint=1536)  # a kept step
        played = play_episodes(algo.policy, envs, 5, 0.2, 0.0, 7, "cpu")
        out = write(tmp_path / "ds", played, envs.single_observation_space, envs.single_action_space, "t/ds-v0", {})
    finally:
        envs.close()
    back = read(out)
    expect = {
        "obs": np.concatenate([ep.obs[:-1] for ep in played]),
        "next_obs": np.concatenate([ep.obs[1:] for ep in played]),
        "action": np.concatenate([ep.action for ep in played]),
        "reward": np.concatenate([ep.reward for ep in played]),
        "terminated": np.concatenate([ep.terminated for ep in played]),
        "truncated": np.concatenate([ep.truncated for ep in played]),
    }
    for key, value in expect.items():
        np.testing.assert_array_equal(back.arrays[key], value.astype(back.arrays[key].dtype), err_msg=key)
    assert all(ep.terminated[-1] or ep.truncated[-1] for ep in played)  # whole episodes, each ending
    assert back.episode_returns.tolist() == [float(ep.reward.sum()) for ep in played]
    import minari  # Minari itself opens the files pickaxe wrote

    ds = minari.MinariDataset(out / "data")
    assert ds.total_episodes == 5 and ds.total_steps == len(back)
    first = next(iter(ds.iterate_episodes()))
    np.testing.assert_array_equal(first.observations, played[0].obs)


def test_collect_records_the_policy_provenance_and_references(source: dict[str, Path]) -> None:
    meta = json.loads((source["data"] / "data" / "metadata.json").read_text())
    assert meta["total_episodes"] == 12 and meta["minari_version"] == "0.5.4"
    src = meta["pickaxe_source"]
    assert src["algo_name"] == "dqn" and src["checkpoint"] == "final" and src["step"] == 3072
    cfg = run_config(source["run"])
    envs = make(cfg.env.id, 1, 0)
    try:
        networks = acting_networks(build_algorithm(cfg, envs).networks())
    finally:
        envs.close()
    load_model(source["run"], networks, "cpu")
    assert src["weights_sha256"] == weights_sha256(networks)
    assert meta["pickaxe_collect"]["epsilon"] == 0.3
    assert isinstance(meta["ref_min_score"], float) and isinstance(meta["ref_max_score"], float)
    manifest = json.loads((source["data"] / "data" / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == {"main_data.hdf5", "metadata.json"}


def test_damaged_or_truncated_datasets_are_refused_in_one_line(
    source: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    bad = tmp_path / "bad"
    shutil.copytree(source["data"], bad)
    main_file = bad / "data" / "main_data.hdf5"
    data = main_file.read_bytes()
    main_file.write_bytes(data[: len(data) // 2])  # truncated
    err = train_error(capsys, "cartpole-bc", "--data.dataset", str(bad), "--run-dir", str(run_dir))
    assert "main_data.hdf5" in err and "truncated" in err
    assert not run_dir.exists()  # refused before the run folder exists
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    main_file.write_bytes(bytes(flipped))
    err = train_error(capsys, "cartpole-bc", "--data.dataset", str(bad), "--run-dir", str(run_dir))
    assert "main_data.hdf5" in err and "sha256" in err
    # a dataset without pickaxe's manifest (made with Minari) is checked as it is read
    (bad / "data" / "MANIFEST.json").unlink()
    main_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="damaged or truncated"):
        read(bad)
    main_file.write_bytes(data)
    meta = json.loads((bad / "data" / "metadata.json").read_text())
    meta["total_steps"] += 5
    (bad / "data" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="truncated: its metadata records"):
        read(bad)
    err = train_error(capsys, "cartpole-bc", "--data.dataset", str(tmp_path / "nothing"), "--run-dir", str(run_dir))
    assert "does not exist" in err and "pickaxe collect" in err


def test_dataset_and_flags_must_fit_the_run(
    source: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = str(tmp_path / "run")
    data = str(source["data"])
    err = train_error(capsys, "pendulum-bc", "--data.dataset", data, "--run-dir", run_dir)
    assert "do not fit env Pendulum-v1" in err
    err = train_error(capsys, "cartpole-dqn", "--data.dataset", data, "--run-dir", run_dir)
    assert "drop --data.dataset" in err
    err = train_error(capsys, "cartpole-iql", "--data.make", "None", "--run-dir", run_dir)
    assert "add --data.dataset DIR" in err
    steps = ["--collector.steps", "1000"]
    err = train_error(capsys, "cartpole-cql", "--data.dataset", data, *steps, "--run-dir", run_dir)
    assert "multiple of algo.batch_size" in err
    err = train_error(capsys, "cartpole-bc", "--data.dataset", data, "--dist.learners", "2", "--run-dir", run_dir)
    assert "in one process" in err
    err = train_error(capsys, "cartpole-bc", "--data.dataset", data, "--algo.box-loss", "mse", "--run-dir", run_dir)
    assert "--algo.box-loss mse regresses Box actions" in err and "fix: drop --algo.box-loss" in err
    assert not Path(run_dir).exists()


def test_mixed_datasets_are_sampled_as_one(source: dict[str, Path]) -> None:
    one = read(source["data"])
    both = read_mixed([source["data"], source["data"]])
    assert len(both) == 2 * len(one)
    np.testing.assert_array_equal(both.arrays["obs"][len(one) :], one.arrays["obs"])
    assert both.metadata["pickaxe_mixed"] == [str(source["data"])] * 2


def test_sampler_stream_is_exact_across_save_and_load(source: dict[str, Path]) -> None:
    data = read(source["data"])
    a = DatasetSampler(data, 100, seed=5)
    for _ in range(3):
        a.collect()
    state = json.loads(json.dumps(a.state_dict()))  # plain values, as a checkpoint keeps them
    after = [a.collect() for _ in range(len(data) // 100 + 2)]  # crosses an epoch boundary
    b = DatasetSampler(data, 100, seed=99)
    b.load_state_dict(state)
    for x in after:
        y = b.collect()
        assert all(torch.equal(x[k], y[k]) for k in x.keys())  # noqa: SIM118 - a TensorDict iterates its rows
    seen = torch.cat([DatasetSampler(data, len(data), seed=1).collect()["reward"]])
    assert len(seen) == len(data)  # one epoch is one pass over every transition
    assert set(a.collect().keys()) == {"obs", "action", "reward", "terminated", "truncated", "next_obs"}
    data.arrays["reward"] = data.arrays["reward"] + 1.0  # the same size, other data: a changed dataset
    with pytest.raises(ValueError, match="the dataset changed since"):
        DatasetSampler(data, 100, seed=5).load_state_dict(state)


def test_killed_offline_run_resumes_exactly(source: dict[str, Path], tmp_path: Path) -> None:
    args = [
        "--data.dataset", str(source["data"]), "--trainer.total-steps", "40960", "--collector.steps", "1024",
        "--trainer.eval-every", "8192", "--trainer.eval-episodes", "2", "--env.eval-envs", "2", "--save-every", "4096",
        "--algo.batch-size", "128",
    ]  # fmt: skip
    assert_killed_run_resumes_exactly("cartpole-iql", args, tmp_path, "iteration:22")


def test_write_refuses_a_folder_in_use(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    ep = Episode(np.zeros((2, 1)), np.zeros(1), np.zeros(1), np.array([True]), np.array([False]))
    with pytest.raises(DatasetError, match="not empty"):
        write(tmp_path / "x", [ep], None, None, "t/x-v0", {})


def test_box_episodes_round_trip_and_fit_checks(tmp_path: Path) -> None:
    import gymnasium as gym

    from pickaxe.envs.make import spaces_of
    from pickaxe.offline.dataset import check_fits

    obs_space, act_space = spaces_of("Pendulum-v1")
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            rng.normal(size=(t + 1, 3)).astype(np.float32),
            rng.uniform(-2, 2, (t, 1)).astype(np.float32),
            rng.normal(size=t),
            np.zeros(t, bool),
            np.eye(1, t, t - 1, dtype=bool)[0],  # truncated at the last step, as Pendulum's time limit
        )
        for t in (4, 7)
    ]
    out = write(tmp_path / "box", episodes, obs_space, act_space, "t/box-v0", {"ref_min_score": -1.0})
    back = read(out)
    np.testing.assert_array_equal(back.arrays["action"], np.concatenate([ep.action for ep in episodes]))
    np.testing.assert_array_equal(back.arrays["next_obs"][3], episodes[0].obs[4])  # the true final observation
    assert back.arrays["truncated"].sum() == 2 and not back.arrays["terminated"].any()
    assert back.observation_space == obs_space and back.metadata["ref_min_score"] == -1.0
    check_fits(out, obs_space, act_space, "Pendulum-v1")  # Pendulum's own spaces: fits
    with pytest.raises(DatasetError, match="actions"):
        check_fits(out, obs_space, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), "X-v0")


def test_collect_refuses_bad_requests_in_one_line(
    source: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["collect", str(tmp_path), "--episodes", "2", "--out", str(tmp_path / "o")], "not a run directory"),
        (["collect", str(source["run"]), "--episodes", "2", "--noise", "0.1", "--out", str(tmp_path / "o")], "Box"),
        (["collect", str(source["run"]), "--episodes", "2", "--out", str(source["data"])], "not empty"),
        (["collect", str(source["run"]), "--episodes", "2", "--checkpoint", "777", "--out", str(tmp_path / "o")],
         "no checkpoint at env step 777"),
        (["collect", str(source["run"]), "--episodes", "2"], "needs --out"),
    ]  # fmt: skip
    for argv, needle in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()
