"""benchmarks/multiagent.py and tianshou_multiagent.py: their tables, run-folder reader, provenance line and marker
replacement (no training), and the Tianshou side by side end to end at one collect (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ma() -> ModuleType:
    return _load("multiagent")


@pytest.fixture(scope="module")
def ts() -> ModuleType:
    return _load("tianshou_multiagent")


def _run(ma: ModuleType, seed: int, final: float | None, **kw: object) -> object:
    agents = kw.pop("agents", {"agent_0": -20.04, "agent_1": -19.96, "agent_2": -20.0})
    return ma.RunRecord(
        seed=seed, steps=50_400, final=final, final_low=None if final is None else final - 5,
        final_high=None if final is None else final + 4.5, agents=agents, untrained=-148.07 + seed,
        wall_s=34.9 + seed, cpu_s=8.25 + seed, **kw,
    )  # fmt: skip


def test_table_rows_per_seed_cis_median_agents_references_and_seconds(ma: ModuleType) -> None:
    spread = ma.RecipeResult("simple-spread-mappo", 50_000, -81.23, -84.0, -78.46, {"agent_0": -27.1})
    spread.runs = [_run(ma, 0, -60.33), _run(ma, 1, -58.34), _run(ma, 2, -63.9)]
    lines = ma.build_table([spread]).splitlines()
    assert lines[0].startswith("| recipe | final eval total, per seed [95% CI] | median [min to max] |")
    assert lines[2] == (
        "| `simple-spread-mappo` | -60.3 [-65.3, -55.8] / -58.3 [-63.3, -53.8] / -63.9 [-68.9, -59.4] "
        "| -60.3 [-63.9 to -58.3] | -20.0, -20.0, -20.0 | -148 / -147 / -146 | -81.2 [-84.0, -78.5] | 35 / 36 / 37 "
        "| 8.2 / 9.2 / 10 |"
    )
    adversary = ma.RecipeResult("simple-adversary-mappo", 50_000, -12.6, -15.0, -10.0, {"adversary_0": -28.0})
    agents = {"adversary_0": -16.24, "agent_0": 7.1, "agent_1": 7.14}
    adversary.runs = [_run(ma, 0, -2.0, agents=agents), _run(ma, 1, None, agents={}, state="exit 1")]
    row = ma.build_table([adversary]).splitlines()[2]
    assert "| -2.0 [-7.0, 2.5] / - (seed 1 exit 1) | -2.0 |" in row  # a failed seed is named, not a number
    assert "| adversary_0 -16.2, agent_0 7.1, agent_1 7.1 |" in row  # named when the agents are not agent_0..
    assert "| -12.6 [-15.0, -10.0] (adversary_0 -28.0) |" in row  # the random reference per agent too, then


def test_read_run_takes_the_last_evaluation_per_agent_and_the_timing(ma: ModuleType, tmp_path: Path) -> None:
    run = tmp_path / "simple-spread-idqn-s0-50000"
    run.mkdir()
    records = [
        {"step": 10_400, "eval/return_mean": -90.0, "eval/return_mean_ci_low": -95.0},
        {"step": 20_000, "loss/q": 0.1},  # not an evaluation
        {
            "step": 50_400, "eval/return_mean": -61.0, "eval/return_mean_ci_low": -68.7,
            "eval/return_mean_ci_high": -53.6,
            "eval/agent/agent_0/return_mean": -20.5, "eval/agent/agent_0/return_mean_ci_low": -23.0,
            "eval/agent/agent_1/return_mean": -20.25,
        },
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "status.json").write_text(json.dumps({"state": "finished"}))
    timing = {"untrained": -170.0, "started": 1.0, "load_average": 2.5, "wall_s": 40.0, "cpu_s": 30.0}
    Path(f"{run}.timing.json").write_text(json.dumps(timing))
    r = ma.read_run(run, 0)
    assert (r.steps, r.final, r.final_low, r.final_high) == (50_400, -61.0, -68.7, -53.6)
    assert r.agents == {"agent_0": -20.5, "agent_1": -20.25}  # the CI keys are not agents
    assert (r.untrained, r.wall_s, r.cpu_s, r.load_average, r.state) == (-170.0, 40.0, 30.0, 2.5, "finished")
    missing = ma.read_run(tmp_path / "absent", 1)
    assert missing.final is None and missing.state == "missing"


def test_write_replaces_only_its_block_and_a_missing_marker_stops_before_training(
    ma: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    begin, end = ma.MARKERS
    text = f"# Doc\n\nprose\n\n{begin}\nold\n{end}\n\nafter\n<!-- results:begin -->\nkept\n<!-- results:end -->\n"
    out = ma.replace_block(text, "| new |", ma.MARKERS)
    assert out == text.replace("\nold\n", "\n| new |\n")
    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit) as exit_info:
        ma.main(["--recipes", "simple-spread-idqn", "--write", str(doc)])
    assert exit_info.value.code == 2 and "multiagent:begin" in capsys.readouterr().err
    assert doc.read_text() == "no markers\n"
    with pytest.raises(SystemExit):
        ma.main(["--recipes", "cartpole-ppo"])  # not a multi-agent recipe


def test_provenance_names_the_command_without_storage_options_the_times_and_loads(ma: ModuleType) -> None:
    argv = ["--seeds", "3", "--root", "/tmp/x", "--reuse", "--write", "docs/multi-agent.md"]
    starts = [(1_796_180_000.0, 1.5), (1_796_183_600.0, 3.25)]  # 2026-12-02 02:53 and 03:53 UTC
    line = ma.provenance(ma.shown_command(argv), starts, 1_796_184_000.0)
    assert line.startswith("Generated by `python benchmarks/multiagent.py --seeds 3`; runs from 2026-12-02 02:53 to")
    assert "04:00 UTC" in line and "load average (1 min) 1.50 to 3.25 at the runs' starts" in line
    assert "2 CPUs" in line or "CPUs (nproc)" in line


def test_random_policy_draws_each_action_space_uniformly(ma: ModuleType) -> None:
    import torch

    discrete = SimpleNamespace(continuous=False, n_actions=5)
    action, _ = ma.RandomPolicy(discrete).act(torch.zeros(4, 3, 18))
    assert action.shape == (4, 3) and int(action.min()) >= 0 and int(action.max()) <= 4
    low, high = np.zeros((3, 2)), np.array([[1.0, 1.0], [1.0, 1.0], [3.0, 3.0]])
    box = SimpleNamespace(continuous=True, n_actions=2, action_low=low, action_high=high)
    action, _ = ma.RandomPolicy(box).act(torch.zeros(1000, 3, 18))
    assert action.shape == (1000, 3, 2) and float(action.min()) >= 0
    assert float(action[:, :2].max()) <= 1 and 2.5 < float(action[:, 2].max()) <= 3  # each agent's own bounds


def test_tianshou_settings_count_turns_and_discount_per_joint_step(ts: ModuleType) -> None:
    s = ts.settings(50_000)
    assert (s["agents"], s["n_step"], s["collects"], s["epochs"]) == (3, 3, 63, 3)  # 63 collects of 800 joint steps
    assert s["collect_turns"] == 2_400 and s["gradient_steps_per_collect"] == 32
    assert s["gamma_turn"] ** 3 == pytest.approx(0.99)  # three turns discount as one joint step does
    assert (s["lr"], s["batch_size"], s["buffer_size"], s["target_update_freq"]) == (5e-4, 256, 150_000, 200)


def test_tianshou_table_rows_and_ratios(ts: ModuleType) -> None:
    def rec(seed: int, final: float, wall: float, cpu: float) -> dict[str, object]:
        return {
            "seed": seed,
            "final": final,
            "final_low": final - 6,
            "final_high": final + 6,
            "wall_s": wall,
            "cpu_s": cpu,
        }

    rows = {
        "tianshou": [rec(0, -70.0, 200.0, 150.0), rec(1, -75.0, 220.0, 160.0), {"seed": 2, "state": "exit 1"}],
        "pickaxe-idqn": [rec(0, -57.0, 40.0, 30.0), rec(1, -61.0, 44.0, 32.0)],
    }
    table = ts.build_table(rows).splitlines()
    assert table[2] == (
        "| Tianshou 2.0.1 DQN x3 | one network per agent, n-step 3 over turns | -70.0 [-76.0, -64.0] / "
        "-75.0 [-81.0, -69.0] / seed 2 exit 1 | -72.5 | 200 / 220 / - | 150 / 160 / - |"
    )
    assert table[3].startswith("| pickaxe `simple-spread-idqn` | one shared network, agent id appended | -57.0 [")
    assert table[-1] == (  # medians: pickaxe 42 / 31, Tianshou 210 / 155
        "Ratios of the medians, pickaxe / Tianshou: `simple-spread-idqn` CPU 0.20, wall 0.20."
    )


@pytest.mark.slow
def test_tianshou_side_by_side_runs_end_to_end_at_one_collect(
    ts: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tianshou")
    pytest.importorskip("mpe2")
    assert ts.main(["--seeds", "1", "--budget", "800", "--no-mappo", "--root", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    runs = result["runs"]
    assert runs["tianshou"][0]["steps"] == 800 and runs["tianshou"][0]["turns"] == 2_400
    for key in ("tianshou", "pickaxe-idqn", "pickaxe-idqn-unshared"):
        run = runs[key][0]
        assert run["state"] == "finished" and run["final_low"] <= run["final"] <= run["final_high"]
        assert run["wall_s"] > 0 and run["cpu_s"] > 0
        assert run["steps"] == 800


def test_mpe2_team_total_converts_to_the_mappo_codes_units() -> None:
    """docs/multi-agent.md compares simple_spread with MAPPO's code as ``2 x team total - 75``: MAPPO's scenario
    (the original MPE's, marlbenchmark/on-policy) gives every agent the sum over agents of ``-(distance term) -
    (collisions, its own included)``, summed over 25 steps; checked here on MPE2's own world states."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    def mappo_reward(agent: object, world: object) -> float:  # the on-policy repo's simple_spread reward
        rew = -sum(min(float(np.linalg.norm(a.state.p_pos - lm.state.p_pos)) for a in world.agents)
                   for lm in world.landmarks)  # fmt: skip
        hits = sum(float(np.linalg.norm(a.state.p_pos - agent.state.p_pos)) < a.size + agent.size for a in world.agents)
        return rew - hits

    env = simple_spread_v3.parallel_env(N=3, local_ratio=0.5, max_cycles=25, continuous_actions=False)
    rng = np.random.default_rng(0)
    collisions = 0
    for episode in range(20):
        env.reset(seed=episode)
        world = env.unwrapped.world
        team, mappo, steps = 0.0, 0.0, 0
        while env.agents:
            _, rewards, *_ = env.step({a: int(rng.integers(0, 5)) for a in env.agents})
            team += sum(rewards.values())
            mappo += sum(mappo_reward(agent, world) for agent in world.agents)  # shared by all, reported once
            collisions += sum(
                float(np.linalg.norm(a.state.p_pos - b.state.p_pos)) < a.size + b.size
                for i, a in enumerate(world.agents)
                for b in world.agents[i + 1 :]
            )
            steps += 1
        assert steps == 25 and mappo == pytest.approx(2 * team - 75, abs=1e-9)
    assert collisions > 0  # the collision term was exercised, not only the distances
