"""Observation normalisation of the offline algorithms (``--algo.normalize-obs``): the statistics are the dataset's
mean and std, computed once and kept frozen as buffers of every network (actor, critics, targets); the networks see
``(obs - mean) / (std + 1e-3)``, so a dataset whose observations are offset by 1e3 learns as the un-offset one; a
saved run acts with them (``pickaxe.load``, its own evaluation), a warm-started online run carries them, and a killed
run resumes exactly."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import pickaxe
from classic_runs import assert_killed_run_resumes_exactly
from cli_errors import train_error
from offline_data import random_dataset
from pickaxe.algos.offline_configs import TD3BCConfig, is_offline
from pickaxe.algos.td3_bc import build_td3_bc
from pickaxe.cli import main
from pickaxe.models.normalize import NormalizedEncoder, fit_obs_norm, obs_norms
from pickaxe.offline.dataset import Transitions, read
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.recipes import RECIPES
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer
from pickaxe.train.config import ModelConfig, OnlineStartConfig

pytest.importorskip("minari")

SHORT = ["--trainer.total-steps", "4096", "--trainer.eval-every", "4096", "--trainer.eval-episodes", "2"]
"""Two iterations of 2,048 transitions: 16 gradient steps, one evaluation of 2 episodes."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two episodes of random Pendulum actions as a dataset, and short pendulum-td3-bc, pendulum-iql and pendulum-cql
    runs on it with ``--algo.normalize-obs true``."""
    root = tmp_path_factory.mktemp("obsnorm")
    data = random_dataset(root / "data", "Pendulum-v1")
    out = {"root": root, "data": data}
    for algo in ("td3-bc", "iql", "cql"):
        out[algo] = run = root / algo
        args = ["--data.dataset", str(data), *SHORT, "--algo.normalize-obs", "true"]
        assert main(["train", f"pendulum-{algo}", *args, "--run-dir", str(run), "--no-progress"]) == 0
    return out


def _dataset_stats(data: Path) -> tuple[np.ndarray, np.ndarray, int]:
    obs = read(data).arrays["obs"].astype(np.float64)
    return obs.mean(0), obs.std(0), len(obs)


def test_the_statistics_are_the_datasets_mean_and_std_in_every_network(runs: dict[str, Path]) -> None:
    mean, std, n = _dataset_stats(runs["data"])
    assert n == 400 and np.all(np.abs(mean) + np.abs(std - 1) > 0.05)  # far from the identity: a real check
    for algo, names in (("td3-bc", {"actor", "critic", "q_target", "actor_target"}),
                        ("iql", {"actor", "critic", "q_target", "value"})):  # fmt: skip
        saved = load_file(str(runs[algo] / "model.safetensors"))
        for name in names:  # every network of the final model, targets included, holds the dataset's statistics
            np.testing.assert_allclose(saved[f"{name}.encoder.norm.mean"].numpy(), mean, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(saved[f"{name}.encoder.norm.var"].numpy() ** 0.5, std, rtol=1e-12)
            assert saved[f"{name}.encoder.norm.count"].item() == n
            assert saved[f"{name}.encoder.norm.mean"].dtype == torch.float64


def test_the_policy_acts_on_normalised_observations_after_loading(runs: dict[str, Path]) -> None:
    mean, std, _ = _dataset_stats(runs["data"])
    policy = pickaxe.load(runs["td3-bc"], checkpoint="final")
    actor = policy.algo.actor
    assert isinstance(actor.encoder, NormalizedEncoder)
    obs = read(runs["data"]).arrays["obs"][:32]
    expected = (obs.astype(np.float64) - mean) / (std + 1e-3)
    with torch.no_grad():
        inner = torch.tanh(actor.net(actor.encoder.encoder(torch.as_tensor(expected, dtype=torch.float32))))
    scale = policy.action_space.high  # Pendulum: [-2, 2]
    np.testing.assert_allclose(policy.act(obs), inner.numpy() * scale, rtol=1e-5, atol=1e-6)
    # its own evaluation (the run's eval envs, the same episodes) repeats the return the run logged for these weights
    logged = [r for r in read_metrics(runs["td3-bc"]) if "eval/return_mean" in r][-1]["eval/return_mean"]
    assert policy.evaluate(2).mean_return == pytest.approx(logged, rel=1e-6)


def test_collect_from_a_normalised_run_acts_on_normalised_observations(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "collected"
    flags = ["--episodes", "1", "--ref-min", "-1500", "--ref-max", "0", "--checkpoint", "final"]
    assert main(["collect", str(runs["td3-bc"]), *flags, "--out", str(out)]) == 0
    played = read(out).arrays
    policy = pickaxe.load(runs["td3-bc"], checkpoint="final")
    np.testing.assert_allclose(played["action"], policy.act(played["obs"]), rtol=1e-5, atol=1e-6)


def test_fqe_scores_a_normalised_run_with_its_statistics(runs: dict[str, Path]) -> None:
    run = runs["td3-bc"]
    assert main(["eval", str(run), "--checkpoints", "all", "--fqe", "--fqe.steps", "50", "--no-env"]) == 0
    rows = json.loads((run / "eval" / "checkpoints.json").read_text())["rows"]
    value = rows[-1]["metrics"]["eval/fqe_value"]
    assert value["n"] == 2 and np.isfinite(value["mean"])


def _trained(transitions: Transitions, normalize: bool, steps: int = 24) -> torch.nn.Module:
    """A TD3+BC actor after ``steps`` gradient steps of 64 on ``transitions`` (the same seeds every call)."""
    torch.manual_seed(0)
    sampler = DatasetSampler(transitions, 64 * steps, seed=1)
    algo = build_td3_bc(TD3BCConfig(normalize_obs=normalize, batch_size=64), sampler, ModelConfig(hidden=(32, 32)),
                        torch.device("cpu"), 0)  # fmt: skip
    if normalize:
        assert fit_obs_norm(algo.networks().values(), sampler.data["obs"]) == 4
    algo.update(sampler.collect())
    return algo.policy


def test_observations_offset_by_1e3_learn_as_the_unoffset_ones(runs: dict[str, Path]) -> None:
    data = read(runs["data"])
    shifted = copy.deepcopy(data)
    for key in ("obs", "next_obs"):
        shifted.arrays[key] = (data.arrays[key].astype(np.float64) + 1e3).astype(np.float32)
    shifted.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    probe = torch.as_tensor(data.arrays["obs"][::10])
    near = probe + 1e3
    policies = {(norm, shift): _trained(shifted if shift else data, norm) for norm in (True, False) for shift in (0, 1)}
    with torch.no_grad():
        acts = {k: p.act(near if k[1] else probe, True)[0] for k, p in policies.items()}
    assert torch.allclose(acts[True, 0], acts[True, 1], atol=2e-3), (acts[True, 0] - acts[True, 1]).abs().max()
    # without normalisation the offset changes what is learned (the check above is not vacuous)
    assert (acts[False, 0] - acts[False, 1]).abs().max() > 0.1


def test_a_warm_started_online_run_carries_the_statistics(runs: dict[str, Path]) -> None:
    saved_by = {"pendulum-td3": "td3-bc", "pendulum-iql-online": "iql", "pendulum-cql-online": "cql"}
    for recipe, source in saved_by.items():
        cfg = RECIPES[recipe].make()
        assert cfg.algo.normalize_obs is False
        cfg.warm_start = OnlineStartConfig(run=str(runs[source]))
        cfg.check()
        assert cfg.algo.normalize_obs is True  # taken from the offline run's config, recorded in this run's
        trainer = build_trainer(cfg)
        try:
            saved = load_file(str(runs[source] / "model.safetensors"))
            for name, net in trainer.algo.networks().items():
                norms = obs_norms([net])
                assert len(norms) == 1, name
                for key in ("mean", "var", "count"):
                    assert torch.equal(getattr(norms[0], key), saved[f"{name}.encoder.norm.{key}"]), (name, key)
            probe = torch.as_tensor(read(runs["data"]).arrays["obs"][:16])
            offline = pickaxe.load(runs[source], checkpoint="final").module
            with torch.no_grad():
                assert torch.equal(trainer.algo.policy.act(probe, True)[0], offline.act(probe, True)[0])
        finally:
            trainer.close()


def test_online_algorithms_take_statistics_only_from_a_warm_start(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--run-dir", str(tmp_path / "never")]
    for recipe in ("pendulum-td3", "pendulum-iql-online"):
        err = train_error(capsys, recipe, "--algo.normalize-obs", "true", *out)
        assert "add --warm-start.run DIR or drop --algo.normalize-obs" in err
    err = train_error(capsys, "pendulum-ddpg", "--algo.normalize-obs", "true", *out)  # DDPG continues no offline run
    assert err.strip().endswith("(--warm-start.run); drop --algo.normalize-obs"), err
    assert not (tmp_path / "never").exists()


def test_a_killed_normalised_run_resumes_exactly(runs: dict[str, Path], tmp_path: Path) -> None:
    args = [
        "--data.dataset", str(runs["data"]), "--algo.normalize-obs", "true", "--trainer.total-steps", "8192",
        "--collector.steps", "512", "--algo.batch-size", "128", "--trainer.eval-every", "4096",
        "--trainer.eval-episodes", "2", "--env.eval-envs", "2", "--save-every", "2048",
    ]  # fmt: skip
    _, b = assert_killed_run_resumes_exactly("pendulum-td3-bc", args, tmp_path, "iteration:10")
    tb = load_file(str(b / "model.safetensors"))
    mean, _, n = _dataset_stats(runs["data"])
    np.testing.assert_allclose(tb["actor.encoder.norm.mean"].numpy(), mean, rtol=1e-12, atol=1e-12)
    assert tb["critic.encoder.norm.count"].item() == n
    assert json.loads((b / "config.json").read_text())["algo"]["normalize_obs"] is True


def test_the_mujoco_recipes_normalise_and_the_classic_ones_do_not() -> None:
    offline = {name: r.make().algo for name, r in RECIPES.items() if is_offline(r.make().algo)}
    mujoco = {"hopper-iql", "hopper-td3-bc", "halfcheetah-iql", "halfcheetah-td3-bc"}
    assert mujoco < set(offline)
    for name, algo in offline.items():
        assert algo.normalize_obs is (name in mujoco), name
