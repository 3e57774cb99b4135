"""Fitted Q evaluation: its target on hand-computed transitions (termination stops the bootstrap, truncation does
not), convergence to the true value of fixed policies on small known MDPs (Discrete and Box actions), and
``pickaxe eval RUN --checkpoints all --fqe`` on a CartPole offline run: a clearly good checkpoint ranked above a
clearly bad one, the rank agreement with the online return, FQE alone with ``--no-env``, reproducible for a seed, and
bad flags as one line."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from pickaxe.cli import main
from pickaxe.eval.stats import spearman
from pickaxe.offline.fqe import (
    action_distribution,
    episode_starts,
    expected_value,
    fit_fqe,
    fqe_target,
    value_bounds,
)
from pickaxe.offline.fqe_config import FQEConfig


def test_fqe_target_bootstraps_truncations_and_stops_at_terminations() -> None:
    reward = torch.tensor([1.0, 1.0, 2.0])
    terminated = torch.tensor([False, True, False])  # the third transition is a truncation: not terminated
    next_value = torch.tensor([10.0, 10.0, -4.0])
    target = fqe_target(reward, terminated, next_value, gamma=0.9)
    assert target.tolist() == pytest.approx([1 + 0.9 * 10, 1.0, 2 + 0.9 * -4])
    # the expectation over a stochastic Discrete policy: its empirical distribution of draws
    probs = action_distribution(torch.tensor([[0, 1, 1, 1], [2, 2, 2, 2]]), 3)
    assert probs.tolist() == [[0.25, 0.75, 0.0], [0.0, 0.0, 1.0]]
    q = torch.tensor([[4.0, 8.0, 0.0], [1.0, 2.0, 3.0]])
    assert expected_value(q, probs).tolist() == [7.0, 3.0]
    # episode starts of flat transitions: index 0 and every index after an end, terminated or truncated
    assert episode_starts(np.array([0, 1, 0, 0, 0]), np.array([0, 0, 0, 1, 0])).tolist() == [0, 2, 4]
    assert value_bounds(np.array([-2.0, 1.0]), 0.5) == (-4.0, 2.0)
    assert value_bounds(np.array([1.0, 1.0]), 0.9) == pytest.approx((0.0, 10.0))


def _chain(p_right: float, episodes: int = 150, seed: int = 0) -> tuple[dict[str, np.ndarray], float]:
    """A 5-state chain (one-hot states; right moves up, left down; reaching state 4 pays 1 and terminates) walked by
    uniformly random actions, episodes truncated at 20 steps; and the true value of state 0 under the policy that
    goes right with probability ``p_right`` (gamma 0.9)."""
    n, gamma = 5, 0.9
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "terminated", "truncated", "next_obs")}
    for _ in range(episodes):
        s = 0
        for t in range(20):
            a = int(rng.integers(2))
            s2 = min(s + 1, n - 1) if a == 1 else max(s - 1, 0)
            done = s2 == n - 1
            for k, v in zip(
                rows, (np.eye(n)[s], a, float(done), done, t == 19 and not done, np.eye(n)[s2]), strict=True
            ):
                rows[k].append(v)
            s = s2
            if done:
                break
    data = {k: np.asarray(v, dtype=np.float32 if k in ("obs", "next_obs", "reward") else None) for k, v in rows.items()}
    p, r = np.zeros((n, n)), np.zeros(n)
    for s in range(n - 1):
        for a, prob in ((1, p_right), (0, 1 - p_right)):
            s2 = min(s + 1, n - 1) if a == 1 else max(s - 1, 0)
            r[s] += prob * (s2 == n - 1)
            if s2 != n - 1:
                p[s, s2] += prob
    return data, float(np.linalg.solve(np.eye(n) - gamma * p, r)[0])


@pytest.mark.parametrize("p_right", [1.0, 0.75])
def test_fqe_converges_to_the_true_value_of_a_fixed_policy_on_a_chain(p_right: float) -> None:
    data, true_value = _chain(p_right)
    draws = 1 if p_right == 1.0 else 64
    rng = np.random.default_rng(1)
    cfg = FQEConfig(gamma=0.9, steps=400, target_every=20, lr=3e-3, batch_size=128)
    starts = episode_starts(data["terminated"], data["truncated"])
    next_policy = (rng.random((len(data["reward"]), draws)) < p_right).astype(np.int64)
    start_policy = (rng.random((len(starts), draws)) < p_right).astype(np.int64)
    fit = fit_fqe(data, next_policy, start_policy, 2, cfg)
    assert true_value == pytest.approx(0.729 if p_right == 1.0 else true_value)
    assert fit.value == pytest.approx(true_value, abs=0.03)
    # a pure function of its inputs and the seed; the global RNG is left as it was
    state = torch.get_rng_state()
    again = fit_fqe(data, next_policy, start_policy, 2, cfg)
    assert np.array_equal(again.start_values, fit.start_values)
    assert torch.equal(torch.get_rng_state(), state)


def test_fqe_on_box_actions_matches_a_known_one_step_value() -> None:
    # one-step episodes: s ~ U[-1, 1], the data's actions uniform, reward -(a - s)^2; the policy a = s / 2 has
    # value -E[(s / 2)^2] over the starts
    rng = np.random.default_rng(0)
    n = 2000
    s = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    data = {
        "obs": s,
        "action": a,
        "reward": -((a - s) ** 2)[:, 0],
        "terminated": np.ones(n, dtype=bool),
        "truncated": np.zeros(n, dtype=bool),
        "next_obs": s,
    }
    policy = (s / 2)[:, None, :]  # [N, K = 1, d]
    fit = fit_fqe(data, policy, policy, None, FQEConfig(steps=400, lr=3e-3, gamma=0.5))
    assert fit.value == pytest.approx(-float(np.mean((s / 2) ** 2)), abs=0.02)


def test_spearman_rank_correlation() -> None:
    assert spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert spearman([1, 1, 2, 3], [3, 2, 2, 1]) == pytest.approx(-0.8333333333)
    assert spearman([1, 2], [5, 5]) is None


# ----------------------------------------------------------------------------------- a CartPole offline run
def _controller(o: np.ndarray) -> int:
    return int(o[2] + 0.5 * o[3] > 0)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CartPole dataset of a balancing controller acting with epsilon 0, 0.25, 0.5 and 1 (episodes cut at 200
    steps as truncations), a short behaviour-cloning run on it (two kept policies) and a clearly bad policy kept at
    env step 1 of the same run: the actor always pushes left."""
    pytest.importorskip("minari")
    from pickaxe.offline.dataset import Episode, write
    from pickaxe.recipes.args import load_run_config
    from pickaxe.runs.policies import acting_networks, save_policy
    from pickaxe.train.build import build_algorithm

    root = tmp_path_factory.mktemp("fqe")
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes = []
    for i in range(16):
        epsilon = (0.0, 0.25, 0.5, 1.0)[i % 4]
        o, _ = env.reset(seed=i)
        obs, act, rew, term, trunc = [o], [], [], [], []
        for t in range(200):
            a = int(rng.integers(2)) if rng.random() < epsilon else _controller(o)
            o, r, te, tr, _ = env.step(a)
            obs.append(o), act.append(a), rew.append(r), term.append(te), trunc.append((tr or t == 199) and not te)
            if te or tr or t == 199:
                break
        episodes.append(
            Episode(np.array(obs, np.float32), np.array(act), np.array(rew), np.array(term), np.array(trunc))
        )
    data = root / "data"
    write(data, episodes, env.observation_space, env.action_space, "cartpole/scripted-v0", {}, env_id="CartPole-v1")
    run = root / "bc"
    args = ["--data.dataset", str(data), "--collector.steps", "256", "--trainer.total-steps", "5120"]
    args += ["--trainer.eval-every", "2560", "--trainer.eval-episodes", "3", "--env.eval-envs", "3"]
    assert main(["train", "cartpole-bc", *args, "--run-dir", str(run), "--no-progress"]) == 0
    cfg = load_run_config(run)
    algo = build_algorithm(cfg, env)
    nets = acting_networks(algo.networks())
    last = [m for net in nets.values() for m in net.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([5.0, -5.0]))  # always action 0
    save_policy(run, nets, 1, {})
    env.close()
    return {"run": run, "data": data}


