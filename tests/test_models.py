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


def test_multidiscrete_matches_independent_categoricals() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(4, gym.spaces.MultiDiscrete([3, 2, 4]))
    obs = torch.randn(64, 4)
    action, extra = ac.act(obs)
    assert action.shape == (64, 3) and (action < torch.tensor([3, 2, 4])).all()
    logprob, entropy, _ = ac.evaluate_actions(obs, action)
    dists = [torch.distributions.Categorical(logits=part) for part in ac.actor(obs).split([3, 2, 4], -1)]
    torch.testing.assert_close(logprob, sum(d.log_prob(action[:, i]) for i, d in enumerate(dists)))
    torch.testing.assert_close(entropy, sum(d.entropy() for d in dists))
    torch.testing.assert_close(extra["logprob"], logprob)
    modes = torch.stack([d.probs.argmax(-1) for d in dists], -1)
    assert torch.equal(ac.act(obs, deterministic=True)[0], modes)


def test_multidiscrete_start_offsets_actions() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(2, gym.spaces.MultiDiscrete([2, 3], start=[5, -1]))
    obs = torch.randn(500, 2)
    action, extra = ac.act(obs)
    assert set(action[:, 0].tolist()) == {5, 6} and set(action[:, 1].tolist()) == {-1, 0, 1}
    torch.testing.assert_close(ac.evaluate_actions(obs, action)[0], extra["logprob"])


def test_multibinary_matches_independent_bernoullis() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(4, gym.spaces.MultiBinary(5))
    obs = torch.randn(64, 4)
    action, extra = ac.act(obs)
    assert action.shape == (64, 5) and action.dtype == torch.int8
    logprob, entropy, _ = ac.evaluate_actions(obs, action)
    dist = torch.distributions.Bernoulli(logits=ac.actor(obs))
    torch.testing.assert_close(logprob, dist.log_prob(action.float()).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    torch.testing.assert_close(extra["logprob"], logprob)
    assert torch.equal(ac.act(obs, deterministic=True)[0], (ac.actor(obs) > 0).to(torch.int8))


def test_multibinary_sampling_frequencies() -> None:
    torch.manual_seed(0)
    ac = ActorCritic(1, gym.spaces.MultiBinary(2))
    with torch.no_grad():
        ac.actor[-1].weight.zero_()
        ac.actor[-1].bias.copy_(torch.logit(torch.tensor([0.2, 0.7])))
    action, _ = ac.act(torch.zeros(20_000, 1))
    torch.testing.assert_close(action.float().mean(0), torch.tensor([0.2, 0.7]), atol=0.015, rtol=0)


def test_image_actor_critic_shares_one_cnn_torso() -> None:
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    ac = ActorCritic(space, gym.spaces.Discrete(6), hidden=())
    names = {n.split(".")[0] for n, _ in ac.named_parameters()}
    assert names == {"torso", "actor", "critic"}  # one CNN, two linear heads (the standard Atari PPO)
    assert ac.actor[0].in_features == 512 and ac.critic[0].in_features == 512
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    action, extra = ac.act(obs)
    logprob, _, value = ac.evaluate_actions(obs, action)
    torch.testing.assert_close(extra["logprob"], logprob)
    torch.testing.assert_close(extra["value"], value)
    value.sum().backward()
    assert ac.torso.conv[0].weight.grad is not None and ac.actor[0].weight.grad is None


def test_vector_actor_critic_keeps_separate_mlps() -> None:
    ac = ActorCritic.for_env(gym.make("CartPole-v1"))
    assert ac.torso is None and {n.split(".")[0] for n, _ in ac.named_parameters()} == {"actor", "critic"}


def test_a_flat_batch_skips_the_flat_encoder_only_where_that_changes_nothing() -> None:
    """``encode``: a [B, F] float32 batch is its own encoding (the same tensor, no module call); other dtypes and
    shapes still go through the encoder (converted, flattened), and so does an encoder with a hook, which must run."""
    from pickaxe.models.encoders import FlatEncoder, encode

    encoder = FlatEncoder(6)
    flat = torch.randn(5, 6)
    assert encode(encoder, flat) is flat
    doubles = torch.randn(5, 6, dtype=torch.float64)
    assert encode(encoder, doubles).dtype == torch.float32
    torch.testing.assert_close(encode(encoder, doubles), doubles.float())
    assert encode(encoder, torch.randn(5, 2, 3)).shape == (5, 6)
    seen: list[tuple[int, ...]] = []
    encoder.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    encode(encoder, flat)
    assert seen == [(5, 6)]
    # the networks that use it compute what they computed through the module
    torch.manual_seed(0)
    q = QNetwork(gym.spaces.Box(-1.0, 1.0, (6,), np.float32), 3, (16,))
    torch.testing.assert_close(q(flat), q.net(encoder(flat)), rtol=0, atol=0)
