"""The shared gradient step's shortcuts (issue 29's per-step cost) give torch's own numbers bit for bit, and step
back to torch's path wherever something hooks into it."""

import copy
import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pickaxe.algos.base import clip_and_step, step_plan, total_norm
from pickaxe.models.continuous import QEnsemble, polyak
from pickaxe.models.mlp import mlp


def _net_and_grads(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = mlp(3, (16, 16), 2, "relu")
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, fused=True)
    return net, optimizer


def _steps(net: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, reference: bool) -> list[float]:
    """Five steps on fixed data: through clip_and_step, or (``reference``) through torch's clip and step."""
    gen = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(5):
        x = torch.randn(64, 3, generator=gen)
        loss = net(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if reference:
            norms.append(float(nn.utils.clip_grad_norm_(list(net.parameters()), max_norm)))
            optimizer.step()
        else:
            norms.append(clip_and_step(net, optimizer, max_norm, loss)[0])
    return norms


def test_clip_and_step_matches_torchs_clip_and_adam_bit_for_bit() -> None:
    for max_norm in (math.inf, 0.05, 1e3):
        ours, ours_opt = _net_and_grads()
        ref, ref_opt = _net_and_grads()
        assert _steps(ours, ours_opt, max_norm, False) == _steps(ref, ref_opt, max_norm, True)
        for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
            assert torch.equal(a, b)
        state, ref_state = ours_opt.state_dict()["state"], ref_opt.state_dict()["state"]
        for k in state:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(state[k][key], ref_state[k][key])


def test_total_norm_is_torchs() -> None:
    grads = [torch.randn(5, 7), torch.randn(7), torch.randn(2, 3, 4)]
    assert torch.equal(total_norm(grads), nn.utils.get_total_norm(grads))


def test_a_step_hook_still_runs() -> None:
    net, optimizer = _net_and_grads()
    calls = []
    optimizer.register_step_post_hook(lambda *args: calls.append(1))
    _steps(net, optimizer, math.inf, False)
    assert calls == [1] * 5


def test_the_plan_follows_a_new_module_or_optimizer() -> None:
    net, optimizer = _net_and_grads()
    plan = step_plan(net, optimizer)
    assert step_plan(net, optimizer) is plan
    other = mlp(3, (4,), 1)
    assert step_plan(other, optimizer).params == list(other.parameters())
    fresh = torch.optim.Adam(net.parameters(), lr=1e-3)
    assert step_plan(net, fresh).params == list(net.parameters()) and not step_plan(net, fresh).sharded


def test_in_place_activations_give_the_same_values_and_gradients() -> None:
    torch.manual_seed(0)
    q = QEnsemble(_box(3), 1, 2, (8, 8), "relu")
    obs, act = torch.randn(10, 3), torch.rand(10, 1)
    out = q(obs, act)
    out.sum().backward()
    grads = [p.grad.clone() for p in q.parameters()]
    # the same network as out-of-place ops
    x = torch.cat([obs, act], -1).unsqueeze(0).expand(2, 10, 4)
    h = x
    for i, (w, b) in enumerate(zip(q.weights, q.biases, strict=True)):
        h = torch.baddbmm(b, h, w)
        h = torch.relu(h) if i < len(q.weights) - 1 else h
    q.zero_grad()
    h.squeeze(-1).sum().backward()
    assert torch.equal(out, h.squeeze(-1))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, q.parameters(), strict=True))
    net = mlp(3, (8, 8), 2, "tanh")
    x = torch.randn(5, 3)
    expected = x
    for layer in net:
        expected = layer(expected)
    assert torch.equal(net(x), expected)


def test_polyak_follows_a_new_online_module() -> None:
    online = mlp(3, (4,), 1)
    target = copy.deepcopy(online)
    polyak(target, online, 0.5)
    other = mlp(3, (4,), 1)
    polyak(target, other, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), other.parameters(), strict=True))


def _box(n: int) -> gym.spaces.Box:
    return gym.spaces.Box(-1.0, 1.0, (n,), np.float32)
