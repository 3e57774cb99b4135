"""The collector's faster policy path gives the learner's numbers exactly.

``ActorCritic.frozen_act`` runs the actor's and critic's hidden layers stacked (``models.twin_mlp``) and
``models.mlp.MLP`` calls its layers' functions without the module machinery. Both exist for speed only: on the
rows the sampler acted on, its log-probs and values must be the learner's (``evaluate_actions``) bit for bit, or the
two drift apart. These tests check that on the recipe shapes and every action space.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from pickaxe.envs import make
from pickaxe.models import ActorCritic
from pickaxe.models.mlp import MLP, mlp
from pickaxe.models.normalize import ObsNormalized
from pickaxe.models.twin_mlp import TwinMLP
from pickaxe.rollout import Collector

SPACES = [
    gym.spaces.Discrete(2),
    gym.spaces.Discrete(6),
    gym.spaces.Box(-1.0, 1.0, (3,)),
    gym.spaces.MultiDiscrete([3, 4]),
    gym.spaces.MultiBinary(3),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(("hidden", "activation"), [((64, 64), "tanh"), ((64, 64), "relu"), ((256, 256), "relu"),
                                                    ((64,), "tanh"), ((32, 48, 64), "relu")])  # fmt: skip
def test_frozen_act_equals_act_and_the_learners_evaluation_bit_for_bit(space, hidden, activation):
    torch.manual_seed(0)
    policy = ActorCritic(11, space, hidden=hidden, activation=activation)
    assert policy.frozen_act() != policy.act  # the stacked path is taken for these shapes
    for batch in (1, 8, 64, 256):
        obs = torch.randn(batch, 11) * 2
        with torch.no_grad():
            for deterministic in (False, True):
                torch.manual_seed(batch)
                action, extra = policy.act(obs, deterministic)
                torch.manual_seed(batch)
                frozen_action, frozen_extra = policy.frozen_act()(obs, deterministic)
                assert torch.equal(frozen_action, action)
                assert torch.equal(frozen_extra["logprob"], extra["logprob"])
                assert torch.equal(frozen_extra["value"], extra["value"])
            logprob, _, value = policy.evaluate_actions(obs, frozen_action)
        assert torch.equal(frozen_extra["logprob"], logprob)
        assert torch.equal(frozen_extra["value"], value)


def test_frozen_act_keeps_the_weights_it_was_made_with():
    torch.manual_seed(0)
    policy = ActorCritic(4, gym.spaces.Discrete(2))
    obs = torch.randn(8, 4)
    frozen = policy.frozen_act()
    with torch.no_grad():
        before = frozen(obs, True)[1]["value"]
    opt = torch.optim.Adam(policy.parameters(), lr=0.1, fused=True)  # fused Adam leaves version counters alone
    policy.value(obs).sum().backward()
    opt.step()
    with torch.no_grad():
        assert torch.equal(frozen(obs, True)[1]["value"], before)
        fresh = policy.frozen_act()(obs, True)[1]["value"]
        assert not torch.equal(fresh, before)
        assert torch.equal(fresh, policy.value(obs))


@pytest.mark.parametrize("hidden", [(8, 8), (16,), (37, 64), (64, 40)])
def test_widths_the_stacked_matmul_may_round_apart_run_unstacked(hidden):
    policy = ActorCritic(4, gym.spaces.Discrete(2), hidden=hidden)
    assert not TwinMLP.fits(policy.actor, policy.critic)
    assert policy.frozen_act() == policy.act


def test_twin_refuses_mismatched_networks_with_a_clear_message():
    actor, critic = mlp(4, (64, 64), 2), mlp(4, (64, 32), 1)
    assert not TwinMLP.fits(actor, critic)
    with pytest.raises(ValueError, match="same hidden layers"):
        TwinMLP(actor, critic)
    assert not TwinMLP.fits(nn.Sequential(nn.Linear(4, 64), nn.ReLU(inplace=True), nn.Linear(64, 2)),
                            nn.Sequential(nn.Linear(4, 64), nn.ReLU(inplace=True), nn.Linear(64, 1)))  # fmt: skip


def test_observation_normalised_policy_freezes_its_inner_policy():
    torch.manual_seed(0)
    policy = ObsNormalized(ActorCritic(3, gym.spaces.Box(-1.0, 1.0, (2,))), (3,))
    policy.obs_norm.update(torch.randn(64, 3) * 5 + 2)
    obs = torch.randn(8, 3) * 5
    with torch.no_grad():
        torch.manual_seed(1)
        action, extra = policy.act(obs)
        torch.manual_seed(1)
        frozen_action, frozen_extra = policy.frozen_act()(obs)
    assert torch.equal(frozen_action, action) and torch.equal(frozen_extra["value"], extra["value"])


class ActOnly:
    """A policy that offers only ``act``: the collector's plain path."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy

    def act(self, obs: torch.Tensor, deterministic: bool = False):
        return self.policy.act(obs, deterministic)


