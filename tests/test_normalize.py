"""Observation and reward normalisation: the running statistics against numpy, frozen within a rollout (the
sampler and the learner see identical inputs), carried in the model file and the checkpoint."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pickaxe.algos.ppo import compute_targets
from pickaxe.models.normalize import RewardScaler, RunningMeanStd
from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer, evaluate_run, train

PRIOR = 1e-4  # the statistics start as mean 0, var 1 over this (pseudo-)count


def _merged(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the prior (mean 0, var 1, count PRIOR) merged with all of ``data`` at once."""
    n = len(data)
    total = PRIOR + n
    mean_x, var_x = data.mean(0), data.var(0)
    m2 = PRIOR * 1.0 + n * var_x + mean_x**2 * PRIOR * n / total
    return mean_x * n / total, m2 / total


def test_running_mean_std_matches_numpy_over_uneven_batches() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, [0.5, 2.0, 10.0], size=(1000, 3))
    rms = RunningMeanStd((3,))
    for chunk in np.split(data, [1, 7, 300, 301, 999]):  # sizes 1, 6, 293, 1, 698, 1
        rms.update(torch.from_numpy(chunk))
    mean, var = _merged(data)
    np.testing.assert_allclose(rms.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), var, rtol=1e-10)
    assert rms.count.item() == pytest.approx(1000 + PRIOR)
    assert rms.mean.dtype == torch.float64


def test_normalised_values_are_standardised_and_clipped() -> None:
    rms = RunningMeanStd((2,), clip=2.0)
    rms.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]], dtype=torch.float64))
    out = rms(torch.tensor([[1.0, 20.0], [100.0, -100.0]]))
    mean, var = _merged(np.array([[0.0, 10.0], [2.0, 30.0]]))
    expected = np.clip((np.array([[1.0, 20.0], [100.0, -100.0]]) - mean) / np.sqrt(var + 1e-8), -2.0, 2.0)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    assert out[1].tolist() == [2.0, -2.0]


def test_reward_scaler_divides_by_the_std_of_the_discounted_return() -> None:
    # one env, gamma 0.5: returns 1, 1 + 0.5 = 1.5, then the episode ends and the next starts at 1 again
    scaler = RewardScaler(gamma=0.5, clip=10.0)
    reward = torch.tensor([[1.0], [1.0], [1.0]])
    done = torch.tensor([[False], [True], [False]])
    scaled = scaler.scale(reward, done)
    _, var = _merged(np.array([1.0, 1.5, 1.0]))
    np.testing.assert_allclose(scaled.numpy().ravel(), 1.0 / math.sqrt(var + 1e-8), rtol=1e-6)
    assert scaler.ret.tolist() == [1.0]  # the open episode's return carries into the next rollout
    scaler.scale(torch.tensor([[2.0]]), torch.tensor([[False]]))
    _, var2 = _merged(np.array([1.0, 1.5, 1.0, 2.5]))
    assert scaler.stats.var.item() == pytest.approx(var2, rel=1e-12)


def _norm_cfg(**algo):
    cfg = get_recipe("cartpole-ppo")
    cfg.algo = replace(cfg.algo, normalize_obs=True, normalize_reward=True, epochs=2, **algo)
    cfg.env = replace(cfg.env, eval_envs=2, vectorization="sync")
    cfg.trainer = replace(cfg.trainer, total_steps=1024, eval_every=512, eval_episodes=2, target_return=None)
    return cfg


def test_sampler_and_learner_see_identical_inputs_so_the_first_ratio_is_one() -> None:
    trainer = build_trainer(_norm_cfg())
    algo, collector = trainer.algo, trainer.collector
    algo.update(collector.collect())  # the statistics now differ from the identity
    assert algo.policy.obs_norm.count.item() > 256
    batch = collector.collect()
    mean_before = algo.policy.obs_norm.mean.clone()
    data = compute_targets(algo.policy, algo.rollout, batch)
    with torch.no_grad():
        # the sampler acted on one row per env at a time: fed those rows, the learner gives the sampler's bits
        steps = [algo.policy.evaluate_actions(batch["obs"][t], batch["action"][t]) for t in range(batch.shape[0])]
        logprob, _, value = algo.policy.evaluate_actions(data["obs"], data["action"])
    assert torch.equal(torch.stack([lp for lp, _, _ in steps]).flatten(), data["logprob"])
    assert torch.equal(torch.stack([v for _, _, v in steps]).flatten(), data["value"])
    # the whole minibatch at once: the same up to the BLAS's rounding of a 256-row product against an 8-row one
    # (MKL on AVX-512 rounds 2-wide outputs differently), so the first ratio is 1 within ~1e-7
    torch.testing.assert_close(logprob, data["logprob"], rtol=0, atol=1e-6)
    torch.testing.assert_close(value, data["value"], rtol=0, atol=1e-5)
    metrics = algo.update(batch)
    assert metrics["loss/policy"] == metrics["loss/policy"]  # finite update
    assert not torch.equal(algo.policy.obs_norm.mean, mean_before)  # updated once, after learning from the rollout


def test_rewards_are_scaled_for_the_learner_but_logged_raw() -> None:
    trainer = build_trainer(_norm_cfg())
    batch = trainer.collector.collect()
    raw = batch["reward"].clone()
    trainer.algo.update(batch)
    assert torch.all(raw == 1.0)  # CartPole's reward
    assert not torch.allclose(batch["reward"], raw)  # the learner's rewards are scaled
    returns = [r for r, _ in trainer.collector.episodes]
    assert returns and all(float(r).is_integer() for r in returns)  # logged returns are the env's


def test_evaluation_after_loading_the_model_equals_the_runs_own(tmp_path: Path) -> None:
    cfg = _norm_cfg()
    result, _ = train(cfg, run_dir=tmp_path / "run")
    returns, _ = evaluate_run(cfg, tmp_path / "run", episodes=cfg.trainer.eval_episodes)
    assert float(returns.mean()) == result.eval_return
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert weights["policy.obs_norm.count"].item() > 1000  # the statistics are in the model file


def test_resume_is_exact_with_observation_and_reward_normalisation(tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    records = assert_classic_resume_is_exact(_norm_cfg(), tmp_path, cut=512)
    assert records[-1]["step"] == 1024
