"""GAIL: the discriminator's loss, reward and gradient penalty against hand-computed values; CartPole learnt from a
small expert dataset made here (a hand-written controller's episodes); a killed-and-resumed run ends bit for bit as an
uninterrupted one (the discriminator, its optimizer and the demonstration sampler in the checkpoint); a dataset that
does not fit the env is one line, exit status 2, before any run folder exists."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from classic_runs import assert_classic_resume_is_exact
from cli_errors import train_error
from pickaxe.algos.gail_core import (
    absorbing_value,
    discriminator_accuracy,
    discriminator_loss,
    discriminator_reward,
    gradient_penalty,
)
from pickaxe.cli import main
from pickaxe.recipes import RECIPES
from pickaxe.runs.run import read_metrics


def test_discriminator_loss_is_the_expert_and_policy_cross_entropies() -> None:
    zero = torch.zeros(3)
    assert discriminator_loss(zero, zero).item() == pytest.approx(2 * math.log(2))
    expert, policy = torch.tensor([2.0, -1.0]), torch.tensor([0.5])
    # mean(-log sigmoid(e)) + mean(-log(1 - sigmoid(p)))
    want = (math.log(1 + math.exp(-2.0)) + math.log(1 + math.exp(1.0))) / 2 + math.log(1 + math.exp(0.5))
    assert discriminator_loss(expert, policy).item() == pytest.approx(want, rel=1e-6)
    # a discriminator sure and right costs almost nothing; sure and wrong costs its logits
    assert discriminator_loss(torch.tensor([30.0]), torch.tensor([-30.0])).item() < 1e-12
    assert discriminator_loss(torch.tensor([-30.0]), torch.tensor([30.0])).item() == pytest.approx(60.0)
    assert discriminator_accuracy(torch.tensor([1.0, -1.0, 2.0, 3.0]), torch.tensor([-1.0, 1.0])) == (0.75, 0.5)


def test_discriminator_reward_forms() -> None:
    d = torch.tensor([0.8, 0.5, 0.2])  # the discriminator's probability that the pair is the expert's
    logits = torch.log(d / (1 - d))
    gail = discriminator_reward(logits, "gail")  # -log(1 - D)
    assert gail.tolist() == pytest.approx([math.log(5.0), math.log(2.0), math.log(1.25)], rel=1e-6)
    airl = discriminator_reward(logits, "airl")  # log D - log(1 - D)
    assert airl.tolist() == pytest.approx([math.log(4.0), 0.0, -math.log(4.0)], abs=1e-6)
    far = discriminator_reward(torch.tensor([-100.0, 100.0]), "gail")  # finite however sure it is
    assert far[0].item() == pytest.approx(math.exp(-100.0), rel=1e-4) and far[1].item() == pytest.approx(100.0)
    with pytest.raises(ValueError, match="gail or airl"):
        discriminator_reward(logits, "other")


def test_gradient_penalty_of_a_linear_discriminator() -> None:
    w = torch.tensor([3.0, 4.0], requires_grad=True)  # ||w|| = 5: the penalty is (5 - 1)^2 at every mix

    def logit(x: torch.Tensor) -> torch.Tensor:
        return x @ w

    expert, policy = torch.randn(6, 2), torch.randn(6, 2)
    penalty = gradient_penalty(logit, expert, policy, torch.rand(6))
    assert penalty.item() == pytest.approx(16.0)
    (grad,) = torch.autograd.grad(penalty, w)  # d/dw (||w|| - 1)^2 = 2 (||w|| - 1) w / ||w||
    assert grad.tolist() == pytest.approx([2 * 4 * 3 / 5, 2 * 4 * 4 / 5])
    unit = torch.tensor([0.6, 0.8])
    assert gradient_penalty(lambda x: x @ unit, expert, policy, torch.rand(6)).item() == pytest.approx(0.0, abs=1e-12)


def test_absorbing_value_is_the_discounted_reward_of_staying_absorbed() -> None:
    # gamma r + gamma^2 r + ... = gamma r / (1 - gamma)
    assert absorbing_value(torch.tensor(-2.0), 0.9).item() == pytest.approx(-18.0)
    assert absorbing_value(torch.tensor(1.0), 0.99).item() == pytest.approx(99.0)


def test_absorbing_state_rewards_terminations_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminated step's reward gains gamma * r_abs / (1 - gamma) (r_abs: the discriminator's reward for the
    absorbing row: zero observation and action, flag 1); truncated and ongoing steps keep the pair's reward."""
    from pickaxe.algos.gail import GAIL, Discriminator
    from pickaxe.algos.imitation_configs import GAILConfig
    from pickaxe.algos.ppo import PPO
    from pickaxe.data.batch import Batch
    from pickaxe.models.actor_critic import ActorCritic

    obs_space, act_space = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2)
    torch.manual_seed(0)
    disc = Discriminator(obs_space, act_space, 8, absorbing=True)
    rows = disc.inputs(torch.ones(2, 3), torch.tensor([1, 0]))
    assert rows.shape == (2, 6) and rows[:, -1].tolist() == [0.0, 0.0]
    assert disc.absorbing_rows(2).tolist() == [[0.0] * 5 + [1.0]] * 2
    cfg = GAILConfig(reward="airl", absorbing=True, disc_steps=0, gamma=0.9, normalize_reward=False)
    algo = GAIL(ActorCritic(obs_space, act_space), disc, cfg)
    algo.use_demonstrations(object())
    seen: dict[str, torch.Tensor] = {}

    def ppo_update(self: PPO, batch: Batch) -> dict[str, float]:
        seen["reward"] = batch["reward"].clone()
        return {}

    monkeypatch.setattr(PPO, "update", ppo_update)
    obs = torch.randn(3, 1, 3)
    action = torch.tensor([[0], [1], [1]])
    batch = Batch(
        {
            "obs": obs,
            "action": action,
            "reward": torch.ones(3, 1),
            "terminated": torch.tensor([[False], [True], [False]]),
            "truncated": torch.tensor([[False], [False], [True]]),
        },
        batch_size=[3, 1],
    )
    metrics = algo.update(batch)
    with torch.no_grad():
        pair = disc.logits(disc.inputs(obs.flatten(0, 1), action.flatten(0, 1)))
        absorbed = disc.logits(disc.absorbing_rows(1))[0]
    expected = pair.clone()
    expected[1] += 0.9 * absorbed / 0.1
    assert seen["reward"].flatten().tolist() == pytest.approx(expected.tolist(), rel=1e-6)
    assert metrics["gail/absorbing_reward"] == pytest.approx(float(absorbed))


