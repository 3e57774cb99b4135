"""REINFORCE, NPG and TRPO: conjugate gradient against a direct solve on a small Fisher matrix, NPG's step, the line
search honouring the KL bound (as a function and in a whole TRPO update), the KLs against torch.distributions,
REINFORCE's loss and returns against hand values, learning CartPole, exact resume (TRPO killed mid-checkpoint), and
bad values refused in one line."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from safetensors.torch import load_file
from tensordict import TensorDict
from torch.distributions import Bernoulli, Categorical, Normal
from torch.distributions import kl_divergence as torch_kl

from pickaxe.algos.extra_configs import NPGConfig, ReinforceConfig, TRPOConfig
from pickaxe.algos.reinforce import Reinforce, reinforce_loss
from pickaxe.algos.trpo import (
    NPG,
    TRPO,
    action_distribution,
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    kl_divergence,
    natural_step,
)
from pickaxe.cli import main
from pickaxe.models.actor_critic import ActorCritic
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import build_trainer


def _spd(n: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T + 0.5 * torch.eye(n, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------- known answers
def test_conjugate_gradient_matches_a_direct_solve_on_a_small_fisher_matrix() -> None:
    fisher = _spd(5)
    b = torch.arange(1.0, 6.0, dtype=torch.float64)
    x = conjugate_gradient(lambda v: fisher @ v, b, iters=5)  # n iterations: exact up to rounding
    torch.testing.assert_close(x, torch.linalg.solve(fisher, b), rtol=1e-8, atol=1e-8)
    # fewer iterations: an approximation whose residual shrinks; more: stays at the solution (no NaN once converged)
    r2, r4 = ((fisher @ conjugate_gradient(lambda v: fisher @ v, b, k) - b).norm() for k in (2, 4))
    assert r4 < r2
    torch.testing.assert_close(
        conjugate_gradient(lambda v: fisher @ v, b, iters=50), torch.linalg.solve(fisher, b), rtol=1e-8, atol=1e-8
    )


def test_conjugate_gradient_on_the_fisher_of_a_real_policy_matches_the_explicit_hessian() -> None:
    torch.manual_seed(0)
    policy = ActorCritic(3, gym.spaces.Discrete(3), hidden=(4,))
    params = list(policy.actor.parameters())
    obs = torch.randn(16, 3)
    old = {k: v.detach() for k, v in action_distribution(policy, obs).items()}
    kl = kl_divergence("Discrete", old, action_distribution(policy, obs)).mean()
    damping = 0.1
    fvp = fisher_vector_product(kl, params, damping)
    # the explicit Fisher: the Hessian of the KL, one Fisher-vector product per basis vector
    n = sum(p.numel() for p in params)
    fisher = torch.stack([fvp(e) for e in torch.eye(n)]) - damping * torch.eye(n)
    torch.testing.assert_close(fisher, fisher.T, atol=1e-6, rtol=1e-5)
    g = torch.randn(n)
    x = conjugate_gradient(fvp, g, iters=200, residual_tol=1e-14)
    direct = torch.linalg.solve((fisher + damping * torch.eye(n)).double(), g.double()).float()
    torch.testing.assert_close(x, direct, atol=2e-3, rtol=2e-3)


def test_npg_step_is_the_natural_gradient_scaled_to_the_kl_bound() -> None:
    fisher = _spd(4, seed=1)
    g = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    max_kl = 0.01
    step, improve = natural_step(g, lambda v: fisher @ v, max_kl, cg_iters=4)
    x = torch.linalg.solve(fisher, g)
    expected = math.sqrt(2 * max_kl / float(g @ x)) * x  # sqrt(2 delta / g^T F^-1 g) F^-1 g
    torch.testing.assert_close(step, expected, rtol=1e-8, atol=1e-10)
    assert float(0.5 * step @ fisher @ step) == pytest.approx(max_kl, rel=1e-8)  # the quadratic KL is the bound
    assert float(improve) == pytest.approx(float(g @ expected), rel=1e-8)


def test_line_search_accepts_the_first_step_within_the_kl_bound() -> None:
    fisher = _spd(3, seed=2)
    step = torch.tensor([1.0, 0.5, -0.25], dtype=torch.float64)
    max_kl = 0.1
    tried: list[float] = []

    def evaluate(frac: float) -> tuple[float, float]:  # KL grows with the step; the surrogate improves along it
        tried.append(frac)
        s = frac * step
        return frac, float(0.5 * s @ fisher @ s)

    frac, tries = backtracking_line_search(evaluate, 1.0, max_kl, backtrack_coef=0.5, max_backtracks=20)
    kl_of = [evaluate(f)[1] for f in list(tried)]
    assert 0 < frac < 1 and tries == len(kl_of)
    assert kl_of[tries - 1] <= max_kl  # the accepted step honours the bound...
    assert all(k > max_kl for k in kl_of[: tries - 1])  # ...and every larger one tried broke it
    assert tried[:tries] == [0.5**k for k in range(tries)]


def test_line_search_refuses_steps_that_do_not_improve_or_are_not_finite() -> None:
    assert backtracking_line_search(lambda f: (-1.0, 0.0), 1.0, 0.1, max_backtracks=3) == (0.0, 4)
    assert backtracking_line_search(lambda f: (float("nan"), 0.0), 1.0, 0.1, max_backtracks=2) == (0.0, 3)
    # accept_ratio: a step must realise that share of the linear prediction
    frac, _ = backtracking_line_search(lambda f: (0.05 * f, 0.0), 1.0, 0.1, max_backtracks=3, accept_ratio=0.1)
    assert frac == 0.0
    assert backtracking_line_search(lambda f: (0.5 * f, 0.0), 1.0, 0.1, accept_ratio=0.1)[0] == 1.0


def test_kl_divergences_match_torch_distributions() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(6, 4), torch.randn(6, 4)
    want = torch_kl(Categorical(logits=a), Categorical(logits=b))
    torch.testing.assert_close(kl_divergence("Discrete", {"out": a}, {"out": b}), want)
    la, lb = torch.randn(6, 4) * 0.3, torch.randn(6, 4) * 0.3
    want = torch_kl(Normal(a, la.exp()), Normal(b, lb.exp())).sum(-1)
    got = kl_divergence("Box", {"out": a, "log_std": la}, {"out": b, "log_std": lb})
    torch.testing.assert_close(got, want)
    want = torch_kl(Categorical(logits=a[:, :3]), Categorical(logits=b[:, :3])) + torch_kl(
        Categorical(logits=a[:, 3:]), Categorical(logits=b[:, 3:])
    )
    torch.testing.assert_close(kl_divergence("MultiDiscrete", {"out": a}, {"out": b}, [3, 1]), want)
    want = torch_kl(Bernoulli(logits=a), Bernoulli(logits=b)).sum(-1)
    torch.testing.assert_close(kl_divergence("MultiBinary", {"out": a}, {"out": b}), want)


def _rollout(T: int = 16, N: int = 4, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(T, N, generator=g) < 0.1
    return TensorDict(
        {
            "obs": torch.randn(T, N, 3, generator=g),
            "action": torch.randint(2, (T, N), generator=g),
            "reward": torch.rand(T, N, generator=g),
            "terminated": terminated,
            "truncated": torch.zeros(T, N, dtype=torch.bool),
            "next_obs": torch.randn(T, N, 3, generator=g),
            "logprob": torch.zeros(T, N),
            "value": torch.zeros(T, N),
        },
        batch_size=[T, N],
    )


@pytest.mark.parametrize("algo", ["npg", "trpo"])
def test_a_whole_update_keeps_the_sampled_kl_within_the_bound(algo: str) -> None:
    torch.manual_seed(0)
    policy = ActorCritic(3, gym.spaces.Discrete(2), hidden=(16,))
    cls, cfg = (NPG, NPGConfig) if algo == "npg" else (TRPO, TRPOConfig)
    learner = cls(policy, cfg(max_kl=0.005, critic_epochs=1))
    batch = _rollout()
    with torch.no_grad():
        batch.set("value", policy.value(batch["obs"].flatten(0, 1)).view(16, 4))
    critic_before = [p.detach().clone() for p in policy.critic.parameters()]
    metrics = learner.update(batch)
    kl = metrics[f"{algo}/kl"]
    if algo == "trpo":  # the line search checks the sampled KL itself
        assert 0 < kl <= 0.005 and metrics["trpo/improvement"] > 0
    else:  # NPG's step has quadratic KL max_kl: the sampled KL is close to it
        assert kl == pytest.approx(0.005, rel=0.3)
    assert metrics[f"{algo}/expected_improvement"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(critic_before, policy.critic.parameters(), strict=True))


def test_trpo_restores_the_policy_when_no_step_is_accepted() -> None:
    torch.manual_seed(0)
    policy = ActorCritic(3, gym.spaces.Discrete(2), hidden=(16,))
    learner = TRPO(policy, TRPOConfig(max_kl=0.01, accept_ratio=1.0, max_backtracks=0, critic_epochs=1))
    before = [p.detach().clone() for p in policy.actor.parameters()]
    metrics = learner.update(_rollout())  # a first-order prediction is never fully realised on a curved surrogate
    assert metrics["trpo/step_fraction"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, policy.actor.parameters(), strict=True))


def test_reinforce_loss_and_returns_match_hand_values() -> None:
    policy = ActorCritic(1, gym.spaces.Discrete(2), hidden=(2,))
    with torch.no_grad():
        for p in policy.parameters():
            p.zero_()  # uniform policy (log 0.5), V = 0
    mb = TensorDict(
        {"obs": torch.zeros(2, 1), "action": torch.tensor([0, 1]), "advantage": torch.tensor([1.0, 3.0]),
         "return": torch.tensor([1.0, 3.0])},
        batch_size=[2],
    )  # fmt: skip
    cfg = ReinforceConfig(normalize_advantage=False, ent_coef=0.1, vf_coef=0.5)
    loss, stats = reinforce_loss(policy, mb, cfg)
    # -mean(A log 0.5) - 0.1 log 2 + 0.5 * mean((0 - G)^2) = 2 log 2 - 0.1 log 2 + 0.5 * 5
    assert loss.item() == pytest.approx(1.9 * math.log(2) + 2.5, rel=1e-6)
    assert stats["loss/value"].item() == pytest.approx(5.0)
    no_baseline = replace(cfg, baseline=False)
    assert reinforce_loss(policy, mb, no_baseline)[0].item() == pytest.approx(1.9 * math.log(2), rel=1e-6)

    # without a baseline the returns are the discounted rewards left in the episode, stopping at the rollout's end
    learner = Reinforce(ActorCritic(1, gym.spaces.Discrete(2), hidden=(2,)), replace(no_baseline, gamma=0.5))
    batch = TensorDict(
        {"obs": torch.zeros(3, 1, 1), "action": torch.zeros(3, 1, dtype=torch.long),
         "reward": torch.tensor([[1.0], [2.0], [4.0]]), "terminated": torch.tensor([[False], [True], [False]]),
         "truncated": torch.zeros(3, 1, dtype=torch.bool), "next_obs": torch.zeros(3, 1, 1),
         "logprob": torch.zeros(3, 1), "value": torch.ones(3, 1)},
        batch_size=[3, 1],
    )  # fmt: skip
    critic_before = [p.detach().clone() for p in learner.policy.critic.parameters()]
    metrics = learner.update(batch)
    torch.testing.assert_close(learner.rollout.data["return"], torch.tensor([1.0 + 0.5 * 2.0, 2.0, 4.0]))
    assert "loss/value" not in metrics
    assert all(torch.equal(a, b) for a, b in zip(critic_before, learner.policy.critic.parameters(), strict=True))


# ---------------------------------------------------------------------------------------------------- runs
def _cfg(recipe: str, steps: int, **trainer):
    cfg = get_recipe(recipe)
    cfg.env = replace(cfg.env, eval_envs=5)
    cfg.trainer = replace(cfg.trainer, total_steps=steps, eval_episodes=5, **trainer)
    return cfg


@pytest.mark.parametrize("recipe", ["cartpole-reinforce", "cartpole-npg", "cartpole-trpo"])
def test_recipe_learns_cartpole(recipe: str) -> None:
    # ~1-3 s each: seed 0 solves CartPole (eval 500) by 20k steps with every one of them (a random policy: ~20)
    result = build_trainer(_cfg(recipe, 20_480, eval_every=4_096)).fit()
    assert result.solved_step is not None and result.eval_return >= 475, result.history[-1]


def test_reinforce_without_baseline_learns_cartpole_a_little() -> None:
    cfg = _cfg("cartpole-reinforce", 12_288, eval_every=12_288, target_return=None)
    cfg.algo = replace(cfg.algo, baseline=False)
    assert build_trainer(cfg).fit().eval_return > 60


@pytest.mark.parametrize("recipe", ["cartpole-npg", "cartpole-reinforce"])
def test_resume_is_exact(recipe: str, tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    cfg = _cfg(recipe, 4096, eval_every=2048, target_return=None)
    cfg.algo = replace(cfg.algo, normalize_reward=True)
    assert_classic_resume_is_exact(cfg, tmp_path, cut=2048)


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pickaxe.cli", *args]


def test_killed_and_resumed_trpo_run_equals_uninterrupted_run(tmp_path: Path) -> None:
    """The tests/test_resume.py pattern: SIGKILLed while writing its second checkpoint, resumed to the end, the run
    ends with the same weights and metrics as one never stopped."""
    args = [
        "--trainer.total-steps", "5120", "--save-every", "1024", "--trainer.eval-every", "2048",
        "--trainer.stop-at-target", "False", "--env.eval-envs", "2", "--trainer.eval-episodes", "2", "--no-progress",
    ]  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "cartpole-trpo", *args, "--run-dir", str(a)]) == 0
    env = {**os.environ, "PICKAXE_FAULT": "checkpoint-write:2"}
    proc = subprocess.run(_cmd("train", "cartpole-trpo", *args, "--run-dir", str(b)), env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    subprocess.run(_cmd("resume", str(b), "--no-progress"), check=True, capture_output=True)
    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    ma, mb = read_metrics(a, deterministic=True), read_metrics(b, deterministic=True)
    assert any("trpo/kl" in r for r in ma)
    assert ma == mb


@pytest.mark.parametrize(
    ("recipe", "flag", "value", "says"),
    [("cartpole-trpo", "--algo.backtrack-coef", "1.5", "< 1"), ("cartpole-npg", "--algo.max-kl", "0", "> 0")],
)
def test_bad_value_is_one_line_and_exit_2(
    recipe: str, flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", recipe, flag, value, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag.removeprefix("--") in err.replace("_", "-") and says in err


def test_shared_torso_is_refused_for_npg_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["train", "cartpole-npg", "--model.shared", "True", "--run-dir", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--model.shared False" in err
    assert not run.exists()
