"""SAC: the loss pieces against hand values and torch.distributions, truncation bootstraps, exact resume, seeds,
discrete SAC on CartPole, Pendulum solved within a bounded budget, and bad values refused on the command line."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tensordict import TensorDict
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from pickaxe.algos.control_configs import SACConfig
from pickaxe.algos.sac import (
    SAC,
    build_sac,
    default_target_entropy,
    discrete_sac_actor_loss,
    discrete_sac_critic_target,
    sac_actor_loss,
    sac_critic_target,
    temperature_loss,
)
from pickaxe.cli import main
from pickaxe.errors import ConfigError
from pickaxe.models.continuous import QEnsemble, SquashedGaussianActor, squashed_gaussian_logprob, tanh_log_det
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer, train
from pickaxe.train.config import ModelConfig


# ------------------------------------------------------------------------------------------------ loss pieces
def test_squashed_logprob_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    # float64: torch.distributions inverts tanh (atanh), which loses digits in float32 near |a| = 1
    mean, log_std = torch.randn(64, 3, dtype=torch.float64), torch.randn(64, 3, dtype=torch.float64).clamp(-2, 1)
    u = mean + log_std.exp() * torch.randn(64, 3, dtype=torch.float64)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()]).log_prob(torch.tanh(u))
    torch.testing.assert_close(squashed_gaussian_logprob(u, mean, log_std), reference.sum(-1))


def test_tanh_log_det_is_exact_and_stays_finite_where_the_naive_form_is_minus_infinity() -> None:
    u = torch.tensor([0.0, 0.5, -1.5, 20.0, -40.0], dtype=torch.float64)
    naive = torch.log(1 - torch.tanh(u) ** 2)
    torch.testing.assert_close(tanh_log_det(u)[:3], naive[:3])
    assert torch.isinf(naive[3:]).all()  # 1 - tanh^2 rounds to 0 in float64 already
    # log(1 - tanh(u)^2) = log(4) - 2|u| - 2 log(1 + e^{-2|u|}) ~ log 4 - 2|u| for large |u|
    torch.testing.assert_close(tanh_log_det(u)[3:], torch.tensor([math.log(4) - 40, math.log(4) - 80]).double())


def test_temperature_loss_hand_values_and_direction() -> None:
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    logp = torch.tensor([-1.0, 0.5])  # entropy estimate 0.25, above the target -1
    loss = temperature_loss(log_alpha, logp, target_entropy=-1.0)
    # -(log 0.5 * mean([-1 - 1, 0.5 - 1])) = -(-0.693147 * -1.25)
    assert loss.item() == pytest.approx(-0.8664340, abs=1e-6)
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(1.25)  # descent lowers alpha: entropy is above the target
    log_alpha.grad = None
    temperature_loss(log_alpha, torch.tensor([2.0, 3.0]), target_entropy=-1.0).backward()
    assert log_alpha.grad.item() == pytest.approx(-1.5)  # entropy -2.5 below the target: alpha rises


def test_default_target_entropy() -> None:
    assert default_target_entropy(gym.spaces.Box(-1, 1, (3,))) == -3.0
    assert default_target_entropy(gym.spaces.Discrete(4), 0.89) == pytest.approx(0.89 * math.log(4))


def test_critic_target_bootstraps_truncated_steps_and_not_terminated_ones() -> None:
    reward = torch.tensor([1.0, 1.0, 1.0])
    next_q = torch.tensor([[2.0, 5.0, 3.0], [4.0, 1.0, 3.0]])  # min over the twins: [2, 1, 3]
    next_logp = torch.tensor([0.5, -1.0, 0.0])
    terminated = torch.tensor([False, True, False])  # the third step was truncated: it still bootstraps
    y = sac_critic_target(reward, next_q, next_logp, terminated, gamma=0.99, alpha=0.2)
    torch.testing.assert_close(y, torch.tensor([1 + 0.99 * (2 - 0.1), 1.0, 1 + 0.99 * 3]))


def test_discrete_target_and_actor_loss_are_exact_expectations() -> None:
    logp = torch.log(torch.tensor([[0.25, 0.75]]))
    q = torch.tensor([[[1.0, 2.0]], [[3.0, 0.0]]])  # min over the twins: [1, 0]
    alpha = 0.5
    soft_v = 0.25 * (1 - alpha * math.log(0.25)) + 0.75 * (0 - alpha * math.log(0.75))
    y = discrete_sac_critic_target(torch.tensor([2.0]), logp, q, torch.tensor([False]), 0.9, alpha)
    assert y.item() == pytest.approx(2 + 0.9 * soft_v, rel=1e-6)
    assert discrete_sac_critic_target(torch.tensor([2.0]), logp, q, torch.tensor([True]), 0.9, alpha).item() == 2.0
    assert discrete_sac_actor_loss(logp, q, alpha).item() == pytest.approx(-soft_v, rel=1e-6)
    assert sac_actor_loss(torch.tensor([0.5]), torch.tensor([[1.0], [3.0]]), 0.2).item() == pytest.approx(0.1 - 1)


def _pendulum_sac(**algo: object) -> SAC:
    env = gym.make("Pendulum-v1")
    cfg = SACConfig(learning_starts=0, batch_size=8, **algo)  # type: ignore[arg-type]
    return build_sac(cfg, env, ModelConfig(hidden=(16,), activation="relu"), torch.device("cpu"), 0)


def test_update_learns_from_terminated_not_truncated() -> None:
    """A batch whose only step is truncated, with a huge next-state value: the critic's target must bootstrap it
    (its Q moves towards r + gamma V), so the stored terminated flag, not truncation, decides."""
    algo = _pendulum_sac(alpha=1e-6, gamma=0.99, lr=1e-2)
    batch = TensorDict(
        {
            "obs": torch.zeros(1, 1, 3),
            "action": torch.zeros(1, 1, 1),
            "reward": torch.zeros(1, 1),
            "terminated": torch.tensor([[False]]),
            "truncated": torch.tensor([[True]]),
            "next_obs": torch.zeros(1, 1, 3),
        },
        batch_size=[1, 1],
    )
    with torch.no_grad():  # make the target critic say 100 everywhere
        algo.target.biases[-1].fill_(100.0)
    before = algo.critic(torch.zeros(1, 3), torch.zeros(1, 1)).mean().item()
    algo.update(batch)
    after = algo.critic(torch.zeros(1, 3), torch.zeros(1, 1)).mean().item()
    assert after > before  # pulled up towards ~99; a terminated step would have pulled it towards 0
    batch["terminated"][:] = True
    algo2 = _pendulum_sac(alpha=1e-6, gamma=0.99, lr=1e-2)
    with torch.no_grad():
        algo2.target.biases[-1].fill_(100.0)
    before2 = algo2.critic(torch.zeros(1, 3), torch.zeros(1, 1)).mean().item()
    algo2.update(batch)
    assert algo2.critic(torch.zeros(1, 3), torch.zeros(1, 1)).mean().item() == pytest.approx(before2, abs=0.05)


def test_one_host_read_per_gradient_step(monkeypatch: pytest.MonkeyPatch) -> None:
    algo = _pendulum_sac(gradient_steps=3)
    reads = []
    for name in ("tolist", "item"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, f=original: reads.append(1) or f(t))
    batch = TensorDict(
        {k: torch.zeros(4, 1, *s) for k, s in (("obs", (3,)), ("action", (1,)), ("next_obs", (3,)))}
        | {"reward": torch.zeros(4, 1), "terminated": torch.zeros(4, 1, dtype=torch.bool)},
        batch_size=[4, 1],
    )
    metrics = algo.update(batch)
    assert len(reads) == 3
    assert {"loss/critic", "loss/actor", "loss/alpha", "sac/alpha", "sac/entropy"} <= metrics.keys()


def test_random_actions_before_learning_starts_then_the_actor_and_a_deterministic_mean() -> None:
    env = gym.make("Pendulum-v1")
    algo = build_sac(SACConfig(learning_starts=100), env, ModelConfig(hidden=(8,)), torch.device("cpu"), 0)
    with torch.no_grad():  # an actor whose pre-tanh Gaussian is N(3, e^-5): actions ~ 2 tanh(3) = 1.990
        algo.actor.net[-1].weight.zero_()
        algo.actor.net[-1].bias.copy_(torch.tensor([3.0, -5.0]))
    obs = torch.zeros(4096, 3)
    algo.set_progress(0, 1000)
    a = algo.policy.act(obs)[0]
    assert a.shape == (4096, 1) and a.min() >= -2 and a.max() <= 2
    assert a.mean().item() == pytest.approx(0.0, abs=0.05)
    assert a.std().item() == pytest.approx(4 / math.sqrt(12), rel=0.05)  # uniform over [-2, 2]
    assert algo.policy.act(obs, deterministic=True)[0].unique().tolist() == pytest.approx([2 * math.tanh(3)])
    algo.set_progress(100, 1000)
    sampled = algo.policy.act(obs)[0]
    assert sampled.mean().item() == pytest.approx(2 * math.tanh(3), abs=1e-3) and sampled.std() > 0


def test_unbounded_action_box_is_refused_with_the_fix() -> None:
    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,))
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,))

    with pytest.raises(ValueError, match=r"bounded action Box.*RescaleAction") as e:
        build_sac(SACConfig(), Unbounded(), ModelConfig(), torch.device("cpu"), 0)
    assert "\n" not in str(e.value)


def test_fixed_alpha_is_not_learned_and_bad_alpha_is_refused() -> None:
    algo = _pendulum_sac(alpha=0.3)
    assert not algo.learned.log_alpha.requires_grad
    with pytest.raises(ConfigError, match=r"algo\.alpha must be 'auto' or a number > 0"):
        SACConfig(alpha=-1.0)


def test_ensemble_members_are_independent_networks() -> None:
    q = QEnsemble(gym.spaces.Box(-1, 1, (3,)), 2, n=2, hidden=(8, 8))
    obs, act = torch.randn(5, 3), torch.rand(5, 2)
    out = q(obs, act)
    assert out.shape == (2, 5)
    out[0].sum().backward()
    assert all(w.grad[1].abs().sum() == 0 and w.grad[0].abs().sum() > 0 for w in q.weights)
    assert not torch.equal(q.weights[0][0], q.weights[0][1])  # each member has its own init


def test_actor_is_squashed_into_bounds() -> None:
    actor = SquashedGaussianActor(gym.spaces.Box(-1, 1, (3,)), 2, hidden=(8,))
    a, logp = actor.sample(torch.randn(100, 3) * 100)
    assert a.abs().max() <= 1 and torch.isfinite(logp).all()


# ------------------------------------------------------------------------------------------------ runs
def _short(recipe: str, **trainer: object):
    cfg = get_recipe(recipe)
    cfg.trainer.save_at_eval = False
    cfg.trainer.keep_policies = False
    for k, v in trainer.items():
        setattr(cfg.trainer, k, v)
    return cfg


def test_pendulum_sac_recipe_solves_pendulum() -> None:
    """The recipe as shipped (it stops at eval >= -250) on seed 0."""
    cfg = _short("pendulum-sac")
    start = time.perf_counter()
    result = build_trainer(cfg).fit()
    assert result.solved_step is not None, result.eval_return
    assert result.eval_return >= -250
    print(f"pendulum-sac solved at step {result.solved_step} in {time.perf_counter() - start:.1f} s")


def test_same_seed_same_metrics_and_another_seed_differs(tmp_path: Path) -> None:
    def run(seed: int, name: str) -> list[dict]:
        cfg = _short("pendulum-sac", total_steps=768, eval_every=768, eval_episodes=2)
        cfg.algo.learning_starts, cfg.algo.gradient_steps, cfg.env.eval_envs, cfg.seed = 256, 4, 2, seed
        train(cfg, tmp_path / name)
        return read_metrics(tmp_path / name, deterministic=True)

    a, b, c = run(0, "a"), run(0, "b"), run(1, "c")
    assert any("loss/critic" in r for r in a)
    assert a == b
    assert a != c


def test_discrete_sac_improves_on_cartpole() -> None:
    cfg = _short("cartpole-dqn", total_steps=3_000, eval_every=500, target_return=None)
    cfg.algo = SACConfig(lr=3e-3, gamma=0.99, tau=0.01, batch_size=128, learning_starts=500, gradient_steps=8)
    cfg.model = ModelConfig(hidden=(64, 64), activation="relu")
    cfg.collector.steps, cfg.env.num_envs = 32, 4
    result = build_trainer(cfg).fit()
    evals = [h["eval/return_mean"] for h in result.history if "eval/return_mean" in h]
    assert evals[0] < 60 and max(evals) > 150, evals  # seed 0: [21, 10, 10, 10, 313, 187]


def test_bad_value_on_the_command_line_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "pendulum-sac", "--algo.tau", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "algo.tau" in err and "<= 1" in err


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pickaxe.cli", *args]


def test_killed_and_resumed_sac_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    """The tests/test_resume.py pattern: SIGKILLed while writing its second checkpoint, resumed to the end, the
    run ends with the same weights and metrics as one never stopped (replay, its RNG, optimizer, temperature,
    targets and the random-action phase all restored)."""
    args = [
        "--trainer.total-steps", "768", "--save-every", "128", "--trainer.eval-every", "384",
        "--algo.learning-starts", "256", "--algo.gradient-steps", "4", "--env.eval-envs", "2",
        "--trainer.eval-episodes", "2", "--no-progress",
    ]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "pendulum-sac", *args, "--run-dir", str(a)]) == 0  # uninterrupted, in this process
    env = {**os.environ, "PICKAXE_FAULT": "checkpoint-write:2"}
    proc = subprocess.run(_cmd("train", "pendulum-sac", *args, "--run-dir", str(b)), env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    subprocess.run(_cmd("resume", str(b), "--no-progress"), check=True, capture_output=True)
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    ma, mb = read_metrics(a, deterministic=True), read_metrics(b, deterministic=True)
    assert any("loss/critic" in r for r in ma)
    assert ma == mb
    assert "resume is exact" in (b / "events.jsonl").read_text()


@pytest.mark.parametrize("tau", [0.25, 1.0])
def test_polyak_moves_the_target_critics_tau_of_the_way_to_the_online_ones(tau: float) -> None:
    """After a gradient step the target critics are ``(1 - tau) target + tau critic`` (the critic after its step;
    it is never pulled towards the target)."""
    algo = _pendulum_sac(tau=tau, gradient_steps=1)
    with torch.no_grad():
        for p in algo.target.parameters():
            p.add_(0.5)
    target0 = [p.clone() for p in algo.target.parameters()]
    batch = TensorDict(
        {k: torch.randn(8, 1, *s) for k, s in (("obs", (3,)), ("action", (1,)), ("next_obs", (3,)))}
        | {"reward": torch.randn(8, 1), "terminated": torch.zeros(8, 1, dtype=torch.bool)},
        batch_size=[8, 1],
    )
    algo.update(batch)
    for t0, t, o in zip(target0, algo.target.parameters(), algo.critic.parameters(), strict=True):
        torch.testing.assert_close(t, (1 - tau) * t0 + tau * o)
        assert not torch.equal(o, t0)


def test_critic_lr_and_target_entropy_scale_take_effect() -> None:
    algo = _pendulum_sac(lr=1e-3, critic_lr=3e-3)
    batch = TensorDict(
        {k: torch.zeros(4, 1, *s) for k, s in (("obs", (3,)), ("action", (1,)), ("next_obs", (3,)))}
        | {"reward": torch.zeros(4, 1), "terminated": torch.zeros(4, 1, dtype=torch.bool)},
        batch_size=[4, 1],
    )
    algo.update(batch)
    assert [g["lr"] for g in algo.optimizer.param_groups] == [3e-3, 1e-3, 1e-3]  # critics, actor, temperature
    cfg = SACConfig(target_entropy_scale=0.5)
    discrete = build_sac(cfg, gym.make("CartPole-v1"), ModelConfig(hidden=(8,)), torch.device("cpu"), 0)
    assert discrete.target_entropy == pytest.approx(0.5 * math.log(2))


def test_metrics_are_means_over_the_gradient_steps() -> None:
    algo = _pendulum_sac(alpha=0.2, gradient_steps=3)
    batch = TensorDict(
        {k: torch.zeros(4, 1, *s) for k, s in (("obs", (3,)), ("action", (1,)), ("next_obs", (3,)))}
        | {"reward": torch.zeros(4, 1), "terminated": torch.zeros(4, 1, dtype=torch.bool)},
        batch_size=[4, 1],
    )
    metrics = algo.update(batch)
    assert metrics["sac/alpha"] == pytest.approx(0.2) and "loss/alpha" not in metrics  # fixed: 0.2 at each step
