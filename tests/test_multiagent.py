"""Multi-agent RL on PettingZoo (IPPO, MAPPO, independent DQN): absent agents masked out of the loss and its
gradient (known answers), per-agent GAE stopping where an agent leaves, double-DQN targets, the adapter's round trip
on a tiny parallel env (an agent leaving mid-episode, an AEC env converted), learning on a tiny cooperative env, exact
resume after a SIGKILL, and bad input as one line with exit status 2."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from pickaxe.algos.mappo import MultiAgentPPO
from pickaxe.algos.multiagent_configs import IDQNConfig, IPPOConfig, MAPPOConfig
from pickaxe.algos.multiagent_core import agent_gae, independent_q_target, masked_mean, multiagent_ppo_loss
from pickaxe.data.returns import gae
from pickaxe.envs.multiagent import MultiAgentVectorEnv, is_multiagent_id
from pickaxe.models.multiagent import MultiAgentActorCritic
from pickaxe.rollout.multiagent import MultiAgentCollector
from pickaxe.train.config import CollectorConfig, EnvConfig, ModelConfig, TrainConfig, TrainerConfig

TOY = "pickaxe.envs.multiagent_toys:CoopGuess"


def _toy_run(algo: object, total: int = 2048, **kwargs: object) -> TrainConfig:
    """A small run on the toy env: 2 agents, the second leaving after 2 of 4 steps."""
    return TrainConfig(
        algo=algo,
        env=EnvConfig(id=TOY, num_envs=4, eval_envs=2, kwargs={"leave_at": 2}),
        model=ModelConfig(hidden=(32,)),
        collector=CollectorConfig(steps=128),
        trainer=TrainerConfig(total_steps=total, eval_every=1024, eval_episodes=20, **kwargs),  # type: ignore[arg-type]
        device="cpu",
    )


def test_masked_agent_contributes_zero_to_the_loss_and_its_gradient() -> None:
    torch.manual_seed(0)
    n = 6
    mask = torch.tensor([True, True, False, True, False, True])
    logits = torch.randn(n, 3, requires_grad=True)
    action = torch.randint(0, 3, (n,))
    old = torch.randn(n)
    adv, ret, old_v = torch.randn(n), torch.randn(n), torch.randn(n)
    value = torch.randn(n, requires_grad=True)

    def loss_of(adv: torch.Tensor, ret: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits, -1)
        logprob = logp.gather(-1, action[:, None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return multiagent_ppo_loss(logprob, old, adv, entropy, value, old_v, ret, mask, 0.2, 0.5, 0.01, 0.2)[0]

    loss = loss_of(adv, ret, old)
    loss.backward()
    assert torch.all(logits.grad[~mask] == 0) and torch.all(value.grad[~mask] == 0)
    assert torch.all(logits.grad[mask].abs().sum(-1) > 0)
    # the absent rows' advantages, returns and old log-probs change nothing
    junk = torch.full((n,), 1e6)
    same = loss_of(torch.where(mask, adv, junk), torch.where(mask, ret, junk), torch.where(mask, old, -junk))
    assert same.item() == loss.item()
    # and the loss is exactly the unmasked loss of the present rows alone
    keep = mask.nonzero().squeeze(-1)
    logp = torch.log_softmax(logits, -1)[keep]
    lp = logp.gather(-1, action[keep, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    alone = multiagent_ppo_loss(lp, old[keep], adv[keep], ent, value[keep], old_v[keep], ret[keep], None, 0.2, 0.5,
                                0.01, 0.2)[0]  # fmt: skip
    torch.testing.assert_close(loss, alone, rtol=1e-6, atol=1e-7)
    assert masked_mean(torch.tensor([1.0, 5.0]), torch.tensor([True, False])).item() == 1.0


def test_agent_gae_stops_where_an_agent_leaves_and_matches_gae_while_present() -> None:
    # T=4, N=1, A=2; agent 1 terminates at t=1 and is absent at t=2, 3
    reward = torch.tensor([[[1.0, 2.0]], [[1.0, 3.0]], [[1.0, 99.0]], [[1.0, 99.0]]])
    value = torch.tensor([[[0.5, 0.1]], [[0.5, 0.2]], [[0.5, 7.0]], [[0.5, 7.0]]])
    next_value = torch.full((4, 1, 2), 0.3)
    term = torch.zeros(4, 1, 2, dtype=torch.bool)
    term[1, 0, 1] = True
    trunc = torch.zeros_like(term)
    present = torch.ones_like(term)
    present[2:, 0, 1] = False
    adv, ret = agent_gae(reward, value, next_value, term, trunc, present, 0.9, 0.8)
    a0, r0 = gae(reward[:, :, 0], value[:, :, 0], next_value[:, :, 0], term[:, :, 0], trunc[:, :, 0], 0.9, 0.8)
    torch.testing.assert_close(adv[:, :, 0], a0)
    torch.testing.assert_close(ret[:, :, 0], r0)
    # agent 1: t=1 ends its episode (3 - 0.2), t=0 bootstraps from it; the absent steps are zero
    d1 = 3.0 - 0.2
    d0 = 2.0 + 0.9 * 0.3 - 0.1
    torch.testing.assert_close(adv[:, 0, 1], torch.tensor([d0 + 0.9 * 0.8 * d1, d1, 0.0, 0.0]))


def test_update_ignores_everything_about_absent_agent_steps() -> None:
    torch.manual_seed(0)
    T, N, A, D, S = 5, 2, 3, 4, 6
    mask = torch.rand(T, N, A) > 0.3

    def batch(junk: float) -> TensorDict:
        g = torch.Generator().manual_seed(1)
        data = {
            "obs": torch.randn(T, N, A, D, generator=g), "next_obs": torch.randn(T, N, A, D, generator=g),
            "state": torch.randn(T, N, S, generator=g), "next_state": torch.randn(T, N, S, generator=g),
            "action": torch.randint(0, 5, (T, N, A), generator=g), "logprob": torch.randn(T, N, A, generator=g) - 2,
            "value": torch.randn(T, N, A, generator=g), "reward": torch.randn(T, N, A, generator=g),
            "terminated": torch.zeros(T, N, A, dtype=torch.bool), "truncated": torch.zeros(T, N, A, dtype=torch.bool),
            "mask": mask,
        }  # fmt: skip
        for key in ("obs", "next_obs", "logprob", "value", "reward"):
            m = mask.view(*mask.shape, *[1] * (data[key].dim() - 3))
            data[key] = torch.where(m, data[key], torch.full_like(data[key], junk))
        return TensorDict(data, batch_size=[T, N])

    weights = []
    for junk in (0.0, 123.0):
        torch.manual_seed(3)
        policy = MultiAgentActorCritic(A, D, 5, S, (16,), central=True)
        algo = MultiAgentPPO(policy, MAPPOConfig(epochs=2, minibatch_size=8))
        torch.manual_seed(4)
        algo.update(batch(junk))
        weights.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_independent_q_target_is_double_dqns_and_stops_where_the_agent_left() -> None:
    online = torch.tensor([[1.0, 3.0, 2.0], [5.0, 0.0, 1.0]])
    target = torch.tensor([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])
    reward, term = torch.tensor([1.0, 2.0]), torch.tensor([False, True])
    # double: the online argmax (1, 0) valued by the target net (20, 40); the second agent left: no bootstrap
    assert independent_q_target(online, target, reward, term, 0.5).tolist() == [11.0, 2.0]
    assert independent_q_target(online, target, reward, ~term, 0.5, double=False).tolist() == [1.0, 32.0]


@pytest.mark.parametrize("shared", [True, False])
def test_policy_shapes_and_per_agent_networks(shared: bool) -> None:
    torch.manual_seed(0)
    policy = MultiAgentActorCritic(3, 4, 5, 6, (8,), shared=shared, central=True)
    obs, state = torch.randn(2, 3, 4), torch.randn(2, 6)
    action, extra = policy.act(obs, state)
    assert action.shape == (2, 3) and extra["logprob"].shape == (2, 3) and extra["value"].shape == (2, 3)
    agent = torch.arange(3).expand(2, 3).reshape(-1)
    logprob, _, value = policy.evaluate_rows(obs.reshape(6, 4), policy.critic_input(obs, state).reshape(6, -1),
                                             agent, action.reshape(-1))  # fmt: skip
    torch.testing.assert_close(logprob, extra["logprob"].reshape(-1))
    torch.testing.assert_close(value, extra["value"].reshape(-1))
    assert len(policy.actors) == (1 if shared else 3)


def test_adapter_round_trip_with_an_agent_leaving_mid_episode() -> None:
    envs = MultiAgentVectorEnv(TOY, 2, seed=5, leave_at=2)
    assert envs.agents == ("agent_0", "agent_1") and envs.spaces.state_dim == 6
    obs, alive, state = envs.reset()
    assert obs.shape == (2, 2, 4) and alive.all() and state is not None and state.shape == (2, 6)
    seen_alive, seen_ended = [], []
    for _ in range(8):
        target = obs[:, 0, :3].argmax(-1)  # both agents name the target they see: every present agent is rewarded
        step = envs.step(np.stack([target, target], 1), alive)
        assert np.array_equal(step.reward, alive.astype(np.float32))
        seen_alive.append(alive[:, 1].copy())
        seen_ended.append(step.ended.copy())
        obs, alive = step.obs, step.alive
    # agent_1 acts at steps 0 and 1 of each 4-step episode, then is absent until the next episode
    assert [bool(a[0]) for a in seen_alive] == [True, True, False, False] * 2
    assert [bool(e[0]) for e in seen_ended] == [False, False, False, True] * 2
    # the same seed gives the same episodes; captured env state continues them exactly
    again = MultiAgentVectorEnv(TOY, 2, seed=5, leave_at=2)
    assert np.array_equal(again.reset()[0], envs.reset(seed=5)[0])
    assert envs.state_support() == "exact"
    saved = envs.get_states()
    a = envs.step(np.zeros((2, 2), int), envs.alive())
    again.set_states(saved)
    b = again.step(np.zeros((2, 2), int), again.alive())
    assert np.array_equal(a.obs, b.obs) and np.array_equal(a.reward, b.reward)


def test_an_aec_env_goes_through_pettingzoos_conversion() -> None:
    pytest.importorskip("mpe2")
    assert is_multiagent_id("mpe2:simple_spread_v3") and not is_multiagent_id("CartPole-v1")
    envs = MultiAgentVectorEnv("mpe2:simple_spread_v3", 1, seed=0, N=2, max_cycles=3)
    obs, alive, state = envs.reset()
    assert obs.shape == (1, 2, envs.spaces.obs_dim) and alive.all() and state.shape == (1, envs.spaces.state_dim)
    ended = [envs.step(np.zeros((1, 2), int), envs.alive()).ended[0] for _ in range(3)]
    assert ended == [False, False, True] and envs.alive().all()


@pytest.mark.parametrize(
    ("env_id", "continuous"),
    [("mpe2:simple_spread_v3", False), ("mpe2:simple_adversary_v3", False), ("mpe2:simple_spread_v3", True)],
)
def test_mpe_state_is_captured_exactly_across_episode_ends(env_id: str, continuous: bool) -> None:
    pytest.importorskip("mpe2")
    kw = {"max_cycles": 5, "continuous_actions": continuous}
    a, b = MultiAgentVectorEnv(env_id, 2, seed=7, **kw), MultiAgentVectorEnv(env_id, 2, seed=99, **kw)
    rng = np.random.default_rng(0)

    def draw() -> np.ndarray:  # Box actions drawn past their [0, 1] bounds too: the adapter clips them
        shape = (2, a.num_agents)
        return rng.normal(0.5, 1.0, (*shape, 5)).astype(np.float32) if continuous else rng.integers(0, 5, shape)

    a.reset()
    for _ in range(3):
        a.step(draw(), a.alive())
    assert a.state_support() == "exact"
    saved = a.get_states()
    actions = [draw() for _ in range(8)]  # two episode ends on the way
    first = [a.step(x, a.alive()) for x in actions]
    b.set_states(saved)
    for x, want in zip(actions, first, strict=True):
        got = b.step(x, b.alive())
        for key in ("obs", "next_obs", "reward", "terminated", "truncated", "ended", "state", "next_state"):
            assert np.array_equal(getattr(got, key), getattr(want, key)), key


def test_collector_batch_carries_agents_as_a_dimension_with_a_mask() -> None:
    envs = MultiAgentVectorEnv(TOY, 2, seed=0, leave_at=2)
    policy = MultiAgentActorCritic(2, 4, 3, 6, (8,), central=True)
    collector = MultiAgentCollector(envs, policy, steps=16)
    batch = collector.collect()
    assert batch.batch_size == torch.Size([8, 2]) and batch["obs"].shape == (8, 2, 2, 4)
    assert batch["state"].shape == (8, 2, 6) and batch["mask"].shape == (8, 2, 2)
    assert batch["mask"][:, :, 1].float().mean().item() == 0.5  # present half of each episode
    assert (batch["reward"][~batch["mask"]] == 0).all()
    assert "rollout/agent/agent_1/return_mean" in collector.metrics()


IDQN = IDQNConfig(learning_starts=256, gradient_steps=16, batch_size=128, target_update_every=50, eps_fraction=0.5)


@pytest.mark.parametrize(
    ("algo", "total"),
    [
        (MAPPOConfig(lr=3e-3, epochs=4, minibatch_size=256), 2048),
        (IPPOConfig(lr=3e-3, epochs=4, minibatch_size=256, shared=False), 2048),
        (IDQN, 1024),
    ],
)
def test_learns_the_cooperative_toy_well_above_the_untrained_policy(algo: object, total: int) -> None:
    from pickaxe.train.build import build_trainer

    cfg = _toy_run(algo, total=total)
    trainer = build_trainer(cfg)
    trainer.fit()
    after = trainer.evaluate()
    trainer.close()
    # the best return is 6 (agent_0 present 4 steps, agent_1 2); the untrained policy (near-uniform logits) expects
    # 2 * 2 / 9 + 2 / 3 = 1.11: both agents name the target by chance while both are present, agent_0 alone after
    assert after["eval/return_mean"] >= 1.11 + 3.5, after
    assert after["eval/agent/agent_1/return_mean"] >= 1.5
    assert after["eval/return_mean_ci_low"] <= after["eval/return_mean"] <= after["eval/return_mean_ci_high"]


MPE = EnvConfig(id="mpe2:simple_spread_v3", num_envs=4, eval_envs=2, kwargs={"N": 2, "max_cycles": 5})
REACH = EnvConfig(id="pickaxe.envs.multiagent_toys:CoopReach", num_envs=4, eval_envs=2, kwargs={"leave_at": 2})


@pytest.mark.parametrize(
    ("algo", "env"),
    [
        (MAPPOConfig(epochs=2, minibatch_size=128), None),
        (replace(IDQN, gradient_steps=4), None),
        (MAPPOConfig(epochs=2, minibatch_size=128, shared=False), REACH),  # Box actions, a Gaussian actor per agent
        pytest.param(MAPPOConfig(epochs=2, minibatch_size=128), MPE, marks=pytest.mark.slow),  # MPE2's captured state
    ],
)
def test_a_run_killed_and_resumed_ends_exactly_as_one_never_stopped(
    tmp_path: Path, algo: object, env: EnvConfig | None
) -> None:
    from safetensors.torch import load_file

    from pickaxe.runs.run import read_metrics
    from pickaxe.train.build import resume, train

    cfg = _toy_run(algo, total=768)
    cfg.env = env or cfg.env
    cfg.trainer = replace(cfg.trainer, eval_every=256, eval_episodes=4)
    train(cfg, run_dir=tmp_path / "full")
    # SIGKILLed after its 5th iteration (640 env steps; the checkpoint of step 512 is the newest), then resumed
    code = "import json, sys; from pickaxe.train.build import config_from_dict, train; "
    code += "train(config_from_dict(json.loads(sys.argv[1])), run_dir=sys.argv[2])"
    child = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cfg.to_dict()), str(tmp_path / "cut")],
        env={**os.environ, "PICKAXE_FAULT": "iteration:5"},
        capture_output=True,
        text=True,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    resume(tmp_path / "cut")
    full, cut = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("full", "cut"))
    assert full.keys() == cut.keys() and all(torch.equal(full[k], cut[k]) for k in full)
    records = read_metrics(tmp_path / "full", deterministic=True)
    assert records == read_metrics(tmp_path / "cut", deterministic=True)
    assert "resume is exact" in (tmp_path / "cut" / "events.jsonl").read_text()
    assert any("eval/agent/agent_1/return_mean_ci_low" in r for r in records)
    # `pickaxe eval RUN` plays the run's own eval episodes with its final model: the last evaluation's numbers
    from pickaxe.train.build import evaluate_run

    returns, lengths = evaluate_run(cfg, tmp_path / "full", episodes=4)
    assert float(returns.mean()) == records[-1]["eval/return_mean"]
    assert float(lengths.mean()) == records[-1]["eval/length_mean"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simple-spread-mappo", "--env.id", "CartPole-v1"], ["mappo", "PettingZoo"]),
        (["cartpole-ppo", "--env.id", TOY], ["multi-agent", "ppo"]),
        pytest.param(
            ["simple-spread-idqn", "--env.kwargs.continuous_actions", "true"],
            ["idqn takes Discrete", "Box", "mappo"],
            marks=pytest.mark.skipif(importlib.util.find_spec("mpe2") is None, reason="needs mpe2"),
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pickaxe.cli", "train", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_mappo_on_an_env_without_a_global_state_is_refused_in_one_line() -> None:
    from pickaxe.errors import PickaxeError
    from pickaxe.recipes import get_recipe

    cfg = get_recipe("simple-spread-mappo")
    cfg.env = EnvConfig(id="pettingzoo.classic:rps_v2")
    with pytest.raises(PickaxeError, match=r"has no state\(\); use ippo") as info:
        cfg.check()
    assert "\n" not in str(info.value)
    cfg.algo = IPPOConfig()  # rock-paper-scissors: a competitive env, Discrete observations one-hot
    cfg.check()


def test_recipes_are_listed_with_their_algorithms() -> None:
    from pickaxe.recipes import get_recipe
    from pickaxe.recipes.algos import algo_catalog

    entries = {e.name: e for e in algo_catalog()}
    assert set(entries["mappo"].recipes) == {
        "simple-spread-mappo", "simple-spread-mappo-continuous", "simple-adversary-mappo",
    }  # fmt: skip
    assert entries["ippo"].recipes == ("simple-spread-ippo",)
    assert entries["idqn"].recipes == ("simple-spread-idqn",)
    cfg = get_recipe("simple-spread-mappo")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert replace(cfg.algo, lr=1e-3).lr == 1e-3
    from pickaxe.train.eval_metrics import check_select_metric

    cfg.select = replace(cfg.select, metric="eval/agent/agent_2/return_mean")  # a per-agent metric can pick the best
    check_select_metric(cfg)


def test_without_pettingzoo_a_multi_agent_recipe_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: on the base install, `pickaxe train simple-spread-mappo` said 'mpe2:simple_spread_v3' was no
    PettingZoo env and pointed at that very id."""
    import importlib.util

    from pickaxe.errors import ConfigError
    from pickaxe.recipes import get_recipe

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in ("pettingzoo", "mpe2") else real(n, *a))
    monkeypatch.setattr("pickaxe.envs.multiagent.parallel_factory", lambda env_id: None)  # as when mpe2 is missing
    with pytest.raises(ConfigError, match=r"pip install 'pickaxe\[marl\]'"):
        get_recipe("simple-spread-mappo").check()


