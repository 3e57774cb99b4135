"""``--dist.offload optimizer``: :class:`HostAdamW` keeps AdamW's moments in host memory and steps there. On the same
device it is AdamW bit for bit (its step is AdamW's function), its state_dict is AdamW's key for key (a checkpoint
resumes with or without the offload), and on two sharded learners (FSDP2 over gloo) it steps each learner's shards
to the weights plain AdamW gives, and resumes from a gathered state. On this CPU-only machine the host and the device
are one memory: the copies to and from pinned buffers a GPU learner makes are not exercised here."""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pickaxe.models.host_optimizer import HostAdamW, adamw_for
from pickaxe.models.sharding import load_sharded_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from learner_group import on_learners
from test_sharding import _algo, _batch, _cases, _full_state, _trained


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, count: int, start: int = 0) -> None:
    """``count`` steps on fixed data, changing lr and weight decay as a schedule does; every third step the last
    layer's bias has no gradient (the optimizer must skip it)."""
    for i in range(start, start + count):
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (0.9**i)
            group["weight_decay"] = 0.1 if i % 2 else 0.0
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)
        opt.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        if i % 3 == 2:
            model[2].bias.grad = None
        opt.step()


@pytest.mark.parametrize("fused", [None, True])
def test_host_adamw_steps_and_saves_as_adamw_does_bit_for_bit(fused: bool | None) -> None:
    plain, host = _net(), _net()
    adamw = torch.optim.AdamW(plain.parameters(), lr=1e-2, fused=fused)
    offloaded = HostAdamW(host.parameters(), lr=1e-2, fused=fused)
    _steps(plain, adamw, 7)
    _steps(host, offloaded, 7)
    for a, b in zip(plain.parameters(), host.parameters(), strict=True):
        assert torch.equal(a, b)
    assert (plain[0].weight - _net()[0].weight).abs().max() > 1e-2  # it moved
    want, got = adamw.state_dict(), offloaded.state_dict()
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for index, entry in want["state"].items():
        assert got["state"][index].keys() == entry.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in entry.items():
            assert torch.equal(got["state"][index][key], value), (index, key)
    # a checkpoint of either resumes with the other: three more steps each way, the same weights
    a2, b2 = copy.deepcopy(plain), copy.deepcopy(host)
    to_plain = torch.optim.AdamW(b2.parameters(), lr=1e-2, fused=fused)
    to_plain.load_state_dict(copy.deepcopy(offloaded.state_dict()))  # load_state_dict keeps the tensors given
    to_host = HostAdamW(a2.parameters(), lr=1e-2, fused=fused)
    to_host.load_state_dict(copy.deepcopy(adamw.state_dict()))
    assert all(v.device.type == "cpu" for s in to_host.state.values() for v in s.values())
    _steps(plain, adamw, 3, start=7)
    _steps(a2, to_host, 3, start=7)
    _steps(b2, to_plain, 3, start=7)
    for a, b, c in zip(plain.parameters(), a2.parameters(), b2.parameters(), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_optimizer_offload_is_a_host_adamw_on_an_accelerator_only() -> None:
    cpu = [torch.nn.Parameter(torch.zeros(3))]
    elsewhere = [torch.nn.Parameter(torch.zeros(3, device="meta"))]  # a device that is not the host
    assert type(adamw_for(cpu, 1e-3, 0.0, None, "optimizer")) is torch.optim.AdamW
    assert type(adamw_for(elsewhere, 1e-3, 0.0, None, "none")) is torch.optim.AdamW
    assert type(adamw_for(elsewhere, 1e-3, 0.0, None, "params")) is torch.optim.AdamW  # FSDP2's own offload
    chosen = adamw_for(elsewhere, 1e-3, 0.01, None, "optimizer")
    assert type(chosen) is HostAdamW and chosen.param_groups[0]["weight_decay"] == 0.01


def _offloaded(algo: Any) -> Any:
    """``algo`` (sharded) with each of its optimizers replaced by a HostAdamW over the same shards holding its
    settings and state, as ``--dist.offload optimizer`` builds on an accelerator."""
    for name in ("optimizer", "critic_optimizer"):
        old = getattr(algo, name, None)
        if old is None:
            continue
        group = old.param_groups[0]
        new = HostAdamW(group["params"], lr=group["lr"], weight_decay=group["weight_decay"], fused=group["fused"])
        load_sharded_optimizer(new, old.state_dict())
        setattr(algo, name, new)
    return algo


def _updates(algo: Any, name: str, cases: dict[str, Any], count: int) -> list[dict[str, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the on-policy checks of a batch sampled by another model
        return [algo.update(_batch(name, cases)) for _ in range(count)]


def _learner(cases: dict[str, Any], out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in ("sft", "llm_ppo"):
        plain, host = _algo(name, cases["model"]), _algo(name, cases["model"])
        plain.shard()
        host.shard()
        _offloaded(host)
        results[name] = {
            "plain": (_updates(plain, name, cases, 2), _trained(plain)),
            "host": (_updates(host, name, cases, 2), _trained(host)),
            "kinds": sorted(
                {type(v).__name__ for s in host.optimizer.state.values() for k, v in s.items() if k != "step"}
            ),
        }
    # resume: one offloaded update, its state gathered, a fresh offloaded learner loading it, one more update
    name = "sft"
    first = _algo(name, cases["model"])
    first.shard()
    _offloaded(first)
    _updates(first, name, cases, 1)
    full = _full_state(first.state_dict())
    fresh = _algo(name, cases["model"])
    fresh.shard()
    _offloaded(fresh)
    fresh.load_state_dict(full)
    results["resumed"] = (_updates(fresh, name, cases, 1), _trained(fresh))
    return results


@pytest.fixture(scope="module")
def learners(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    return on_learners(_learner, _cases(), tmp_path_factory.mktemp("host-adamw"), 2)


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "mem/", "sync/"))}


@pytest.mark.parametrize("name", ["sft", "llm_ppo"])
def test_two_sharded_learners_with_host_adamw_step_as_adamw(learners: list[dict[str, Any]], name: str) -> None:
    start = _trained(_algo(name, _cases()["model"]))
    for learner in learners:
        (plain_metrics, plain), (host_metrics, host) = learner[name]["plain"], learner[name]["host"]
        assert (plain - start).abs().max() > 1e-3  # it learned
        assert torch.equal(host, plain)
        assert [_numbers(m) for m in host_metrics] == [_numbers(m) for m in plain_metrics]
        assert learner[name]["kinds"] == ["DTensor"]  # the moments are shards, as a sharded checkpoint saves them


def test_a_gathered_host_adamw_state_resumes_to_the_uninterrupted_update(learners: list[dict[str, Any]]) -> None:
    for learner in learners:
        _, uninterrupted = learner["sft"]["host"]
        _, resumed = learner["resumed"]
        assert torch.equal(resumed, uninterrupted)
