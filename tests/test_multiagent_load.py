"""``pickaxe.load`` of a multi-agent run: a MultiAgentPolicy whose evaluation repeats the numbers the run logged
(team and per agent), which acts on a PettingZoo parallel env's observation dict as the trained network does on its
rows (an agent that left gets no action; Box actions clipped to the bounds), plays whole episodes, and refuses an
agent it does not know in one line; for MAPPO, IPPO with Box actions and independent DQN."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import pickaxe
from pickaxe.algos.multiagent_configs import IDQNConfig, IPPOConfig, MAPPOConfig
from pickaxe.envs.multiagent import MultiAgentVectorEnv, make_parallel_env
from pickaxe.errors import PickaxeError
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import train
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig
from pickaxe.train.multiagent_acting import MultiAgentPolicy

pytest.importorskip("pettingzoo")

GUESS = "pickaxe.envs.multiagent_toys:CoopGuess"
REACH = "pickaxe.envs.multiagent_toys:CoopReach"
RUNS = {
    "mappo": (GUESS, MAPPOConfig(epochs=2, minibatch_size=128)),
    "ippo-box": (REACH, IPPOConfig(epochs=2, minibatch_size=128, shared=False)),
    "idqn": (GUESS, IDQNConfig(learning_starts=128, gradient_steps=4, batch_size=64, target_update_every=50)),
}


@pytest.fixture(scope="module", params=list(RUNS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A finished 512-step run on a toy env (2 agents, the second leaving after 2 of 4 steps), evaluated at its end
    on 6 episodes."""
    env_id, algo = RUNS[request.param]
    cfg = TrainConfig(
        algo=algo,
        env=EnvConfig(id=env_id, num_envs=4, eval_envs=2, kwargs={"leave_at": 2}),
        model=ModelConfig(hidden=(32,)),
        collector=CollectorConfig(steps=128),
        trainer=TrainerConfig(total_steps=512, eval_every=512, eval_episodes=6),
        device="cpu",
    )
    run_dir = tmp_path_factory.mktemp(request.param) / "run"
    train(cfg, run_dir=run_dir)
    return request.param, run_dir


def test_evaluate_repeats_what_the_run_logged_for_the_team_and_each_agent(run: tuple[str, Path]) -> None:
    _, run_dir = run
    policy = pickaxe.load(run_dir, "final")
    assert isinstance(policy, MultiAgentPolicy) and policy.agents == ("agent_0", "agent_1")
    logged = [r for r in read_metrics(run_dir) if "eval/return_mean" in r][-1]
    episodes = policy.evaluate()
    assert len(episodes.returns) == 6
    assert episodes.mean_return == pytest.approx(logged["eval/return_mean"])
    for agent in policy.agents:
        assert episodes.agent_returns[agent].mean() == pytest.approx(logged[f"eval/agent/{agent}/return_mean"])
    np.testing.assert_allclose(sum(episodes.agent_returns.values()), episodes.returns)


def test_act_on_an_observation_dict_is_the_networks_greedy_action_for_the_agents_present(
    run: tuple[str, Path],
) -> None:
    name, run_dir = run
    policy = pickaxe.load(run_dir, "final")
    env = make_parallel_env(policy.config.env.id, **policy.config.env.kwargs)
    rows = MultiAgentVectorEnv(policy.config.env.id, 1, 0, **policy.config.env.kwargs)
    obs, _ = env.reset(seed=3)
    seen_one_agent = False
    while env.agents:
        actions = policy.act(obs)
        assert set(actions) == set(obs)  # an agent that left gets no action
        seen_one_agent |= len(obs) == 1
        x = torch.as_tensor(rows.rows.obs_row(obs)[None])
        with torch.no_grad():
            greedy = policy.module.act(x, None if name != "mappo" else torch.as_tensor(env.state()[None]),
                                       deterministic=True)[0][0].numpy()  # fmt: skip
        for j, agent in enumerate(policy.agents):
            if agent not in obs:
                continue
            if name == "ippo-box":
                space = env.action_space(agent)
                assert space.contains(actions[agent])  # clipped to the bounds, in the space's shape and dtype
                np.testing.assert_allclose(actions[agent], np.clip(greedy[j], space.low, space.high), rtol=1e-6)
            else:
                assert actions[agent] == int(greedy[j])
        obs, *_ = env.step(actions)
    assert seen_one_agent
    rows.close()


def test_play_gives_whole_episodes_per_agent_and_an_unknown_agent_is_one_line(run: tuple[str, Path]) -> None:
    _, run_dir = run
    policy = pickaxe.load(run_dir, "final")
    episodes = policy.play(episodes=3, seed=7)
    assert len(episodes.returns) == 3 and set(episodes.agent_returns) == set(policy.agents)
    assert (episodes.lengths == 4).all()  # the toy's episodes last 4 steps
    np.testing.assert_allclose(sum(episodes.agent_returns.values()), episodes.returns)
    again = policy.play(episodes=3, seed=7)
    np.testing.assert_array_equal(again.returns, episodes.returns)  # greedy and seeded: the same episodes
    env = make_parallel_env(policy.config.env.id, **policy.config.env.kwargs)
    obs, _ = env.reset(seed=0)
    with pytest.raises(PickaxeError, match=r"agent 'stranger'; this run's agents are \('agent_0', 'agent_1'\)"):
        policy.act({**obs, "stranger": obs["agent_0"]})


def test_classic_policy_load_of_a_multi_agent_run_points_at_pickaxe_load(run: tuple[str, Path]) -> None:
    from pickaxe.api import run_config
    from pickaxe.train.acting import ClassicPolicy

    _, run_dir = run
    with pytest.raises(PickaxeError, match=r"multi-agent run: load it with pickaxe.load \(a MultiAgentPolicy"):
        ClassicPolicy.load(run_dir, replace(run_config(run_dir)))
