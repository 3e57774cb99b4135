"""The offline gradient step's shortcuts (issue 29: BC and BCQ per-step cost) give the plain path's numbers bit for
bit: the fused Adam step without ``Adam.step``'s Python, the summed finite check, the actions mapped into the unit box
and the TD targets' discounts once per batch, BCQ's and IQL's next-state passes without a graph, and the stats
computed without one."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pickaxe.algos.base import all_finite, fused_adam_step, plain_fused_adam, step_once
from pickaxe.algos.core import discounts, td_target
from pickaxe.algos.offline import split_minibatches
from pickaxe.algos.offline_core import (
    advantage_weights,
    bcq_argmax,
    bcq_imitation_loss,
    expectile_loss,
    gaussian_logprob,
    gaussian_nll,
    weighted_nll,
)
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


# ------------------------------------------------------------------- unit-box actions and discounts once per batch
ALL = [("bc", BOX), ("td3-bc", BOX), ("cql", BOX), ("crr", BOX), ("iql", BOX)]
ALL += [("bc", DISCRETE), ("cql", DISCRETE), ("bcq", DISCRETE), ("crr", DISCRETE), ("iql", DISCRETE)]


@pytest.mark.parametrize("name, space", ALL)
def test_fields_computed_per_batch_give_each_minibatchs_numbers(name: str, space: gym.Space) -> None:
    whole, each = _algo(name, space), _algo(name, space)
    for seed in (1, 2):
        batch = _batch(space, seed=seed)
        torch.manual_seed(seed)
        metrics = whole.update(batch)  # with unit_action (Box) and discount (TD targets)
        torch.manual_seed(seed)
        plain = each.learn(split_minibatches(batch, 32))  # without: each minibatch computes its own
        assert metrics == plain
    assert _same_state(whole, each)


def test_the_discounts_are_td_targets_own() -> None:
    reward, value = torch.randn(50), torch.randn(50)
    terminated = torch.rand(50) < 0.3
    given = td_target(reward, value, terminated, 0.97, discounts(reward, terminated, 0.97))
    assert torch.equal(given, reward + 0.97 * (1.0 - terminated.float()) * value)
    assert torch.equal(given, td_target(reward, value, terminated, 0.97))


# ------------------------------------------------------------------------------------- the losses, plain and fast
def _bc_plain(algo, mb):
    if algo.discrete:
        logprobs = algo.actor(mb["obs"])
        loss = -logprobs.gather(-1, mb["action"].long().reshape(-1, 1)).mean()
        fit = (logprobs.argmax(-1) == mb["action"].long()).float().mean()
    else:
        mean, log_std = algo.actor(mb["obs"])
        a = algo.policy.scale.to_unit(mb["action"])
        loss = gaussian_nll(mean, log_std, a)
        fit = (mean - a).pow(2).mean()
    return loss, torch.stack([loss, fit]).detach()


def _bcq_plain(algo, mb):
    """Discrete BCQ's losses as they were: both networks on ``cat([s, s'])`` with a graph, the filter twice."""
    cfg = algo.config
    obs, next_obs, action = mb["obs"], mb["next_obs"], mb["action"]
    b = obs.shape[0]
    q_all, next_q = algo.qnet(torch.cat([obs, next_obs])).split(b)
    logits, next_logits = algo.imitation(torch.cat([obs, next_obs])).split(b)
    with torch.no_grad():
        next_logprobs = torch.log_softmax(next_logits, dim=-1)
        next_a = bcq_argmax(next_q, next_logprobs, cfg.threshold)
        next_value = algo.target(next_obs).gather(-1, next_a.reshape(-1, 1)).squeeze(-1)
        y = td_target(mb["reward"], next_value, mb["terminated"], cfg.gamma)
        ratio = torch.exp(next_logprobs - next_logprobs.max(-1, keepdim=True).values)
        allowed = (ratio >= cfg.threshold).float().mean()
    q = q_all.gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
    td = F.smooth_l1_loss(q, y)
    imitation = bcq_imitation_loss(logits, action, cfg.imitation_penalty)
    return td + imitation, torch.stack([td, imitation, q.mean().detach(), allowed]).detach()


def _iql_plain(algo, mb):
    """IQL's losses as they were: the value network on ``cat([s, s'])`` with a graph, actions mapped per use."""
    cfg = algo.config
    obs, action = mb["obs"], mb["action"]

    def q_of(net):
        if algo.discrete:
            q_all = net(obs)
            return q_all.gather(-1, action.long().reshape(1, -1, 1).expand(q_all.shape[0], -1, 1)).squeeze(-1)
        return net(obs, algo.policy.scale.to_unit(action))

    v, next_v = algo.value(torch.cat([obs, mb["next_obs"]])).reshape(-1).split(obs.shape[0])
    with torch.no_grad():
        q_target = q_of(algo.target).min(dim=0).values
        y = td_target(mb["reward"], next_v.detach(), mb["terminated"], cfg.gamma)
    value_loss = expectile_loss(q_target - v, cfg.expectile)
    q = q_of(algo.critic)
    critic_loss = 0.5 * (q - y.unsqueeze(0)).pow(2).mean(-1).sum()
    weights = advantage_weights(q_target - v.detach(), cfg.beta, cfg.max_weight)
    if algo.discrete:
        logprob = algo.actor(obs).gather(-1, action.long().reshape(-1, 1)).squeeze(-1)
    else:
        mean, log_std = algo.actor(obs)
        logprob = gaussian_logprob(mean, log_std, algo.policy.scale.to_unit(action))
    actor_loss = weighted_nll(logprob, weights)
    stats = torch.stack([critic_loss, value_loss, actor_loss, q.mean(), v.mean(), weights.mean()]).detach()
    return critic_loss + value_loss + actor_loss, stats


PLAIN = [
    ("bc", BOX, _bc_plain),
    ("bc", DISCRETE, _bc_plain),
    ("bcq", DISCRETE, _bcq_plain),
    ("iql", BOX, _iql_plain),
    ("iql", DISCRETE, _iql_plain),
]


@pytest.mark.parametrize("name, space, plain", PLAIN)
def test_losses_and_gradients_are_the_plain_paths(name: str, space: gym.Space, plain) -> None:
    algo = _algo(name, space)
    algo.update(_batch(space, seed=3))  # trained weights, not the initial ones
    mb = split_minibatches(_batch(space, seed=4), 32)[0]
    grads = []
    for fn in (algo.losses, lambda m: plain(algo, m)):
        algo.optimizer.zero_grad(set_to_none=True)
        total, stats = fn(dict(mb))
        total.backward()
        grads.append((total.detach(), stats, [p.grad.clone() for p in algo.learned.parameters()]))
    (total, stats, ours), (ref_total, ref_stats, ref) = grads
    assert torch.equal(total, ref_total) and torch.equal(stats, ref_stats) and not stats.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))


def test_a_replayed_minibatch_without_unit_actions_still_maps_them() -> None:
    algo = _algo("bc", BOX)
    mb = split_minibatches(_batch(BOX), 32)[0]
    assert "unit_action" not in mb
    assert torch.equal(algo.unit_action(mb), algo.policy.scale.to_unit(mb["action"]))
    twin = copy.deepcopy(mb)
    twin["unit_action"] = algo.policy.scale.to_unit(mb["action"])
    assert torch.equal(algo.losses(mb)[1], algo.losses(twin)[1])
