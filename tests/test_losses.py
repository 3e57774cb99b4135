"""Shared loss pieces against hand-computed values."""

import math

import pytest
import torch

from pickaxe.algos.core import (
    approx_kl,
    clipped_surrogate,
    explained_variance,
    linear_schedule,
    normalize,
    td_target,
    value_loss,
)


def test_clipped_surrogate_hand_values() -> None:
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0])
    loss, ratio, clipped = clipped_surrogate(new, old, adv, 0.2, 0.2)
    # r=1.5,A=1 -> min(1.5, 1.2)=1.2; r=0.5,A=1 -> min(0.5, 0.8)=0.5; r=1.1,A=-2 -> -2.2; r=0.7,A=-1 -> min(-0.7,-0.8)
    torch.testing.assert_close(loss, -torch.tensor([1.2, 0.5, -2.2, -0.8]))
    assert clipped.tolist() == [True, False, False, True]
    torch.testing.assert_close(ratio, torch.tensor([1.5, 0.5, 1.1, 0.7]))


def test_asymmetric_clip() -> None:
    loss, _, _ = clipped_surrogate(torch.log(torch.tensor([2.0])), torch.zeros(1), torch.ones(1), 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor([-1.28]))


def test_value_loss_with_and_without_clip() -> None:
    v, old, target = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([1.0])
    torch.testing.assert_close(value_loss(v, old, target), torch.tensor([0.5]))
    # clipped value 0.5 -> 0.5*(0.5-1)^2 = 0.125; max(0.5, 0.125) = 0.5
    torch.testing.assert_close(value_loss(v, old, target, clip=0.5), torch.tensor([0.5]))
    v2 = torch.tensor([0.9])  # unclipped loss 0.005, clipped (0.5) loss 0.125 -> max is 0.125
    torch.testing.assert_close(value_loss(v2, old, target, clip=0.5), torch.tensor([0.125]))


def test_td_target_bootstraps_through_truncation_only() -> None:
    reward, nv = torch.tensor([1.0, 1.0]), torch.tensor([10.0, 10.0])
    out = td_target(reward, nv, torch.tensor([True, False]), 0.9)
    torch.testing.assert_close(out, torch.tensor([1.0, 10.0]))


def test_misc() -> None:
    x = normalize(torch.tensor([1.0, 2.0, 3.0]))
    assert abs(float(x.mean())) < 1e-6 and abs(float(x.std(unbiased=False)) - 1) < 1e-4
    r = torch.tensor([1.5])
    torch.testing.assert_close(approx_kl(torch.log(r), torch.zeros(1)), torch.tensor(0.5 - math.log(1.5)))
    assert linear_schedule(1.0, 0.0, 0.25) == 0.75 and linear_schedule(1.0, 0.0, 2.0) == 0.0


def test_value_clip_bounds_the_move_below_the_old_value() -> None:
    # V = -1, old V = 1, target -3: unclipped 0.5 * 2^2 = 2; V clipped to 1 - 0.5 = 0.5 -> 0.5 * 3.5^2 = 6.125.
    out = value_loss(torch.tensor([-1.0]), torch.tensor([1.0]), torch.tensor([-3.0]), clip=0.5)
    torch.testing.assert_close(out, torch.tensor([6.125]))


def test_approx_kl_uses_the_log_ratio() -> None:
    # log r = log 1.5 whatever the old log-prob: KL estimate (r - 1) - log r.
    old = torch.tensor([-2.0])
    out = approx_kl(old + math.log(1.5), old)
    torch.testing.assert_close(out, torch.tensor(0.5 - math.log(1.5)))


def test_explained_variance_hand_values() -> None:
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])  # variance 1.25 (population)
    pred = torch.tensor([1.0, 2.0, 3.0, 2.0])  # residual [0, 0, 0, 2]: variance 0.75
    assert explained_variance(pred, target) == pytest.approx(1.0 - 0.75 / 1.25)
    assert explained_variance(target, target) == 1.0
    assert math.isnan(explained_variance(pred, torch.full((4,), 3.0)))
