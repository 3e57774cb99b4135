"""Every file in examples/ runs (each with a tiny budget, in its own temporary folder) and says what it did; the
README's PPO example also learns."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    """Run ``examples/<name>`` in ``tmp_path`` with ``args``; its stdout (the test fails with its stderr)."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_cartpole_ppo_example_solves(tmp_path: Path) -> None:
    out = run_example("cartpole_ppo.py", tmp_path, "50000")
    match = re.search(r"eval return ([\d.]+) after (\d+) env steps", out)
    assert match and float(match.group(1)) >= 475.0, out[-2000:]
    assert (tmp_path / "runs" / "example-cartpole-ppo" / "model.safetensors").is_file()


# example -> (tiny budget arguments, what its output must say, a file it must have written)
TINY = {
    "custom_env.py": (["1024"], r"played 3 episodes: returns \[", "runs/example-signgame/model.safetensors"),
    "load_and_act.py": (
        ["1024"],
        r"the run's own evaluation: mean return [\d.]+ over 10 episodes",
        "runs/example-load",
    ),
    "sweep.py": (["512", "1"], r"best group: algo\.lr=", "runs/example-sweep/compare/summary.json"),
    "grpo_custom_reward.py": (["32"], r"'3\+4=' -> ", "runs/example-grpo/export/pickaxe_source.json"),
    "dpo_preferences.py": (
        ["32"],
        r"DPO: held-out pair accuracy [\d.]+",
        "runs/example-dpo/export/pickaxe_source.json",
    ),
    "agent_tool.py": (["16"], r"well-formed tool use [\d.]+", "runs/example-agent/export/pickaxe_source.json"),
}


def test_every_example_is_run_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted([*TINY, "cartpole_ppo.py"])


@pytest.mark.parametrize("name", sorted(TINY))
def test_example_runs_with_a_tiny_budget(name: str, tmp_path: Path) -> None:
    args, said, wrote = TINY[name]
    out = run_example(name, tmp_path, *args)
    assert re.search(said, out), out[-2000:]
    assert (tmp_path / wrote).exists()