def _report(run: Path) -> dict:
    return json.loads((run / "eval" / "checkpoints.json").read_text())


def test_fqe_ranks_a_good_checkpoint_above_a_bad_one_beside_the_online_return(
    cartpole: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = cartpole["run"]
    assert main(["eval", str(run), "--checkpoints", "all", "--fqe", "--fqe.steps", "1000", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "eval/fqe_value" in out and "Spearman" in out
    report = _report(run)
    rows = {r["step"]: r["metrics"] for r in report["rows"]}
    assert sorted(rows) == [1, 2560, 5120]
    online = {s: m["eval/return_mean"]["mean"] for s, m in rows.items()}
    fqe = {s: m["eval/fqe_value"] for s, m in rows.items()}
    good = max(online, key=lambda s: online[s])
    assert online[1] < 15 and online[good] > 50  # clearly bad and clearly good in the env
    assert fqe[good]["low"] > fqe[1]["high"]  # ranked above, beyond both CIs
    assert fqe[good]["mean"] > 2 * fqe[1]["mean"] + 5
    agreement = report["agreement"]
    assert agreement["metrics"] == ["eval/return_mean", "eval/fqe_value"] and agreement["n"] == 3
    assert agreement["spearman"] == pytest.approx(
        spearman([online[s] for s in sorted(rows)], [fqe[s]["mean"] for s in sorted(rows)])
    )
    assert report["settings"]["fqe"]["steps"] == 1000
    # the best checkpoint by FQE instead of the run's rule's metric (served from the cache)
    base = ["eval", str(run), "--checkpoints", "all", "--fqe", "--fqe.steps", "1000", "--episodes", "3"]
    assert main([*base, "--select-metric", "eval/fqe_value"]) == 0
    best = _report(run)["best"]
    assert best["metric"] == "eval/fqe_value" and best["step"] == max(fqe, key=lambda s: fqe[s]["mean"])
    capsys.readouterr()
    assert main([*base, "--select-metric", "eval/gold"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "eval/fqe_value" in err


def test_fqe_alone_without_the_env_is_cached_reproducible_and_picks_the_best(
    cartpole: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = cartpole["run"]
    base = ["eval", str(run), "--checkpoints", "all", "--fqe", "--fqe.steps", "300", "--no-env"]
    assert main(base) == 0
    first = _report(run)
    assert all(list(r["metrics"]) == ["eval/fqe_value"] for r in first["rows"])
    assert first["best"]["metric"] == "eval/fqe_value" and first["best"]["step"] != 1
    assert first["agreement"] is None
    assert main(base) == 0  # served from the cache
    assert "3 of 3 from the cache" in capsys.readouterr().out
    assert main([*base, "--no-cache"]) == 0  # fitted again: the same numbers for the same seed
    assert _report(run)["rows"] == first["rows"]
    assert main([*base, "--fqe.seed", "1"]) == 0  # another seed: another fit
    assert _report(run)["rows"] != first["rows"]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--checkpoints", "all", "--fqe.steps", "0"], "fqe.steps"),
        (["--checkpoints", "all", "--fqe", "--fqe.policy", "random"], "greedy or sampled"),
        (["--checkpoints", "all", "--no-env"], "--fqe"),
        (["--fqe"], "--checkpoints"),
        (["--checkpoints", "all", "--fqe", "--fqe.dataset", "/nonexistent/data"], "does not exist"),
        (["--checkpoints", "all", "--fqe.stpes", "5"], "--fqe.steps"),
    ],
)
def test_bad_fqe_flags_are_one_line_exit_2(
    cartpole: dict[str, Path], capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    code = main(["eval", str(cartpole["run"]), *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert words in err


def test_fqe_scores_a_pendulum_run_with_box_actions(tmp_path: Path) -> None:
    pytest.importorskip("minari")
    from pickaxe.offline.dataset import Episode, write

    env = gym.make("Pendulum-v1")
    env.action_space.seed(0)
    episodes = []
    for i in range(2):
        o, _ = env.reset(seed=i)
        obs, act, rew, term, trunc = [o], [], [], [], []
        for _ in range(100):
            a = env.action_space.sample()
            o, r, te, _, _ = env.step(a)
            obs.append(o), act.append(a), rew.append(r), term.append(te), trunc.append(len(rew) == 100)
        episodes.append(
            Episode(
                np.array(obs, np.float32), np.array(act, np.float32), np.array(rew), np.array(term), np.array(trunc)
            )
        )
    data = tmp_path / "data"
    write(data, episodes, env.observation_space, env.action_space, "pendulum/random-v0", {}, env_id="Pendulum-v1")
    run = tmp_path / "bc"
    args = ["--data.dataset", str(data), "--collector.steps", "256", "--trainer.total-steps", "512"]
    args += ["--trainer.eval-every", "256", "--trainer.eval-episodes", "1", "--env.eval-envs", "1"]
    assert main(["train", "pendulum-bc", *args, "--run-dir", str(run), "--no-progress"]) == 0
    assert main(["eval", str(run), "--checkpoints", "all", "--fqe", "--fqe.steps", "100", "--no-env"]) == 0
    rows = _report(run)["rows"]
    assert [r["step"] for r in rows] == [256, 512]
    low = min(float(np.min(ep.reward)) for ep in episodes) / (1 - 0.99)
    for r in rows:  # one value per episode start, within the range any return of these rewards can have
        e = r["metrics"]["eval/fqe_value"]
        assert e["n"] == 2 and low <= e["low"] <= e["mean"] <= e["high"] <= 0


class _CoinPolicy:
    """Greedy: action 1; sampled: action 1 with probability 0.75 (drawn from torch's global RNG, as policies do)."""

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, dict]:
        if deterministic:
            return torch.ones(len(obs), dtype=torch.int64), {}
        return (torch.rand(len(obs)) < 0.75).long(), {}


def test_policy_actions_greedy_or_sampled_are_seeded() -> None:
    from pickaxe.offline.fqe import policy_actions

    obs = np.zeros((5000, 4), dtype=np.float32)
    greedy = policy_actions(_CoinPolicy(), obs, FQEConfig())
    assert greedy.shape == (5000, 1) and (greedy == 1).all()
    cfg = FQEConfig(policy="sampled", action_samples=8, seed=3)
    state = torch.get_rng_state()
    sampled = policy_actions(_CoinPolicy(), obs, cfg)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left as it was
    assert sampled.shape == (5000, 8) and sampled.mean() == pytest.approx(0.75, abs=0.01)
    assert np.array_equal(sampled, policy_actions(_CoinPolicy(), obs, cfg))
    probs = action_distribution(torch.as_tensor(sampled), 2)
    assert probs.sum(1).allclose(torch.ones(5000)) and float(probs[:, 1].mean()) == pytest.approx(0.75, abs=0.01)
