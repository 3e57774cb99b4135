"""Known answers of the offline algorithms' pure losses, computed by hand (algos/offline_core.py), and of the
D4RL-style normalised score."""

import math

import numpy as np
import pytest
import torch

from pickaxe.algos.offline_core import (
    advantage_weights,
    bc_squared_error,
    bcq_allowed,
    bcq_argmax,
    bcq_imitation_loss,
    categorical_nll,
    cql_continuous_penalty,
    cql_discrete_penalty,
    crr_advantage,
    crr_weights,
    expectile_loss,
    gaussian_nll,
    td3_bc_actor_loss,
    weighted_nll,
)
from pickaxe.offline.scores import normalized_score, references

t = torch.tensor


def test_bc_likelihoods() -> None:
    logprobs = torch.log(t([[0.25, 0.75], [0.5, 0.5]]))
    assert categorical_nll(logprobs, t([1, 0])).item() == pytest.approx(-(math.log(0.75) + math.log(0.5)) / 2)
    # N(1; 0, 1): 0.5 + 0.5 log(2 pi); with std e (log_std 1) at 0: 1 + 0.5 log(2 pi); summed over the 2 dims
    half_log_2pi = 0.5 * math.log(2 * math.pi)
    assert gaussian_nll(t([[0.0]]), t([0.0]), t([[1.0]])).item() == pytest.approx(0.5 + half_log_2pi)
    two_dims = gaussian_nll(t([[0.0, 0.0]]), t([0.0, 1.0]), t([[1.0, 0.0]])).item()
    assert two_dims == pytest.approx((0.5 + half_log_2pi) + (1.0 + half_log_2pi))


def test_bc_squared_error_is_the_mean_over_batch_and_action_dimensions() -> None:
    # (0.5^2 + 1^2 + 0^2 + 1^2) / 4 = 0.5625; its gradient 2 (pi - a) / (B * A)
    pi = t([[0.5, -1.0], [0.0, 0.0]], requires_grad=True)
    loss = bc_squared_error(pi, t([[0.0, 0.0], [0.0, 1.0]]))
    assert loss.item() == pytest.approx(0.5625)
    loss.backward()
    assert pi.grad.flatten().tolist() == pytest.approx([0.25, -0.5, 0.0, -0.5])


def test_td3_bc_lambda_normalises_by_the_mean_absolute_q() -> None:
    q = t([1.0, -3.0], requires_grad=True)  # mean |Q| = 2, so lambda = 2.5 / 2 = 1.25
    pi, a = t([[0.5], [0.0]]), t([[0.0], [0.0]])
    loss, lam = td3_bc_actor_loss(q, pi, a, alpha=2.5)
    assert float(lam) == pytest.approx(1.25)
    assert loss.item() == pytest.approx(-1.25 * -1.0 + 0.125)  # -lambda mean Q + mean (pi - a)^2
    loss.backward()  # lambda is a constant: dL/dQ_i = -lambda / B
    assert q.grad.tolist() == pytest.approx([-0.625, -0.625])
    # scaling Q by 10 leaves the loss's Q-gradient direction and the lambda*Q product unchanged
    loss10, _ = td3_bc_actor_loss(10 * t([1.0, -3.0]), pi, a, alpha=2.5)
    assert loss10.item() == pytest.approx(loss.item())


def test_iql_expectile_and_advantage_weighted_policy_loss() -> None:
    assert expectile_loss(t([2.0, -1.0]), 0.7).item() == pytest.approx((0.7 * 4 + 0.3 * 1) / 2)
    assert expectile_loss(t([2.0, -2.0]), 0.5).item() == pytest.approx(0.5 * 4)  # 0.5: half the squared error
    w = advantage_weights(t([0.0, math.log(2.0), 10.0]), beta=1.0, max_weight=100.0)
    assert w.tolist() == pytest.approx([1.0, 2.0, 100.0])  # exp(10) is clipped to 100
    logp = t([-1.0, -2.0, -0.5], requires_grad=True)
    loss = weighted_nll(logp, w)
    assert loss.item() == pytest.approx((1.0 + 4.0 + 50.0) / 3)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1 / 3, -2 / 3, -100 / 3])


