"""Actor-critic and Q-network: sampler log-probs equal learner log-probs; deterministic actions are modes."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from pickaxe.models import ActorCritic, EpsilonGreedy, QNetwork


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)])
def test_act_logprob_equals_evaluate_actions(space: gym.Space) -> None:
    torch.manual_seed(0)
    ac = ActorCritic(4, space)
    obs = torch.randn(256, 4)
    action, extra = ac.act(obs)
    logprob, entropy, value = ac.evaluate_actions(obs, action)
    torch.testing.assert_close(extra["logprob"], logprob)
    torch.testing.assert_close(extra["value"], value)
    assert entropy.shape == (256,) and (entropy > 0).all()


def test_categorical_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(4, gym.spaces.Discrete(3))
    obs, action = torch.randn(64, 4), torch.randint(3, (64,))
    logprob, entropy, _ = ac.evaluate_actions(obs, action)
    dist = torch.distributions.Categorical(logits=ac.actor(obs))
    torch.testing.assert_close(logprob, dist.log_prob(action))
    torch.testing.assert_close(entropy, dist.entropy())


def test_gaussian_matches_torch_distributions() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(3, gym.spaces.Box(-2.0, 2.0, (2,), np.float32), log_std_init=-0.5)
    obs, action = torch.randn(64, 3), torch.randn(64, 2)
    logprob, entropy, _ = ac.evaluate_actions(obs, action)
    dist = torch.distributions.Normal(ac.actor(obs), ac.log_std.exp())
    torch.testing.assert_close(logprob, dist.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))


def test_categorical_sampling_frequencies() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(1, gym.spaces.Discrete(3))
    with torch.no_grad():
        ac.actor[-1].bias.copy_(torch.log(torch.tensor([0.2, 0.3, 0.5])))
        ac.actor[-1].weight.zero_()
    action, _ = ac.act(torch.zeros(20_000, 1))
    freq = torch.bincount(action, minlength=3).float() / 20_000
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.3, 0.5]), atol=0.015, rtol=0)
    assert (ac.act(torch.zeros(5, 1), deterministic=True)[0] == 2).all()


def test_epsilon_greedy() -> None:
    torch.manual_seed(0)
    q = QNetwork(4, 2, hidden=(8,))
    obs = torch.randn(4000, 4)
    greedy = q(obs).argmax(-1)
    policy = EpsilonGreedy(q, epsilon=0.5)
    action, _ = policy.act(obs)
    # half the actions are uniform, so ~25% differ from greedy
    assert 0.2 < (action != greedy).float().mean() < 0.3
    assert torch.equal(policy.act(obs, deterministic=True)[0], greedy)


def test_q_network_refuses_continuous_actions() -> None:
    env = gym.make("Pendulum-v1")
    with pytest.raises(ValueError, match="Discrete actions"):
        QNetwork.for_env(env)
