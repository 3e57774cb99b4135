"""IQN and FQF: the quantile Huber loss with sampled fractions against hand values and QR-DQN's loss, quantile
regression recovering a known quantile, FQF's fraction loss against the 1-Wasserstein error's numeric derivative,
the proposals' shape, learning CartPole, exact resume, and bad values refused in one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from pickaxe.algos.dqn import quantile_huber_loss
from pickaxe.algos.extra_configs import FQFConfig, IQNConfig
from pickaxe.algos.iqn import IQN, fqf_loss, fraction_loss, quantile_huber_loss_at
from pickaxe.cli import main
from pickaxe.models.quantile import ImplicitQuantileNetwork, midpoint_taus
from pickaxe.recipes import get_recipe
from pickaxe.train.build import build_trainer


def test_quantile_huber_loss_with_sampled_tau_matches_hand_values() -> None:
    quantiles = torch.tensor([[0.0, 1.0]])
    tau = torch.tensor([[0.2, 0.9]])
    # u = 0.5 - 0 = 0.5: 0.5 u^2 = 0.125, weight |0.2 - 0| = 0.2; u = 0.5 - 1 = -0.5: 0.125, weight |0.9 - 1| = 0.1
    # u = 3 - 0 = 3: kappa (|u| - kappa / 2) = 2.5, weight 0.2; u = 3 - 1 = 2: 1.5, weight |0.9 - 0| = 0.9
    target = torch.tensor([[0.5, 3.0]])
    expected = ((0.2 * 0.125 + 0.1 * 0.125) + (0.2 * 2.5 + 0.9 * 1.5)) / 2  # sum over quantiles, mean over targets
    assert quantile_huber_loss_at(quantiles, tau, target, 1.0).item() == pytest.approx(expected)
    # kappa scales the Huber threshold and divides the loss: kappa 2 makes every |u| <= 2 quadratic
    expected_k2 = ((0.2 * 0.125 + 0.1 * 0.125) + (0.2 * 2 * (3 - 1) + 0.9 * 0.5 * 4)) / 2 / 2
    assert quantile_huber_loss_at(quantiles, tau, target, 2.0).item() == pytest.approx(expected_k2)


def test_target_weights_make_the_target_a_weighted_staircase() -> None:
    quantiles, tau = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.9]])
    target = torch.tensor([[0.5, 3.0]])
    # per target (summed over the quantiles, as in the test above): 0.2 * 0.125 + 0.1 * 0.125 = 0.0375 for 0.5 and
    # 0.2 * 2.5 + 0.9 * 1.5 = 1.85 for 3.0; masses 0.25 and 0.75 weight them instead of averaging
    weights = torch.tensor([[0.25, 0.75]])
    assert quantile_huber_loss_at(quantiles, tau, target, 1.0, weights).item() == pytest.approx(
        0.25 * 0.0375 + 0.75 * 1.85
    )
    equal = torch.full((1, 2), 0.5)
    assert quantile_huber_loss_at(quantiles, tau, target, 1.0, equal).item() == pytest.approx((0.0375 + 1.85) / 2)


class _Staircase(ImplicitQuantileNetwork):
    """A quantile network with hand-set outputs: features = obs (one number s), ``Z_tau(s, a) = 10 tau + a`` and
    two proposed widths ``(0.5 - 0.3 s, 0.5 + 0.3 s)``."""

    def __init__(self) -> None:
        super().__init__(gym.spaces.Box(-1, 1, (1,)), 2, hidden=(4,), embedding_dim=2, fractions=2)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return obs

    def quantiles(self, features: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        return 10 * tau.unsqueeze(-1) + torch.arange(2.0)

    def propose(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = features[:, 0]
        widths = torch.stack([0.5 - 0.3 * s, 0.5 + 0.3 * s], -1)
        tau = torch.cat([torch.zeros_like(s)[:, None], widths.cumsum(-1)], -1)
        return tau, (tau[:, :-1] + tau[:, 1:]) / 2, -(widths * widths.log()).sum(-1)


def test_fqf_target_is_the_next_states_staircase_weighted_by_its_widths() -> None:
    # s = 0: widths (0.5, 0.5), tau_hat (0.25, 0.75); action 0's quantiles 2.5 and 7.5.
    # s' = 1: widths (0.2, 0.8), tau_hat' (0.1, 0.6); Q(s', a) = 0.2 * 1 + 0.8 * 6 + a, so a* = 1, whose quantiles at
    # tau_hat' are 2 and 7: with r = 1 and gamma 0.5 the target steps are 2 (mass 0.2) and 4.5 (mass 0.8).
    # Quantile 2.5 (tau 0.25): against 2, u = -0.5, 0.75 * 0.125; against 4.5, u = 2, 0.25 * 1.5.
    # Quantile 7.5 (tau 0.75): against 2, u = -5.5, 0.25 * 5; against 4.5, u = -3, 0.25 * 2.5.
    per_target = torch.tensor([0.75 * 0.125 + 0.25 * 5.0, 0.25 * 1.5 + 0.25 * 2.5])
    expected = float(0.2 * per_target[0] + 0.8 * per_target[1])  # 1.06875
    mb = {
        "obs": torch.tensor([[0.0]]), "next_obs": torch.tensor([[1.0]]), "action": torch.tensor([0]),
        "reward": torch.tensor([1.0]), "terminated": torch.tensor([False]),
    }  # fmt: skip
    _, stats = fqf_loss(_Staircase(), _Staircase(), mb, FQFConfig(fractions=2, gamma=0.5))
    assert stats[0].item() == pytest.approx(expected)
    # the staircase is exact at the inner fraction 0.5 (Z = 5, midway between 2.5 and 7.5): no fraction gradient
    assert stats[1].item() == pytest.approx(0.0)
    # (the target at the current state's fractions 0.25 and 0.75, averaged equally, would give 1.03515625)


def test_at_the_midpoints_it_is_qr_dqns_loss() -> None:
    g = torch.Generator().manual_seed(0)
    quantiles, target = torch.randn(5, 7, generator=g), torch.randn(5, 9, generator=g) * 3
    torch.testing.assert_close(
        quantile_huber_loss_at(quantiles, midpoint_taus(7, 5), target, 1.0), quantile_huber_loss(quantiles, target, 1.0)
    )


def test_quantile_regression_with_sampled_tau_recovers_the_quantiles() -> None:
    targets = torch.arange(100.0).view(1, -1)  # the tau-quantile of 0..99 is ~99 tau
    tau = torch.tensor([[0.1, 0.5, 0.8]])
    q = torch.zeros(1, 3, requires_grad=True)
    opt = torch.optim.SGD([q], lr=2.0)
    for _ in range(600):
        opt.zero_grad()
        quantile_huber_loss_at(q, tau, targets, 0.01).sum().backward()
        opt.step()
    torch.testing.assert_close(q.detach(), torch.tensor([[9.9, 49.5, 79.2]]), atol=1.0, rtol=0.0)


def _w1(tau: torch.Tensor, inverse_cdf, grid: int = 200_001) -> float:
    """The 1-Wasserstein error of the staircase at the midpoints of ``tau`` (float64, numerically)."""
    w = torch.linspace(0, 1, grid, dtype=torch.float64)
    hat = (tau[:-1] + tau[1:]) / 2
    segment = (torch.searchsorted(tau[1:-1], w, right=True)).clamp_max(len(hat) - 1)
    return float(torch.trapezoid((inverse_cdf(w) - inverse_cdf(hat[segment])).abs(), w))


def test_fraction_loss_gradient_is_the_w1_errors_derivative() -> None:
    def inverse_cdf(w: torch.Tensor) -> torch.Tensor:
        return w.pow(3) + 2 * w

    tau = torch.tensor([0.0, 0.2, 0.45, 0.7, 1.0], dtype=torch.float64)
    hat = (tau[:-1] + tau[1:]) / 2
    t = tau.clone().unsqueeze(0).requires_grad_(True)
    loss = fraction_loss(inverse_cdf(tau[1:-1]).unsqueeze(0), inverse_cdf(hat).unsqueeze(0), t)
    (grad,) = torch.autograd.grad(loss.sum(), t)
    eps = 1e-4
    for i in (1, 2, 3):
        up, down = tau.clone(), tau.clone()
        up[i] += eps
        down[i] -= eps
        numeric = (_w1(up, inverse_cdf) - _w1(down, inverse_cdf)) / (2 * eps)
        assert grad[0, i].item() == pytest.approx(numeric, abs=2e-3)
    assert grad[0, 0] == 0 and grad[0, -1] == 0  # tau_0 = 0 and tau_N = 1 are fixed


def test_proposed_fractions_span_zero_to_one_and_only_the_proposal_learns_from_the_fraction_loss() -> None:
    torch.manual_seed(0)
    net = ImplicitQuantileNetwork(gym.spaces.Box(-1, 1, (4,)), 2, hidden=(16,), embedding_dim=8, fractions=6)
    x = net.features(torch.randn(3, 4))
    tau, tau_hat, entropy = net.propose(x)
    assert tau.shape == (3, 7) and tau_hat.shape == (3, 6)
    assert (tau[:, 0] == 0).all() and (tau[:, -1] == 1).all() and (tau.diff(dim=-1) > 0).all()
    torch.testing.assert_close(entropy, torch.full((3,), float(torch.log(torch.tensor(6.0)))), atol=1e-3, rtol=0)
    target = ImplicitQuantileNetwork(gym.spaces.Box(-1, 1, (4,)), 2, hidden=(16,), embedding_dim=8, fractions=6)
    mb = {
        "obs": torch.randn(8, 4), "next_obs": torch.randn(8, 4), "action": torch.randint(2, (8,)),
        "reward": torch.randn(8), "terminated": torch.zeros(8, dtype=torch.bool),
    }  # fmt: skip
    _, stats = fqf_loss(net, target, mb, FQFConfig(fractions=6))
    net.zero_grad()
    tau, tau_hat, _ = net.propose(net.features(mb["obs"]))
    z = net.quantiles(net.features(mb["obs"]), tau_hat.detach())
    fraction_loss(z[:, 1:, 0].detach(), z[:, :, 0].detach(), tau).mean().backward()
    assert net.proposal.weight.grad is not None
    assert all(p.grad is None for name, p in net.named_parameters() if not name.startswith("proposal"))
    assert torch.isfinite(stats).all()


def test_evaluation_acts_on_fixed_fractions_and_training_on_sampled_ones() -> None:
    torch.manual_seed(0)
    net = ImplicitQuantileNetwork(gym.spaces.Box(-1, 1, (4,)), 3, hidden=(16,), embedding_dim=8)
    obs = torch.randn(5, 4)
    torch.testing.assert_close(net.q_values(obs, 8), net.q_values(obs, 8))
    assert not torch.equal(net.q_values(obs, 8, sample=True), net.q_values(obs, 8, sample=True))


def _cfg(recipe: str, steps: int, **trainer):
    cfg = get_recipe(recipe)
    cfg.env = replace(cfg.env, eval_envs=4)
    cfg.trainer = replace(cfg.trainer, total_steps=steps, eval_episodes=4, **trainer)
    return cfg


@pytest.mark.parametrize("recipe", ["cartpole-iqn", "cartpole-fqf"])
def test_resume_is_exact(recipe: str, tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    cfg = _cfg(recipe, 1024, eval_every=512, target_return=None)
    # a constant epsilon: the helper's first segment runs with total_steps=cut, which would rescale a decay
    cfg.algo = replace(
        cfg.algo, learning_starts=256, gradient_steps=4, target_update_every=6, eps_start=0.2, eps_end=0.2, n_step=2
    )
    records = assert_classic_resume_is_exact(cfg, tmp_path, cut=512)
    assert any("loss/quantile" in r for r in records)


def test_fqf_needs_a_network_with_proposals() -> None:
    net = ImplicitQuantileNetwork(gym.spaces.Box(-1, 1, (4,)), 2, hidden=(8,))
    with pytest.raises(ValueError, match="proposal"):
        IQN(net, FQFConfig())
    assert IQN(net, IQNConfig()).prefix == "iqn"


def test_bad_value_on_the_command_line_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "cartpole-fqf", "--algo.fractions", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fractions" in err and ">= 2" in err


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["cartpole-iqn", "cartpole-fqf"])
def test_recipe_learns_cartpole_a_little(recipe: str) -> None:
    # ~25-35 s each: the recipe at 24,576 env steps (its eval settings). A random policy scores ~10-20; a loose bar,
    # passed even by the first recipes (lr 1e-3, 1-step returns: seed 0's best evaluation was 268 IQN, 139 FQF)
    cfg = get_recipe(recipe)
    cfg.trainer = replace(cfg.trainer, total_steps=24_576, save_at_eval=False, keep_policies=False)
    assert build_trainer(cfg).fit().best_eval_return > 100