def test_cql_discrete_log_sum_exp_penalty() -> None:
    q_all = t([[1.0, 2.0], [0.0, 0.0]])
    row0 = math.log(math.exp(1) + math.exp(2)) - 1.0
    row1 = math.log(2.0) - 0.0
    assert cql_discrete_penalty(q_all, t([0, 1])).item() == pytest.approx((row0 + row1) / 2)


def test_cql_continuous_penalty_estimates_the_log_integral() -> None:
    # A = 1, Q = 0 everywhere on [-1, 1]: log of the integral of exp(Q) is log 2; a uniform sample (density 1/2) and a
    # policy sample of density 1/2 both estimate it exactly
    half = math.log(0.5)
    value = cql_continuous_penalty(t([[[0.0]]]), t([[[0.0]]]), t([[[half]]]), t([[0.0]]), action_dim=1)
    assert value.tolist() == pytest.approx([math.log(2.0)])
    # a constant Q = c over [-1, 1]^3 with any number of uniform samples: c + 3 log 2, minus Q(s, a_data) = c
    c, n, b = 1.7, 5, 4
    q_random = torch.full((2, n, b), c)
    q_policy = torch.full((2, 3, b), c)
    logp = torch.full((1, 3, b), -3 * math.log(2.0))  # uniform density of the policy samples too
    value = cql_continuous_penalty(q_random, q_policy, logp, torch.full((2, b), c), action_dim=3)
    assert value.tolist() == pytest.approx([3 * math.log(2.0)] * 2)


def test_bcq_filters_unlikely_actions_out_of_the_argmax() -> None:
    # probabilities relative to the max: row 0 [1, 0.5, 0.25], row 1 [0.1, 1, 0.5]
    logprobs = torch.log(t([[0.4, 0.2, 0.1], [0.05, 0.5, 0.25]]))
    q = t([[1.0, 5.0, 9.0], [7.0, 2.0, 3.0]])
    assert bcq_allowed(logprobs, 0.3).tolist() == [[True, True, False], [False, True, True]]
    assert bcq_argmax(q, logprobs, 0.3).tolist() == [1, 2]  # the best Q (9, 7) is filtered: the next allowed one
    assert bcq_argmax(q, logprobs, 0.0).tolist() == [2, 0]  # no filter: DQN's argmax
    assert bcq_argmax(q, logprobs, 1.0).tolist() == [0, 1]  # only the most probable action: behaviour cloning
    assert bcq_argmax(q, logprobs, 0.6).tolist() == [0, 1]  # row 0 keeps only action 0, row 1 only action 1
    # the head's loss: cross-entropy plus the penalty on the mean squared logit
    logits = t([[0.0, math.log(3.0)]])  # probabilities 1/4, 3/4
    expected = -math.log(0.75) + 0.1 * (math.log(3.0) ** 2) / 2
    assert bcq_imitation_loss(logits, t([1]), penalty=0.1).item() == pytest.approx(expected)