def _controller(obs: np.ndarray) -> int:
    """A hand-written CartPole controller that balances for the full 500 steps."""
    return int(obs[2] + 0.5 * obs[3] + 0.01 * obs[0] + 0.1 * obs[1] > 0)


def _demonstrations(out: Path, episodes: int, act: Callable[[np.ndarray], int]) -> Path:
    """``episodes`` CartPole episodes of ``act`` as a Minari dataset at ``out``."""
    pytest.importorskip("minari")
    from pickaxe.envs.make import spaces_of
    from pickaxe.offline.dataset import Episode, write

    env = gym.make("CartPole-v1")
    recorded = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        states, actions, rewards, terminated, truncated = [obs], [], [], [], []
        while True:
            action = act(obs)
            obs, reward, term, trunc, _ = env.step(action)
            states.append(obs)
            actions.append(action)
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                break
        recorded.append(
            Episode(
                np.array(states, np.float32),
                np.array(actions, np.int64),
                np.array(rewards, np.float64),
                np.array(terminated),
                np.array(truncated),
            )
        )
    obs_space, action_space = spaces_of("CartPole-v1")
    refs = {"ref_min_score": 20.0, "ref_max_score": 500.0}  # D4RL references, as pickaxe collect records them
    name = f"cartpole/{out.name}-v0"
    return write(out, recorded, obs_space, action_space, name, refs, env_id="CartPole-v1")


@pytest.fixture(scope="module")
def expert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four 500-step episodes of the controller as a Minari dataset."""
    return _demonstrations(tmp_path_factory.mktemp("gail") / "expert", 4, _controller)


@pytest.fixture(scope="module")
def random_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eighty episodes of uniformly random actions (about 22 steps each, every one terminated)."""
    rng = np.random.default_rng(0)
    return _demonstrations(tmp_path_factory.mktemp("gail") / "random", 80, lambda obs: int(rng.integers(2)))


def _config(data: Path, **trainer: int) -> object:
    cfg = RECIPES["cartpole-gail"].make()
    cfg.data.dataset = str(data)
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return cfg


