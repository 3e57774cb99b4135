"""Offline algorithms learn from datasets pickaxe makes from its own runs: behaviour cloning matches an expert
dataset's return; CQL and IQL beat the behaviour policy of a medium (epsilon-greedy) dataset; the normalised score is
logged against the dataset's references. Budgets are small; the longer checks are marked slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pickaxe.cli import main
from pickaxe.offline.dataset import read
from pickaxe.runs.run import read_metrics

pytest.importorskip("minari")


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cartpole-ppo trained until solved (eval 500) and an expert dataset of its final policy."""
    root = tmp_path_factory.mktemp("cartpole")
    run = root / "ppo"
    assert main(["train", "cartpole-ppo", "--run-dir", str(run), "--no-progress"]) == 0
    expert = root / "expert"
    assert main(["collect", str(run), "--episodes", "10", "--out", str(expert)]) == 0
    return {"root": root, "run": run, "expert": expert}


def _evals(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "eval/return_mean" in r]


def test_bc_matches_the_expert_dataset_return(cartpole: dict[str, Path]) -> None:
    data = read(cartpole["expert"])
    behaviour = float(data.episode_returns.mean())
    assert behaviour > 475  # the source run is an expert
    run = cartpole["root"] / "bc"
    args = ["--data.dataset", str(cartpole["expert"]), "--trainer.total-steps", "262144"]  # 1,024 gradient steps
    args += ["--trainer.eval-every", "131072"]
    assert main(["train", "cartpole-bc", *args, "--run-dir", str(run), "--no-progress"]) == 0
    last = _evals(run)[-1]
    assert last["eval/return_mean"] >= 0.95 * behaviour
    # the normalised score against the references collect stored: 100 at the expert reference's return
    ref_min, ref_max = data.metadata["ref_min_score"], data.metadata["ref_max_score"]
    expected = 100 * (last["eval/return_mean"] - ref_min) / (ref_max - ref_min)
    assert last["eval/normalized_score"] == pytest.approx(expected)
    low, high = last["eval/normalized_score_ci_low"], last["eval/normalized_score_ci_high"]
    assert low <= last["eval/normalized_score"] <= high
    # pickaxe eval --checkpoints scores kept weights the same way, normalised score included
    assert main(["eval", str(run), "--checkpoints", "final"]) == 0
    report = json.loads((run / "eval" / "checkpoints.json").read_text())
    final = report["rows"][-1]["metrics"]
    assert final["eval/normalized_score"]["mean"] == pytest.approx(expected)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["cql", "iql"])
def test_cql_and_iql_beat_the_behaviour_policy_on_a_medium_dataset(cartpole: dict[str, Path], algo: str) -> None:
    medium = cartpole["root"] / "medium"
    if not medium.exists():
        flags = ["--episodes", "20", "--epsilon", "0.5"]
        assert main(["collect", str(cartpole["run"]), *flags, "--out", str(medium)]) == 0
    behaviour = float(read(medium).episode_returns.mean())
    assert behaviour < 300  # half the actions random: a medium dataset
    run = cartpole["root"] / algo
    args = ["--data.dataset", str(medium), "--trainer.total-steps", "512000", "--trainer.eval-every", "256000"]
    assert main(["train", f"cartpole-{algo}", *args, "--run-dir", str(run), "--no-progress"]) == 0
    last = _evals(run)[-1]
    assert last["eval/return_mean_ci_low"] > behaviour


@pytest.mark.slow
def test_iql_beats_the_behaviour_policy_on_a_medium_pendulum_dataset(tmp_path: Path) -> None:
    run, medium = tmp_path / "sac", tmp_path / "medium"
    assert main(["train", "pendulum-sac", "--run-dir", str(run), "--no-progress"]) == 0
    assert main(["collect", str(run), "--episodes", "20", "--noise", "0.5", "--out", str(medium)]) == 0
    behaviour = float(read(medium).episode_returns.mean())
    out = tmp_path / "iql"
    args = ["--data.dataset", str(medium), "--seed", "1", "--run-dir", str(out), "--no-progress"]
    assert main(["train", "pendulum-iql", *args]) == 0
    assert _evals(out)[-1]["eval/return_mean"] > behaviour  # docs/offline.md: -234.6 against -297.3 (seed 1)


def _random_dataset(cartpole: dict[str, Path]) -> Path:
    """100 episodes of uniformly random actions (behaviour return about 22), made once per module."""
    random = cartpole["root"] / "random"
    if not random.exists():
        flags = ["--episodes", "100", "--epsilon", "1"]
        assert main(["collect", str(cartpole["run"]), *flags, "--out", str(random)]) == 0
    return random


@pytest.mark.parametrize("algo", ["bcq", "crr"])
def test_beats_the_behaviour_policy_on_a_random_dataset(cartpole: dict[str, Path], algo: str) -> None:
    random = _random_dataset(cartpole)
    behaviour = float(read(random).episode_returns.mean())
    assert behaviour < 40
    run = cartpole["root"] / f"{algo}-random"
    args = ["--data.dataset", str(random), "--trainer.eval-every", "256000", "--run-dir", str(run), "--no-progress"]
    assert main(["train", f"cartpole-{algo}", *args]) == 0
    assert _evals(run)[-1]["eval/return_mean_ci_low"] > 2 * behaviour


def test_bc_regression_clones_a_deterministic_controller(tmp_path: Path) -> None:
    """``--algo.box-loss mse``: a deterministic actor fitted by the squared error acts like the controller that made
    its dataset (a smooth function of the observation), in the run's saved policy as loaded for use."""
    import gymnasium as gym
    import numpy as np

    from pickaxe.api import load
    from pickaxe.offline.dataset import Episode, write

    def controller(obs: np.ndarray) -> np.ndarray:
        return np.clip(-1.5 * obs[..., 1:2] - 0.2 * obs[..., 2:3], -2.0, 2.0).astype(np.float32)

    env = gym.make("Pendulum-v1")
    episodes = []
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        o, a, r, term, trunc = [obs], [], [], [], []
        done = False
        while not done:
            action = controller(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            o.append(obs), a.append(action), r.append(reward), term.append(terminated), trunc.append(truncated)
            done = terminated or truncated
        episodes.append(Episode(np.array(o), np.array(a), np.array(r), np.array(term), np.array(trunc)))
    spaces = (env.observation_space, env.action_space)
    data = write(tmp_path / "data", episodes, *spaces, "t/pendulum-v0", {}, "Pendulum-v1")
    run = tmp_path / "bc"
    args = ["--data.dataset", str(data), "--algo.box-loss", "mse", "--trainer.total-steps", "153600"]  # 600 steps
    args += ["--trainer.eval-every", "153600", "--trainer.eval-episodes", "2"]
    assert main(["train", "pendulum-bc", *args, "--run-dir", str(run), "--no-progress"]) == 0
    records = [r for r in read_metrics(run) if "bc/mean_sq_error" in r]
    assert all(r["loss/policy"] == r["bc/mean_sq_error"] for r in records)  # the loss is the squared error
    assert records[-1]["bc/mean_sq_error"] < 0.1 * records[0]["bc/mean_sq_error"]  # in the policy's [-1, 1] box
    policy = load(run, "final")
    states = np.concatenate([e.obs[:-1] for e in episodes])
    acted = policy.act(states, deterministic=True)
    assert np.abs(np.asarray(acted) - controller(states)).mean() < 0.1  # env units: torque in [-2, 2]