def test_crr_advantage_against_the_mean_or_max_and_its_weights() -> None:
    q_data = t([2.0, 0.0])
    q_other = t([[1.0, 3.0], [0.0, -2.0]])  # two actions of the policy at each state
    assert crr_advantage(q_data, q_other, "mean").tolist() == pytest.approx([0.0, 1.0])  # V = 2, -1
    assert crr_advantage(q_data, q_other, "max").tolist() == pytest.approx([-1.0, 0.0])  # V = 3, 0
    probs = t([[0.25, 0.75], [0.5, 0.5]])  # a categorical policy's expectation: V = 2.5, -1
    assert crr_advantage(q_data, q_other, "mean", probs).tolist() == pytest.approx([-0.5, 1.0])
    assert crr_advantage(q_data, q_other, "max", probs).tolist() == pytest.approx([-1.0, 0.0])  # max ignores probs
    a = t([-1.0, 0.0, math.log(2.0), 10.0])
    assert crr_weights(a, "exp", beta=1.0, max_weight=20.0).tolist() == pytest.approx([math.exp(-1), 1.0, 2.0, 20.0])
    assert crr_weights(a, "exp", beta=2.0, max_weight=1e9).tolist() == pytest.approx(
        [math.exp(-0.5), 1.0, math.sqrt(2.0), math.exp(5.0)]
    )
    assert crr_weights(a, "binary", beta=1.0, max_weight=20.0).tolist() == [0.0, 0.0, 1.0, 1.0]  # 1[A > 0]
    needs = t([1.0], requires_grad=True)
    assert not crr_weights(crr_advantage(needs, t([[0.0]]), "mean"), "exp", 1.0, 20.0).requires_grad


def test_normalized_score() -> None:
    assert normalized_score([20.0, 260.0, 500.0], random=20.0, expert=500.0).tolist() == pytest.approx([0, 50, 100])
    assert normalized_score(np.array([-1200.0]), random=-1200.0, expert=-200.0).tolist() == [0.0]
    assert references({"ref_min_score": 1, "ref_max_score": 3.0}) == (1.0, 3.0)
    assert references({"ref_min_score": 1}) is None and references({"ref_min_score": 2, "ref_max_score": 2}) is None
    with pytest.raises(ValueError):
        normalized_score([1.0], 2.0, 2.0)


@pytest.mark.parametrize(
    "name, discrete",
    [
        ("bc", True),
        ("bc", False),
        ("td3-bc", False),
        ("iql", True),
        ("iql", False),
        ("cql", True),
        ("cql", False),
        ("bcq", True),
        ("crr", True),
        ("crr", False),
    ],
)
def test_each_offline_algorithm_updates_and_its_state_round_trips(name: str, discrete: bool) -> None:
    import copy
    import importlib

    import gymnasium as gym

    from pickaxe.offline.dataset import Transitions
    from pickaxe.offline.sampler import DatasetSampler
    from pickaxe.train.build import ALGORITHMS
    from pickaxe.train.config import ModelConfig, TrainConfig

    rng = np.random.default_rng(0)
    n = 64
    obs_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    action = rng.integers(0, 2, n) if discrete else rng.uniform(-2, 2, (n, 1)).astype(np.float32)
    arrays = {
        "obs": rng.normal(size=(n, 3)).astype(np.float32),
        "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=n).astype(np.float32),
        "terminated": rng.random(n) < 0.1,
        "truncated": np.zeros(n, bool),
    }
    sampler = DatasetSampler(Transitions(arrays, obs_space, space), 32, seed=0)
    config = TrainConfig.ALGOS[name](batch_size=16)
    module, _, function = ALGORITHMS[name].partition(":")
    build = getattr(importlib.import_module(module), function)
    algo = build(config, sampler, ModelConfig(hidden=(8,), activation="relu"), torch.device("cpu"), 0)
    batch = sampler.collect()
    metrics = algo.update(batch)
    assert metrics and all(math.isfinite(v) for v in metrics.values())
    state = copy.deepcopy(algo.state_dict())
    torch.manual_seed(1)
    after = algo.update(batch)
    twin = build(config, sampler, ModelConfig(hidden=(8,), activation="relu"), torch.device("cpu"), 0)
    twin.load_state_dict(state)
    torch.manual_seed(1)
    assert twin.update(batch) == after  # the state holds everything that decides the next update
    obs = torch.as_tensor(arrays["obs"][:5])
    a, _ = algo.policy.act(obs, deterministic=True)
    assert a.shape == ((5,) if discrete else (5, 1))