@pytest.fixture(scope="module")
def toy_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished MAPPO run on the toy env with policies kept at env steps 256 and 512."""
    from pickaxe.train.build import train

    cfg = _toy_run(MAPPOConfig(epochs=2, minibatch_size=128), total=512)
    cfg.trainer = replace(cfg.trainer, eval_every=256, eval_episodes=6)
    run_dir = tmp_path_factory.mktemp("marl_eval") / "run"
    train(cfg, run_dir=run_dir)
    return run_dir


def test_eval_checkpoints_gives_each_agent_and_the_total_with_cis_and_selects_on_the_total(
    toy_run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickaxe.cli import main
    from pickaxe.runs.run import read_metrics

    assert main(["eval", str(toy_run_dir), "--checkpoints", "all"]) == 0
    out = capsys.readouterr().out
    report = json.loads((toy_run_dir / "eval" / "checkpoints.json").read_text())
    assert report["kind"] == "multiagent" and [r["step"] for r in report["rows"]] == [256, 512]
    logged = {r["step"]: r for r in read_metrics(toy_run_dir) if "eval/return_mean" in r}
    for row in report["rows"]:  # the run's own eval episodes again: the numbers and CIs its evaluations logged
        record = logged[row["step"]]
        for name in ("eval/return_mean", "eval/agent/agent_0/return_mean", "eval/agent/agent_1/return_mean"):
            e = row["metrics"][name]
            assert (e["mean"], e["low"], e["high"]) == tuple(record[name + s] for s in ("", "_ci_low", "_ci_high"))
            assert e["n"] == 6 and e["low"] <= e["mean"] <= e["high"]
            assert row["metrics"][name.replace("_mean", "_iqm")]["n"] == 6
        agents = sum(row["metrics"][f"eval/agent/agent_{j}/return_mean"]["mean"] for j in range(2))
        assert agents == pytest.approx(row["metrics"]["eval/return_mean"]["mean"])
    # the best step: the run's rule on the team's total, as the run's own selection.json chose it
    selection = json.loads((toy_run_dir / "selection.json").read_text())
    assert report["best"]["metric"] == "eval/return_mean" and report["best"]["step"] == selection["step"]
    # the table: per step a row for the total and one per agent
    rows = [line.split() for line in out.splitlines() if "[" in line and "by rule" not in line]
    assert [r[0] for r in rows if "total" in r] == ["256", "512"]
    assert sum("agent_0" in r for r in rows) == 2 and sum("agent_1" in r for r in rows) == 2
    assert "0 of 2 from the cache" in out
    assert main(["eval", str(toy_run_dir), "--checkpoints", "best"]) == 0  # `best`: from the results above
    assert "1 of 1 from the cache" in capsys.readouterr().out


def test_eval_of_a_multi_agent_run_prints_each_agent_and_the_total_with_cis(
    toy_run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pickaxe.cli import main
    from pickaxe.runs.run import read_metrics

    assert main(["eval", str(toy_run_dir)]) == 0
    out = json.loads(capsys.readouterr().out)
    last = [r for r in read_metrics(toy_run_dir) if "eval/return_mean" in r][-1]
    for name in ("return_mean", "agent/agent_0/return_mean", "agent/agent_1/return_mean"):
        assert [out[name + s] for s in ("", "_ci_low", "_ci_high")] == [last[f"eval/{name}{s}"] for s in
                                                                        ("", "_ci_low", "_ci_high")]  # fmt: skip
    assert out["episodes"] == 6 and out["length_mean"] == last["eval/length_mean"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--checkpoints", "all", "--fqe"], ["multi-agent", "--fqe"]),
        (["--fqe.dataset", "nowhere"], ["multi-agent", "--fqe"]),
        (["--checkpoints", "all", "--select-metric", "eval/agent/bob/return_mean"], ["bob", "agent_1"]),
        (["--checkpoints", "512", "--samples", "2"], ["--samples"]),
        (["--checkpoints", "300"], ["300", "256, 512"]),
    ],
)
def test_bad_eval_flags_of_a_multi_agent_run_are_one_line_and_exit_2(
    toy_run_dir: Path, flags: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from pickaxe.cli import main

    assert main(["eval", str(toy_run_dir), *flags]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines  # before anything is evaluated
