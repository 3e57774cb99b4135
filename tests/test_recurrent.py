"""Recurrent PPO: sequence minibatches and masks against hand-built cases, the hidden state carried (and reset)
through the collector, the learner's log-probs equal to the sampler's, bootstrapping with the hidden state after
the step, exact resume, and the memory task that the LSTM policy solves and the feed-forward one cannot."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.configs import PPOConfig, RecurrentPPOConfig
from pickaxe.algos.recurrent_ppo import RecurrentPPO, recurrent_ppo_loss, recurrent_targets
from pickaxe.data.buffers import sequence_chunks
from pickaxe.envs import make
from pickaxe.models.recurrent import RecurrentActorCritic
from pickaxe.recipes import get_recipe
from pickaxe.rollout.collector import Collector
from pickaxe.train.build import build_trainer
from pickaxe.train.evaluate import evaluate


def _hand_rollout(T: int = 5, N: int = 2, H: int = 1) -> TensorDict:
    """obs[t, n] = 10 t + n; env 0 ends an episode at t = 1 (terminated), env 1 at t = 2 (truncated)."""
    t = torch.arange(T, dtype=torch.float32).view(T, 1)
    n = torch.arange(N, dtype=torch.float32).view(1, N)
    code = 10 * t + n
    terminated = torch.zeros(T, N, dtype=torch.bool)
    truncated = torch.zeros(T, N, dtype=torch.bool)
    terminated[1, 0] = True
    truncated[2, 1] = True
    data = {k: code.clone() for k in ("action", "logprob", "value", "advantage", "return")}
    data["obs"] = code.unsqueeze(-1)
    data["h0"] = code.unsqueeze(-1).expand(T, N, H) + 0.5
    data["c0"] = -data["h0"]
    return TensorDict({**data, "terminated": terminated, "truncated": truncated}, batch_size=[T, N])


def test_sequence_chunks_cut_each_env_into_padded_sequences_with_their_initial_states() -> None:
    seqs = sequence_chunks(_hand_rollout(), seq_len=2)
    # T=5, L=2: 3 chunks per env (the last padded), sequence k * N + n
    assert seqs.batch_size == torch.Size([6])
    assert seqs["obs"][..., 0].tolist() == [[0, 10], [1, 11], [20, 30], [21, 31], [40, 0], [41, 0]]
    assert seqs["mask"].tolist() == [[True, True]] * 4 + [[True, False]] * 2
    # a new episode starts at the step after an end: env 0 at t=2 (a chunk's first step: its stored state is
    # already the reset one), env 1 at t=3 (inside chunk 1)
    assert (
        seqs["starts"].tolist() == [[False, False], [False, False], [True, False], [False, True]] + [[False, False]] * 2
    )
    assert seqs["h0"][:, 0].tolist() == [0.5, 1.5, 20.5, 21.5, 40.5, 41.5]
    assert seqs["c0"][:, 0].tolist() == [-0.5, -1.5, -20.5, -21.5, -40.5, -41.5]


def _policy(obs_dim: int = 1, lstm: int = 4, seed: int = 0, separate: bool = False) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    return RecurrentActorCritic(
        gym.spaces.Box(-1, 1, (obs_dim,)), gym.spaces.Discrete(2), hidden=(8,), lstm=lstm, separate_critic=separate
    )


def test_padding_does_not_reach_the_loss() -> None:
    policy = _policy()
    seqs = sequence_chunks(_hand_rollout(H=4), seq_len=2)
    seqs["obs"] = seqs["obs"] / 50
    seqs["action"] = seqs["action"] % 2
    cfg = RecurrentPPOConfig(normalize_advantage=True)
    loss, stats = recurrent_ppo_loss(policy, seqs, cfg, 0.2)
    padded = seqs.clone()
    pad = ~padded["mask"]
    for key in ("obs", "advantage", "return", "logprob", "value"):
        padded[key][pad] = 1e3
    loss2, stats2 = recurrent_ppo_loss(policy, padded, cfg, 0.2)
    assert loss.item() == loss2.item()
    assert all(stats[k].item() == stats2[k].item() for k in stats)


def test_collector_carries_the_hidden_state_across_collects_and_resets_it_at_episode_ends() -> None:
    envs = make("pickaxe/RepeatFirst-v0", 2, seed=0, delay=2)  # episodes of 3 steps
    policy = _policy(obs_dim=3)
    collector = Collector(envs, policy, steps=8)
    first = collector.collect()
    done = first["terminated"] | first["truncated"]
    assert done[2].all() and not done[:2].any()
    assert torch.all(first["h0"][0] == 0)  # the first episode starts from zero
    assert torch.all(first["h0"][3] == 0)  # and so does the next one, after the end at t = 2
    assert torch.all(first["h0"][1] != 0) and torch.all(first["h0"][2] != 0)  # carried within an episode
    state_after = collector.state_dict()["policy_state"]
    second = collector.collect()
    assert torch.equal(second["h0"][0], state_after[0]) and torch.equal(second["c0"][0], state_after[1])
    assert torch.all(second["h0"][0] != 0)  # mid-episode across the collect boundary (t = 4 of 3-step episodes)


@pytest.mark.parametrize("separate", [False, True])
def test_learner_log_probs_and_values_equal_the_samplers(separate: bool) -> None:
    envs = make("CartPole-v1", 4, seed=0)
    policy = _policy(obs_dim=4, lstm=16, separate=separate)
    batch = Collector(envs, policy, steps=4 * 64).collect()
    assert (batch["terminated"] | batch["truncated"]).any()  # episodes end inside the rollout
    seqs = sequence_chunks(batch.set("advantage", batch["value"]).set("return", batch["value"]), seq_len=24)
    with torch.no_grad():
        logprob, _, value = policy.evaluate_sequences(
            seqs["obs"].transpose(0, 1), seqs["action"].transpose(0, 1), (seqs["h0"], seqs["c0"]),
            seqs["starts"].transpose(0, 1),
        )  # fmt: skip
    mask = seqs["mask"]
    assert (logprob.T - seqs["logprob"])[mask].abs().max() <= 1e-6
    assert (value.T - seqs["value"])[mask].abs().max() <= 1e-6


@pytest.mark.parametrize("separate", [False, True])
def test_bootstrap_uses_the_hidden_state_after_the_step_also_at_truncation(separate: bool) -> None:
    envs = make("CartPole-v1", 2, seed=0, max_episode_steps=5)
    policy = _policy(obs_dim=4, lstm=16, separate=separate)
    batch = Collector(envs, policy, steps=2 * 12).collect()
    assert batch["truncated"].any()
    next_value = recurrent_targets(policy, batch)
    going_on = ~(batch["terminated"] | batch["truncated"])[:-1]
    # where the episode goes on, V(next_obs) with the state after the step is the next step's value
    assert (next_value[:-1] - batch["value"][1:])[going_on].abs().max() <= 1e-6
    t, n = (int(i) for i in batch["truncated"].nonzero()[0])
    with torch.no_grad():
        _, _, after = policy.step(batch["obs"][t, n : n + 1], (batch["h0"][t, n : n + 1], batch["c0"][t, n : n + 1]))
        _, with_memory, _ = policy.step(batch["next_obs"][t, n : n + 1], after)
        _, without, _ = policy.step(batch["next_obs"][t, n : n + 1], policy.initial_state(1))
    assert next_value[t, n].item() == pytest.approx(with_memory.item(), abs=1e-6)
    assert abs(with_memory.item() - without.item()) > 1e-4


def test_separate_critic_keeps_the_value_loss_off_the_actors_weights() -> None:
    policy = _policy(obs_dim=4, lstm=8, separate=True)
    assert policy.initial_state(3)[0].shape == (3, 16)  # both LSTMs' states side by side
    state = (torch.randn(3, 16), torch.randn(3, 16))
    _, value, _ = policy.step(torch.randn(3, 4), state)
    value.pow(2).sum().backward()
    for name, p in policy.named_parameters():
        reached = p.grad is not None and bool(p.grad.abs().sum() > 0)
        assert reached == name.startswith(("critic_stream.", "critic.")), name


def test_recurrent_update_runs_whole_sequences_and_reports_ppo_metrics() -> None:
    envs = make("CartPole-v1", 4, seed=0)
    algo = RecurrentPPO(_policy(obs_dim=4, lstm=8), RecurrentPPOConfig(seq_len=8, minibatch_size=16, epochs=2))
    metrics = algo.update(Collector(envs, algo.policy, steps=4 * 20).collect())
    # 20 steps per env -> 3 sequences of 8 per env, 12 in all; 2 per minibatch -> 6 steps per epoch
    assert metrics["ppo/gradient_steps"] == 12
    assert metrics["ppo/approx_kl"] >= 0


def _memory_cfg(algo: str, steps: int):
    cfg = get_recipe("memory-recurrent-ppo")
    if algo == "feed-forward":
        a = cfg.algo
        cfg.algo = PPOConfig(
            lr=a.lr, gamma=a.gamma, gae_lambda=a.gae_lambda, epochs=a.epochs, ent_coef=a.ent_coef, minibatch_size=128
        )
    cfg.trainer = replace(cfg.trainer, total_steps=steps)
    return cfg


def test_memory_task_the_lstm_solves_and_feed_forward_ppo_cannot() -> None:
    # ~6 s + ~5 s here. RepeatFirst with a 4-step delay: eval return 1 = every cue repeated, 0 = chance
    trainer = build_trainer(_memory_cfg("recurrent", 16_384))
    recurrent = trainer.fit()
    assert recurrent.solved_step is not None and recurrent.best_eval_return == 1.0
    feed_forward = build_trainer(_memory_cfg("feed-forward", 8_192)).fit()
    assert feed_forward.solved_step is None and feed_forward.best_eval_return <= 0.5
    # evaluation carries its own hidden state: repeatable, and the collector's state is left as it was
    state = [s.clone() for s in trainer.collector.state_dict()["policy_state"]]
    envs = make("pickaxe/RepeatFirst-v0", 5, seed=123, delay=4)
    a, _ = evaluate(trainer.algo.policy, envs, 20)
    b, _ = evaluate(trainer.algo.policy, envs, 20)
    assert a.tolist() == b.tolist() == [1.0] * 20
    after = trainer.collector.state_dict()["policy_state"]
    assert all(torch.equal(s, t) for s, t in zip(state, after, strict=True))


def test_recurrent_resume_is_exact(tmp_path: Path) -> None:
    from classic_runs import assert_classic_resume_is_exact

    cfg = get_recipe("memory-recurrent-ppo")
    cfg.env = replace(cfg.env, id="CartPole-v1", num_envs=8, kwargs={}, eval_envs=2)
    cfg.algo = replace(cfg.algo, epochs=1, normalize_obs=True, normalize_reward=True)
    cfg.collector = replace(cfg.collector, steps=8 * 15)  # sequences straddle collects and episode ends
    cfg.trainer = replace(cfg.trainer, total_steps=480, eval_every=240, eval_episodes=2, target_return=None)
    assert_classic_resume_is_exact(cfg, tmp_path, cut=240)


def test_memory_tasks_are_registered_and_behave_as_documented() -> None:
    env = gym.make("pickaxe/RepeatFirst-v0", delay=3)
    obs, _ = env.reset(seed=0)
    cue = int(obs[:2].argmax())
    assert obs.tolist().count(1.0) == 1 and obs[2] == 0  # one cue, no query flag
    rewards = []
    for _ in range(3):
        obs, r, term, _, _ = env.step(1 - cue)  # actions before the query do not count
        rewards.append(r)
    assert obs.tolist() == [0.0, 0.0, 1.0] and not term  # the query step: blank cue, flag set
    _, r, term, _, _ = env.step(cue)
    assert rewards == [0.0] * 3 and r == 1.0 and term
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    assert env.step(1 - cue)[1] == -1.0
    masked = gym.make("pickaxe/CartPoleNoVel-v1")
    full = gym.make("CartPole-v1")
    m, f = masked.reset(seed=3)[0], full.reset(seed=3)[0]
    assert m.tolist() == f[[0, 2]].tolist() and masked.spec.max_episode_steps == 500


def _masked_cartpole_cfg(recurrent: bool):
    from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig

    common = dict(lr=1e-3, gamma=0.99, gae_lambda=0.95, epochs=4, ent_coef=0.0, normalize_reward=True)
    algo = (
        RecurrentPPOConfig(lstm=32, seq_len=8, minibatch_size=128, separate_critic=True, **common)
        if recurrent
        else PPOConfig(minibatch_size=128, **common)
    )
    return TrainConfig(
        recipe="masked-cartpole",
        algo=algo,
        env=EnvConfig(id="pickaxe/CartPoleNoVel-v1", num_envs=8, eval_envs=5),
        model=ModelConfig(hidden=(64,), activation="tanh"),
        collector=CollectorConfig(steps=256),
        trainer=TrainerConfig(total_steps=61_440, eval_every=10_240, eval_episodes=5),
    )


@pytest.mark.slow
def test_masked_velocity_cartpole_needs_the_lstm() -> None:
    # ~4 min here (seed 0): best eval 431 with the LSTM (separate critic), 54 feed-forward, over 61k steps
    recurrent = build_trainer(_masked_cartpole_cfg(True)).fit()
    feed_forward = build_trainer(_masked_cartpole_cfg(False)).fit()
    assert recurrent.best_eval_return >= 300
    assert feed_forward.best_eval_return <= 100