def _fit(cfg: object, run_dir: Path) -> list[dict]:
    """Train ``cfg`` into a new run at ``run_dir``; its metric records."""
    from pickaxe.runs.run import Run
    from pickaxe.train.build import build_trainer

    run = Run(run_dir, config=cfg.to_dict(), seed=cfg.seed)
    trainer = build_trainer(cfg, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
        run.close()
    return read_metrics(run_dir)


def _best_eval(records: list[dict]) -> float:
    return max(r["eval/return_mean"] for r in records if "eval/return_mean" in r)


def test_gail_learns_cartpole_from_an_expert_dataset(expert: Path, tmp_path: Path) -> None:
    from pickaxe.train.build import run_evaluation_setup
    from pickaxe.train.evaluate import evaluate
    from pickaxe.utils import seed_everything

    cfg = _config(expert, total_steps=20_480, eval_every=2_560)  # stops once an evaluation reaches 475
    seed_everything(cfg.seed)
    envs, algo, device = run_evaluation_setup(cfg)  # the policy as initialised at this seed
    try:
        untrained = float(evaluate(algo.policy, envs, 10, device)[0].mean())
    finally:
        envs.close()
    records = _fit(cfg, tmp_path / "run")
    evals = [r for r in records if "eval/return_mean" in r]
    best = _best_eval(records)
    assert best >= 475 and best - untrained >= 250  # the controller's episodes last 500 steps
    for r in evals:  # scored against the dataset's references, as an offline run is
        assert r["eval/normalized_score"] == pytest.approx(100 * (r["eval/return_mean"] - 20.0) / 480.0)
    updates = [r for r in records if "loss/discriminator" in r]
    assert all(r["gail/env_reward_mean"] == 1.0 for r in updates)  # the env's reward, logged, never learned from
    assert all(r["gail/reward_mean"] > 0 for r in updates)  # -log(1 - D) > 0
    assert min(r["loss/discriminator"] for r in updates) < 2 * math.log(2)  # it tells the two apart


def test_airl_with_absorbing_states_imitates_the_demonstrations(
    expert: Path, random_demos: Path, tmp_path: Path
) -> None:
    """With AIRL's reward (no sign bias) and episode ends as absorbing states, what the policy learns comes from the
    demonstrations: the controller's never-ending episodes teach balancing, a random policy's short ones do not (on
    CartPole the default ``-log(1 - D)`` solves the task even with an untrained discriminator)."""
    # stops once an evaluation reaches 475; the budget covers where that happened on seeds 0-2 of the benchmark
    # (10,240 to 30,208 env steps) and on two machines for this seed (<= 20,480 and 30,720)
    cfg = _config(expert, total_steps=40_960, eval_every=2_560)
    cfg.algo.reward, cfg.algo.absorbing = "airl", True
    records = _fit(cfg, tmp_path / "expert")
    assert _best_eval(records) >= 475
    absorbed = [r["gail/absorbing_reward"] for r in records if "gail/absorbing_reward" in r]
    assert absorbed[-1] < absorbed[0] and absorbed[-1] < 0  # the expert never ends an episode: ending is the policy's
    cfg = _config(random_demos, total_steps=10_240, eval_every=2_560)
    cfg.algo.reward, cfg.algo.absorbing = "airl", True
    assert _best_eval(_fit(cfg, tmp_path / "random")) < 150


def test_killed_gail_run_resumes_exactly(expert: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = _config(expert, total_steps=3_072, eval_every=1_024, eval_episodes=2)
    cfg.env.eval_envs = 2
    cfg.algo.disc_steps = 3
    cfg.algo.grad_penalty = 1.0
    cfg.algo.absorbing = True
    # stopped at the checkpoint of step 2,048 and resumed in a fresh Trainer (tests/classic_runs.py)
    records = assert_classic_resume_is_exact(cfg, tmp_path, cut=2_048)
    assert any("loss/grad_penalty" in r for r in records)
    # SIGKILLed after its 10th update (2,560 env steps; the last checkpoint at 2,048) and resumed
    killed = tmp_path / "killed"
    flags = [
        "--data.dataset", str(expert), "--trainer.total-steps", "3072", "--trainer.eval-every", "1024",
        "--trainer.eval-episodes", "2", "--env.eval-envs", "2", "--algo.disc-steps", "3", "--algo.grad-penalty", "1",
        "--algo.absorbing", "true",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "pickaxe.cli", "train", "cartpole-gail", *flags, "--run-dir", str(killed)]
    proc = subprocess.run(
        [*cmd, "--no-progress"], env={**os.environ, "PICKAXE_FAULT": "iteration:10"}, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL
    assert main(["resume", str(killed), "--no-progress"]) == 0
    full, after = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("full", "killed"))
    assert full.keys() == after.keys() and all(torch.equal(full[k], after[k]) for k in full)
    assert read_metrics(killed, deterministic=True) == records
    assert "resume is exact" in (killed / "events.jsonl").read_text()


def test_demonstrations_must_fit_the_run(expert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = str(tmp_path / "run")
    err = train_error(capsys, "pendulum-gail", "--data.dataset", str(expert), "--run-dir", run_dir)
    assert "do not fit env Pendulum-v1" in err
    err = train_error(capsys, "cartpole-gail", "--run-dir", run_dir)
    assert "gail imitates demonstrations: add --data.dataset DIR" in err
    err = train_error(
        capsys, "cartpole-gail", "--data.dataset", str(expert), "--dist.learners", "2", "--run-dir", run_dir
    )
    assert "drop --dist.learners" in err
    assert not Path(run_dir).exists()
