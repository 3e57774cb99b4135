"""GAE and discounted returns against hand-computed answers, with truncation and termination in one rollout."""

import torch

from pickaxe.data.returns import discounted_returns, gae

# One env, 5 steps: episode A ends by truncation at t=1, episode B terminates at t=3, episode C runs on.
REWARD = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
VALUE = torch.tensor([[0.5], [0.6], [0.7], [0.8], [0.9]])
NEXT_VALUE = torch.tensor([[0.6], [10.0], [0.8], [99.0], [1.5]])  # t=1: V(final obs of A); t=3: ignored
TERM = torch.tensor([[False], [False], [False], [True], [False]])
TRUNC = torch.tensor([[False], [True], [False], [False], [False]])


def test_gae_matches_hand_computation() -> None:
    g, lam = 0.9, 0.8
    d4 = 5 + g * 1.5 - 0.9  # bootstraps from V(obs_5)
    d3 = 4 + 0 - 0.8  # terminated: no bootstrap (the 99 must not leak in)
    d2 = 3 + g * 0.8 - 0.7
    d1 = 2 + g * 10.0 - 0.6  # truncated: bootstrap from the final observation's value
    d0 = 1 + g * 0.6 - 0.5
    a4 = d4
    a3 = d3  # episode boundary: nothing from t=4
    a2 = d2 + g * lam * a3
    a1 = d1
    a0 = d0 + g * lam * a1
    adv, ret = gae(REWARD, VALUE, NEXT_VALUE, TERM, TRUNC, g, lam)
    expected = torch.tensor([[a0], [a1], [a2], [a3], [a4]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + VALUE)


def test_discounted_returns_match_hand_computation() -> None:
    g = 0.9
    r4 = 5 + g * 1.5
    r3 = 4.0
    r2 = 3 + g * r3
    r1 = 2 + g * 10.0
    r0 = 1 + g * r1
    out = discounted_returns(REWARD, NEXT_VALUE, TERM, TRUNC, g)
    torch.testing.assert_close(out, torch.tensor([[r0], [r1], [r2], [r3], [r4]]))


def test_gae_lambda_one_equals_discounted_returns_minus_value() -> None:
    gen = torch.Generator().manual_seed(0)
    reward, value, next_value = (torch.randn(7, 3, generator=gen) for _ in range(3))
    term = torch.rand(7, 3, generator=gen) < 0.2
    trunc = (torch.rand(7, 3, generator=gen) < 0.2) & ~term
    # GAE(lambda=1) telescopes to the bootstrapped return only where consecutive values agree.
    next_value[:-1] = torch.where(term[:-1] | trunc[:-1], next_value[:-1], value[1:])
    adv, _ = gae(reward, value, next_value, term, trunc, 0.95, 1.0)
    torch.testing.assert_close(adv + value, discounted_returns(reward, next_value, term, trunc, 0.95))


def test_multiple_envs_are_independent() -> None:
    adv2, _ = gae(
        REWARD.repeat(1, 2),
        VALUE.repeat(1, 2),
        NEXT_VALUE.repeat(1, 2),
        TERM.repeat(1, 2),
        TRUNC.repeat(1, 2),
        0.9,
        0.8,
    )
    adv1, _ = gae(REWARD, VALUE, NEXT_VALUE, TERM, TRUNC, 0.9, 0.8)
    torch.testing.assert_close(adv2[:, :1], adv1)
    torch.testing.assert_close(adv2[:, 1:], adv1)


def test_single_step_rollouts() -> None:
    # T = 1 (one step per env per collect): the step bootstraps from next_value unless terminated.
    reward, value, next_value = torch.tensor([[1.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 2.0]])
    term, trunc = torch.tensor([[False, True]]), torch.tensor([[False, False]])
    adv, _ = gae(reward, value, next_value, term, trunc, 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.9 * 2.0 - 0.5, 1.0 - 0.5]]))
    torch.testing.assert_close(
        discounted_returns(reward, next_value, term, trunc, 0.9), torch.tensor([[1.0 + 0.9 * 2.0, 1.0]])
    )
