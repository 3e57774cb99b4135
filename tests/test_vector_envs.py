"""Numpy-vectorised env backends (pickaxe.envs.vector): the same numbers as gymnasium's envs, exact resume, and
clear errors where a backend does not apply."""

import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from pickaxe.envs.make import make
from pickaxe.envs.vector import NumpyCartPole, VectorBackendError
from pickaxe.models import ActorCritic
from pickaxe.recipes import get_recipe
from pickaxe.rollout import Collector
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import resume, train


def _step_both(n: int, steps: int, **kwargs: int) -> tuple[int, int]:
    """Step a sync and a vector CartPole with the same actions; assert every output matches.

    Returns the number of episode ends and of truncations."""
    a = make("CartPole-v1", n, seed=3, **kwargs)
    b = make("CartPole-v1", n, seed=3, vectorization="vector", **kwargs)
    oa, _ = a.reset()
    ob, _ = b.reset()
    np.testing.assert_array_equal(oa, ob)
    rng = np.random.default_rng(0)
    ends = truncations = 0
    for _ in range(steps):
        act = rng.integers(0, 2, n)
        ra, rb = a.step(act), b.step(act)
        for x, y in zip(ra[:4], rb[:4], strict=True):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        assert bool(ra[4]) == bool(rb[4])
        if ra[4]:
            np.testing.assert_array_equal(ra[4]["_final_obs"], rb[4]["_final_obs"])
            for i in np.flatnonzero(ra[4]["_final_obs"]):
                np.testing.assert_array_equal(ra[4]["final_obs"][i], rb[4]["final_obs"][i])
            ends += int(ra[4]["_final_obs"].sum())
        truncations += int(ra[3].sum())
    return ends, truncations


def test_vector_cartpole_gives_gymnasiums_numbers_bit_for_bit() -> None:
    assert _step_both(4, 400)[0] > 20  # terminations: many episodes ended and were reset from each env's own seed


def test_vector_cartpole_truncates_like_the_time_limit() -> None:
    ends, truncations = _step_both(3, 200, max_episode_steps=12)  # every episode ends within 12 steps
    assert ends >= 3 * (200 // 12) and truncations > 0


def test_collector_resumed_mid_episode_on_vector_envs_equals_uninterrupted() -> None:
    torch.manual_seed(0)
    policy = ActorCritic.for_env(make("CartPole-v1", 1))
    full = Collector(make("CartPole-v1", 4, seed=7, vectorization="vector"), policy, steps=64)
    torch.manual_seed(1)
    full.collect()
    state = full.state_dict()
    assert (state["ep_length"] > 0).any()  # the cut is mid-episode
    rng = torch.get_rng_state()
    expected = full.collect(256)
    resumed = Collector(make("CartPole-v1", 4, seed=99, vectorization="vector"), policy, steps=64)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    got = resumed.collect(256)
    for key in ("obs", "action", "reward", "terminated", "truncated", "next_obs"):
        assert torch.equal(expected[key], got[key]), key
    assert expected["terminated"].any() or expected["truncated"].any()  # episodes ended after the cut


def _ppo(tmp_path: Path, name: str) -> Path:
    cfg = get_recipe("cartpole-ppo")
    cfg.env.vectorization = "vector"
    cfg.trainer.total_steps, cfg.trainer.save_every, cfg.trainer.eval_every = 1536, 512, 512
    cfg.env.eval_envs, cfg.trainer.eval_episodes = 2, 2
    train(cfg, run_dir=tmp_path / name)
    return tmp_path / name


def test_vector_training_resumed_mid_run_equals_uninterrupted(tmp_path: Path) -> None:
    # (training on vector envs also equals training on sync envs: the envs give the same numbers, tested above)
    vec = _ppo(tmp_path, "vector")
    cut = tmp_path / "cut"
    shutil.copytree(vec, cut)
    for ckpt in (cut / "checkpoints").glob("step-*"):
        if ckpt.name != "step-000000000512":
            shutil.rmtree(ckpt)
    (cut / "checkpoints" / "latest").write_text("step-000000000512")
    resume(cut)
    assert read_metrics(cut, deterministic=True) == read_metrics(vec, deterministic=True)
    assert "resume is exact" in (cut / "events.jsonl").read_text()


def test_vector_backend_refuses_envs_it_does_not_implement() -> None:
    with pytest.raises(VectorBackendError, match=r"no numpy-vectorised implementation of 'Pendulum-v1'.*sync"):
        make("Pendulum-v1", 2, vectorization="vector")
    with pytest.raises(VectorBackendError, match=r"takes only \['max_episode_steps'\]"):
        make("CartPole-v1", 2, vectorization="vector", sutton_barto_reward=True)


def test_auto_picks_the_numpy_env_where_it_exists_and_sync_elsewhere() -> None:
    assert isinstance(make("CartPole-v1", 2, vectorization="auto").unwrapped, NumpyCartPole)
    assert isinstance(make("CartPole-v1", 2, vectorization="auto", max_episode_steps=9).unwrapped, NumpyCartPole)
    for env_id, kwargs in (("Acrobot-v1", {}), ("CartPole-v1", {"sutton_barto_reward": True})):
        assert isinstance(make(env_id, 2, vectorization="auto", **kwargs).unwrapped, gym.vector.SyncVectorEnv)


def test_cli_bad_vectorization_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-ppo", "--env.vectorization", "numpy",
         "--run-dir", str(tmp_path / "r"), "--no-progress"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "vector" in proc.stderr


@pytest.mark.slow  # importing envpool takes ~5 s
def test_envpool_backend_is_same_step_and_deterministic() -> None:
    pytest.importorskip("envpool")
    envs = make("CartPole-v1", 3, seed=5, vectorization="envpool")
    obs, _ = envs.reset()
    assert obs.shape == (3, 4)
    ends = 0
    for _ in range(60):
        obs, reward, term, trunc, info = envs.step(np.ones(3, dtype=np.int64))
        assert (reward == 1.0).all()  # no reset step (reward 0) is ever returned as a transition
        if info:
            for i in np.flatnonzero(term | trunc):
                assert abs(info["final_obs"][i][2]) > 0.2  # the pole fell in the final observation
                assert abs(obs[i][2]) <= 0.05  # and the returned one is a fresh start
                ends += 1
    assert ends >= 3
    assert set(envs.get_attr("pickaxe_state_support")) == {"deterministic"}
    again = make("CartPole-v1", 3, seed=5, vectorization="envpool")
    np.testing.assert_array_equal(again.reset()[0], envs.reset(seed=5)[0])
    # regression: run seeds are derived as any 32-bit unsigned int, and EnvPool asserted on those above int32
    big = make("CartPole-v1", 2, seed=2**32 - 1, vectorization="envpool")
    assert big.reset()[0].shape == (2, 4)
