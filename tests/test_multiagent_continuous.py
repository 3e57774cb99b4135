"""Box actions for IPPO and MAPPO: the Gaussian head's log-probs and entropies (torch's Normal summed over the
dimensions), absent agents masked out of the loss and its gradients with Box actions, the adapter clipping actions to
the bounds and refusing mismatched action spaces in one line, learning on the continuous toy, and the continuous
recipe. Exact resume of a continuous run and independent DQN refusing Box actions are parametrizations of
tests/test_multiagent.py's resume and bad-input tests."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from pickaxe.algos.mappo import MultiAgentPPO
from pickaxe.algos.multiagent_configs import IPPOConfig, MAPPOConfig
from pickaxe.algos.multiagent_core import multiagent_ppo_loss
from pickaxe.envs.make import EnvError
from pickaxe.envs.multiagent import MultiAgentVectorEnv, agent_spaces
from pickaxe.models.actor_critic import gaussian_entropy, gaussian_logprob
from pickaxe.models.multiagent import MultiAgentActorCritic
from pickaxe.rollout.multiagent import MultiAgentCollector
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig

REACH = "pickaxe.envs.multiagent_toys:CoopReach"


def test_gaussian_log_prob_and_entropy_by_hand_and_as_torch_normal_summed_over_dims() -> None:
    # mean (0.5, -1), std (1, 2), action (1.5, 1): both z = 1, so log p = -1 - log 2 - log(2 pi)
    mean, log_std, action = torch.tensor([0.5, -1.0]), torch.tensor([0.0, math.log(2.0)]), torch.tensor([1.5, 1.0])
    want = -1.0 - math.log(2.0) - math.log(2 * math.pi)
    assert gaussian_logprob(mean, log_std, action).item() == pytest.approx(want, abs=1e-6)
    assert gaussian_entropy(log_std).item() == pytest.approx(1.0 + math.log(2 * math.pi) + math.log(2.0), abs=1e-6)


@pytest.mark.parametrize("shared", [True, False])
def test_the_multi_agent_gaussian_head_is_torch_normal_summed_over_dims(shared: bool) -> None:
    torch.manual_seed(0)
    A, D, d = 3, 4, 2
    policy = MultiAgentActorCritic(A, D, d, 5, (8,), shared=shared, central=True, continuous=True)
    assert policy.log_std.shape == (1 if shared else A, d)
    with torch.no_grad():  # every agent its own standard deviations where it has its own actor
        policy.log_std.copy_(torch.linspace(-0.5, 0.5, policy.log_std.numel()).view_as(policy.log_std))
    obs, state = torch.randn(2, A, D), torch.randn(2, 5)
    action, extra = policy.act(obs, state)
    assert action.shape == (2, A, d) and extra["logprob"].shape == (2, A) and extra["value"].shape == (2, A)
    rows, agent = obs.reshape(-1, D), torch.arange(A).repeat(2)
    mean = policy.logits_rows(rows, agent)
    std = policy.log_std[agent if not shared else torch.zeros_like(agent)].exp()
    normal = torch.distributions.Normal(mean, std)
    flat = action.reshape(-1, d)
    logprob, entropy, value = policy.evaluate_rows(rows, policy.critic_input(obs, state).reshape(-1, 5), agent, flat)
    torch.testing.assert_close(logprob, normal.log_prob(flat).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    torch.testing.assert_close(logprob, extra["logprob"].reshape(-1))  # act's log-prob is the learner's
    torch.testing.assert_close(value, extra["value"].reshape(-1))
    greedy, _ = policy.act(obs, state, deterministic=True)  # deterministic evaluation acts with the mean
    assert torch.equal(greedy.reshape(-1, d), mean)


def test_an_absent_agent_with_box_actions_contributes_zero_to_the_loss_and_its_gradients() -> None:
    torch.manual_seed(0)
    n, d = 6, 3
    mask = torch.tensor([True, False, True, True, False, True])
    mean = torch.randn(n, d, requires_grad=True)
    log_std = torch.zeros(d, requires_grad=True)
    action = torch.randn(n, d)
    adv, ret, old_v = torch.randn(n), torch.randn(n), torch.randn(n)
    old = gaussian_logprob(mean, log_std, action).detach() + 0.05 * torch.randn(n)  # ratios inside the clip range
    value = torch.randn(n, requires_grad=True)

    def loss_grads(rows: torch.Tensor, keep: torch.Tensor | None, junk: float) -> tuple[torch.Tensor, ...]:
        """The loss of rows ``rows`` masked by ``keep``, the absent rows' actions set to ``junk``, and its
        gradients."""
        for t in (mean, log_std, value):
            t.grad = None
        a = torch.where(mask[:, None], action, torch.full_like(action, junk))
        logprob = gaussian_logprob(mean[rows], log_std, a[rows])
        entropy = gaussian_entropy(log_std).expand(len(rows))
        loss = multiagent_ppo_loss(logprob, old[rows], adv[rows], entropy, value[rows], old_v[rows], ret[rows], keep,
                                   0.2, 0.5, 0.01, 0.2)[0]  # fmt: skip
        loss.backward()
        return loss.detach(), mean.grad.clone(), log_std.grad.clone(), value.grad.clone()

    every = torch.arange(n)
    loss, g_mean, g_std, g_value = loss_grads(every, mask, 0.0)
    assert torch.all(g_mean[~mask] == 0) and torch.all(g_value[~mask] == 0)
    assert torch.all(g_mean[mask].abs().sum(-1) > 0)
    # whatever the absent rows' actions hold, the loss and every gradient are the same
    for junk in (1e3, -7.0):
        same = loss_grads(every, mask, junk)
        assert all(torch.equal(x, y) for x, y in zip(same, (loss, g_mean, g_std, g_value), strict=True))
    # and they are the loss and gradients of the present rows alone (log_std's included: it is shared by every row)
    alone = loss_grads(mask.nonzero().squeeze(-1), None, 0.0)
    for x, y in zip(alone, (loss, g_mean, g_std, g_value), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shared", [True, False])
def test_an_update_with_box_actions_ignores_everything_about_absent_agent_steps(shared: bool) -> None:
    T, N, A, D, S, d = 5, 2, 3, 4, 6, 2
    mask = torch.rand(T, N, A, generator=torch.Generator().manual_seed(0)) > 0.3

    def batch(junk: float) -> TensorDict:
        g = torch.Generator().manual_seed(1)
        data = {
            "obs": torch.randn(T, N, A, D, generator=g), "next_obs": torch.randn(T, N, A, D, generator=g),
            "state": torch.randn(T, N, S, generator=g), "next_state": torch.randn(T, N, S, generator=g),
            "action": torch.randn(T, N, A, d, generator=g), "logprob": torch.randn(T, N, A, generator=g) - 3,
            "value": torch.randn(T, N, A, generator=g), "reward": torch.randn(T, N, A, generator=g),
            "terminated": torch.zeros(T, N, A, dtype=torch.bool), "truncated": torch.zeros(T, N, A, dtype=torch.bool),
            "mask": mask,
        }  # fmt: skip
        for key in ("obs", "next_obs", "action", "logprob", "value", "reward"):
            m = mask.view(*mask.shape, *[1] * (data[key].dim() - 3))
            fill = math.inf if key == "action" and junk else junk
            data[key] = torch.where(m, data[key], torch.full_like(data[key], fill))
        return TensorDict(data, batch_size=[T, N])

    weights = []
    for junk in (0.0, 123.0):  # absent actions 0, then infinite (and the other absent rows 123)
        torch.manual_seed(3)
        policy = MultiAgentActorCritic(A, D, d, S, (16,), shared=shared, central=True, continuous=True)
        algo = MultiAgentPPO(policy, MAPPOConfig(epochs=2, minibatch_size=8))
        torch.manual_seed(4)
        metrics = algo.update(batch(junk))
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        weights.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_the_adapter_clips_box_actions_to_the_bounds_and_keeps_them_unclipped_in_the_batch() -> None:
    envs = MultiAgentVectorEnv(REACH, 2, seed=0, leave_at=2, bound=1.0)
    assert envs.spaces.continuous and envs.spaces.n_actions == 2
    assert np.array_equal(envs.spaces.action_high, np.ones((2, 2), dtype=np.float32))
    twin = MultiAgentVectorEnv(REACH, 2, seed=0, leave_at=2, bound=1.0)
    envs.reset(), twin.reset()
    far = np.full((2, 2, 2), 5.0, dtype=np.float32)
    far[:, 1] = -40.0
    a, b = envs.step(far, envs.alive()), twin.step(np.clip(far, -1.0, 1.0), twin.alive())
    assert np.array_equal(a.reward, b.reward) and np.array_equal(a.obs, b.obs)
    # the collector keeps the sampled (unclipped) action, whose log-prob the learner recomputes
    policy = MultiAgentActorCritic(2, 3, 2, 5, (8,), central=True, continuous=True, log_std_init=1.0)
    batch = MultiAgentCollector(envs, policy, steps=64).collect()
    assert batch["action"].shape == (32, 2, 2, 2) and batch["action"].abs().max() > 1.0
    assert batch["action"].dtype == torch.float32


class _Stub:
    """The parts of a parallel env that ``agent_spaces`` reads."""

    def __init__(self, actions: dict[str, Any]) -> None:
        self.possible_agents = list(actions)
        self.actions = actions

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-1.0, 1.0, (3,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return self.actions[agent]

    def state(self) -> np.ndarray:
        raise NotImplementedError


@pytest.mark.parametrize(
    ("second", "words"),
    [
        (spaces.Box(-1.0, 1.0, (3,), np.float32), ["agent b", "Box(-1.0, 1.0, (3,)", "one action space"]),
        (spaces.Discrete(2), ["agent b", "Discrete(2)", "one action space"]),
        (spaces.MultiDiscrete([2, 2]), ["agent b", "MultiDiscrete", "Discrete actions or float Box"]),
    ],
)
def test_agents_with_different_action_spaces_are_one_line_naming_the_agent(second: spaces.Space, words: list[str]):
    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    with pytest.raises(EnvError) as info:
        agent_spaces(_Stub({"a": box, "b": second}), "x:y")
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), str(info.value)
    # bounds may differ between agents: each is clipped to its own
    s = agent_spaces(_Stub({"a": box, "b": spaces.Box(0.0, 2.0, (2,), np.float32)}), "x:y")
    assert s.continuous and s.action_low.tolist() == [[-1, -1], [0, 0]] and s.state_dim is None


def _reach_run(algo: object, total: int) -> TrainConfig:
    """A small run on the continuous toy: 2 agents, the second leaving after 2 of 4 steps."""
    return TrainConfig(
        algo=algo,
        env=EnvConfig(id=REACH, num_envs=4, eval_envs=2, kwargs={"leave_at": 2}),
        model=ModelConfig(hidden=(32,)),
        collector=CollectorConfig(steps=128),
        trainer=TrainerConfig(total_steps=total, eval_every=1024, eval_episodes=20),
        device="cpu",
    )


@pytest.mark.parametrize(
    "algo",
    [
        MAPPOConfig(lr=3e-3, epochs=4, minibatch_size=256),
        IPPOConfig(lr=3e-3, epochs=4, minibatch_size=256, shared=False),
    ],
)
def test_learns_the_continuous_toy_well_above_the_untrained_policy(algo: object) -> None:
    from pickaxe.train.build import build_trainer

    trainer = build_trainer(_reach_run(algo, 2048))
    before = trainer.evaluate()
    trainer.fit()
    after = trainer.evaluate()
    trainer.close()
    # the best return is 0; the untrained policy (means about 0) expects 6 agent-steps of -2/3 each, about -4
    assert before["eval/return_mean"] <= -3.0, before
    assert after["eval/return_mean"] >= -1.0, after
    assert after["eval/agent/agent_1/return_mean"] >= -0.5, after  # the agent that leaves mid-episode learned too


def test_the_continuous_recipe_is_mpe2_simple_spread_with_continuous_actions() -> None:
    pytest.importorskip("mpe2")
    from pickaxe.recipes import get_recipe

    cfg, discrete = get_recipe("simple-spread-mappo-continuous"), get_recipe("simple-spread-mappo")
    assert cfg.env.kwargs == {**discrete.env.kwargs, "continuous_actions": True}
    assert cfg.algo == discrete.algo and cfg.trainer == discrete.trainer and cfg.collector == discrete.collector
    cfg.check()
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    envs = MultiAgentVectorEnv(cfg.env.id, 1, seed=0, **cfg.env.kwargs)
    assert envs.spaces.continuous and envs.spaces.n_actions == 5
    assert envs.spaces.action_low.min() == 0.0 and envs.spaces.action_high.max() == 1.0
    idqn = replace(get_recipe("simple-spread-idqn"), env=cfg.env)
    with pytest.raises(EnvError, match=r"idqn takes Discrete actions .* Box actions of size 5; use ippo or mappo"):
        idqn.check()
