"""The offline gradient step's shortcuts (issue 29: BC and BCQ per-step cost) give the plain path's numbers bit for
bit: the fused Adam step without ``Adam.step``'s Python and the summed finite check."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import all_finite, fused_adam_step, plain_fused_adam, step_once
from pickaxe.data.batch import Batch
from pickaxe.models.mlp import mlp
from pickaxe.train.build import build_algorithm
from pickaxe.train.config import ModelConfig, TrainConfig

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
DISCRETE = gym.spaces.Discrete(3)


class _Spaces:
    def __init__(self, action_space: gym.Space) -> None:
        self.observation_space = self.single_observation_space = OBS
        self.action_space = self.single_action_space = action_space


def _algo(name: str, action_space: gym.Space, seed: int = 0):
    cfg = TrainConfig(
        algo=TrainConfig.ALGOS[name](batch_size=32), model=ModelConfig(hidden=(16, 16), activation="relu")
    )
    torch.manual_seed(seed)
    return build_algorithm(cfg, _Spaces(action_space))


def _batch(action_space: gym.Space, n: int = 96, seed: int = 1) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    if isinstance(action_space, gym.spaces.Discrete):
        action = torch.randint(0, int(action_space.n), (n,), generator=gen)
    else:
        action = torch.rand(n, 2, generator=gen) * 4.4 - 2.2  # some beyond the bounds: clamped into the box
    fields = {
        "obs": torch.randn(n, 3, generator=gen),
        "action": action,
        "reward": torch.randn(n, generator=gen),
        "terminated": torch.rand(n, generator=gen) < 0.2,
        "truncated": torch.zeros(n, dtype=torch.bool),
        "next_obs": torch.randn(n, 3, generator=gen),
    }
    return Batch(fields, batch_size=[n])


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    for name in a.networks():
        for key, value in sa[name].items():
            if not torch.equal(value, sb[name][key]):
                return False
    oa, ob = sa["optimizer"]["state"], sb["optimizer"]["state"]
    return all(torch.equal(oa[k][f], ob[k][f]) for k in oa for f in ("step", "exp_avg", "exp_avg_sq"))


# ----------------------------------------------------------------------------------------------- the fused Adam step
def _two_groups(**kwargs) -> tuple[nn.Module, torch.optim.Adam]:
    torch.manual_seed(0)
    net = mlp(3, (8,), 2, "relu")
    first, second = list(net.parameters())[:2], list(net.parameters())[2:]
    groups = [{"params": first, "lr": 1e-2, "weight_decay": 0.1}, {"params": second, "lr": 3e-3, "maximize": True}]
    return net, torch.optim.Adam(groups, fused=True, **kwargs)


def test_the_fused_adam_step_is_adams_step_bit_for_bit() -> None:
    ours, ours_opt = _two_groups()
    ref, ref_opt = _two_groups()
    gen = torch.Generator().manual_seed(2)
    for i in range(6):
        x = torch.randn(16, 3, generator=gen)
        for net, opt, fast in ((ours, ours_opt, True), (ref, ref_opt, False)):
            opt.zero_grad(set_to_none=True)
            net(x).pow(2).mean().backward()
            if i % 3 == 2:  # a step where the output layer has no gradient: skipped, as Adam skips it
                net[-1].weight.grad = net[-1].bias.grad = None
            if fast and i > 0:
                assert plain_fused_adam(opt) and fused_adam_step(opt)
            elif fast:
                assert not fused_adam_step(opt)  # no state yet: Adam.step makes it
                step_once(opt)
            else:
                opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), ref.parameters(), strict=True))
    state, ref_state = ours_opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert all(torch.equal(state[k][f], ref_state[k][f]) for k in state for f in ("step", "exp_avg", "exp_avg_sq"))


def test_other_adams_take_torchs_step() -> None:
    assert not plain_fused_adam(_two_groups(amsgrad=True)[1])
    assert not plain_fused_adam(_two_groups(decoupled_weight_decay=True)[1])
    net = mlp(3, (8,), 2)
    assert not plain_fused_adam(torch.optim.Adam(net.parameters()))  # not fused
    assert not plain_fused_adam(torch.optim.AdamW(net.parameters(), fused=True))
    assert not plain_fused_adam(torch.optim.Adam(net.parameters(), lr=torch.tensor(1e-3), fused=True))
    scaled = torch.optim.Adam(net.parameters(), fused=True)
    scaled.grad_scale = torch.ones(())
    assert not plain_fused_adam(scaled)


# ------------------------------------------------------------------------------------------------ the finite check
def test_the_summed_finite_check_answers_as_the_elementwise_one() -> None:
    finite = [torch.randn(4, 5), torch.randn(7), torch.zeros(())]
    assert all_finite(finite) and all_finite([])
    for bad in (float("nan"), float("inf"), -float("inf")):
        tensors = [t.clone() for t in finite]
        tensors[1][3] = bad
        assert not all_finite(tensors)
    assert not all_finite([torch.tensor([float("inf")]), torch.tensor([-float("inf")])])  # inf - inf: NaN
    huge = [torch.full((4,), 3e38), torch.full((3,), 3e38)]  # finite; their sum overflows to inf
    assert all_finite(huge) and all_finite(t.double() for t in huge)
    assert all_finite([torch.ones(3), torch.arange(4)]) and not all_finite([torch.arange(4), torch.tensor([math.nan])])