def test_collector_rollout_is_the_same_with_and_without_the_frozen_path():
    torch.manual_seed(0)
    policy = ActorCritic.for_env(make("CartPole-v1", n=1))
    batches = []
    for p in (policy, ActOnly(policy)):
        torch.manual_seed(7)
        collector = Collector(make("CartPole-v1", 8, 0, "vector"), p, 512)
        batches.append([collector.collect() for _ in range(2)])
    for fast, plain in zip(*batches, strict=True):
        assert fast.keys() == plain.keys()
        for key in list(fast.keys()):  # a TensorDict iterates over its batch, not its keys
            assert torch.equal(fast[key], plain[key]), key


def test_mlp_forward_is_the_layer_by_layer_forward_with_gradients():
    torch.manual_seed(0)
    net = mlp(5, (64, 64), 3, "relu")
    assert isinstance(net, MLP)
    x = torch.randn(32, 5)
    fast = net(x)
    slow = x
    for layer in net:
        slow = layer(slow)
    assert torch.equal(fast, slow)
    (g_fast,) = torch.autograd.grad(fast.sum(), net[0].weight)
    (g_slow,) = torch.autograd.grad(slow.sum(), net[0].weight)
    assert torch.equal(g_fast, g_slow)
    assert isinstance(net[:2], MLP)  # slicing keeps the class (Sequential builds self.__class__)


def test_mlp_still_runs_hooks_registered_on_its_layers():
    net = mlp(4, (64,), 2)
    seen: list[tuple[int, ...]] = []
    net[1].register_forward_hook(lambda module, inputs, output: seen.append(tuple(output.shape)))
    net[2].register_forward_pre_hook(lambda module, inputs: (inputs[0] * 0,))
    out = net(torch.randn(3, 4))
    assert seen == [(3, 64)]
    assert torch.equal(out, net[2].bias.expand(3, 2))  # the pre-hook zeroed the last layer's input


def test_numpy_cartpole_capture_is_not_changed_by_later_steps():
    envs = make("CartPole-v1", 4, 0, "vector")
    envs.reset(seed=0)
    captured = envs.get_attr("pickaxe_state")
    snapshot = [s["state"].copy() for s in captured]
    envs.step(np.ones(4, dtype=np.int64))  # the state is updated in place
    for s, before in zip(captured, snapshot, strict=True):
        assert np.array_equal(s["state"], before)


@pytest.mark.parametrize("layer", [0, 1], ids=["linear", "activation"])
def test_a_hook_on_the_actor_or_critic_keeps_the_layer_by_layer_path(layer):
    policy = ActorCritic(4, gym.spaces.Discrete(2))
    seen: list[int] = []
    policy.critic[layer].register_forward_hook(lambda module, inputs, output: seen.append(output.shape[0]))
    assert not TwinMLP.fits(policy.actor, policy.critic)
    with torch.no_grad():
        policy.frozen_act()(torch.randn(8, 4))
    assert seen == [8]
