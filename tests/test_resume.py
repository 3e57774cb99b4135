"""Runs you can trust: a run SIGKILLed at random points (once mid-checkpoint-write) and resumed each time
ends with bitwise the same parameters and the same metrics as a run that was never stopped."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pickaxe.cli import main
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import read_metrics
from pickaxe.train.build import resume, train

RECIPES = {
    "cartpole-ppo": [
        "--trainer.total-steps", "10240", "--save-every", "1024", "--trainer.eval-every", "2048",
        "--trainer.stop-at-target", "False",  # it solves CartPole by ~6k steps; train on through more checkpoints
    ],
    "cartpole-dqn": [
        "--trainer.total-steps", "5120", "--save-every", "1024", "--trainer.eval-every", "2048",
        "--algo.learning-starts", "1024", "--algo.gradient-steps", "32", "--algo.buffer-size", "4096",
    ],
    "pendulum-ppo": [
        "--trainer.total-steps", "8192", "--collector.steps", "1024", "--save-every", "2048",
        "--trainer.eval-every", "4096", "--algo.epochs", "2", "--env.eval-envs", "2", "--trainer.eval-episodes", "2",
    ],
}  # fmt: skip


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pickaxe.cli", *args]


def _metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir, deterministic=True)


def _kill_when(proc: subprocess.Popen, run_dir: Path, min_lines: int, extra_s: float) -> None:
    """SIGKILL ``proc`` once metrics.jsonl has ``min_lines`` lines, plus a random delay."""
    deadline = time.monotonic() + 120
    path = run_dir / "metrics.jsonl"
    while proc.poll() is None and time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= min_lines:
            time.sleep(extra_s)
            break
        time.sleep(0.02)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


# pendulum-ppo adds Gaussian actions to what cartpole-ppo checks; Pendulum's env state through a kill is also in
# test_sac's killed-and-resumed run, so its own ~25 s run is a slow check.
@pytest.mark.parametrize(
    "recipe", [pytest.param(r, marks=pytest.mark.slow) if r == "pendulum-ppo" else r for r in RECIPES]
)
def test_killed_and_resumed_run_equals_uninterrupted_run(recipe: str, tmp_path: Path) -> None:
    args = RECIPES[recipe]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", recipe, *args, "--run-dir", str(a), "--no-progress"]) == 0  # uninterrupted, in this process

    rng = random.Random(recipe)
    # 1) killed while writing its second checkpoint: files written, folder not yet renamed into place
    env = {**os.environ, "PICKAXE_FAULT": "checkpoint-write:2"}
    proc = subprocess.run(
        _cmd("train", recipe, *args, "--run-dir", str(b), "--no-progress"), env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".tmp-") for p in (b / "checkpoints").iterdir())  # the torn write is there
    # 2) resumed and killed twice more at random points
    total_lines = len(_metrics(a))
    for _ in range(2):
        done = len(_metrics(b)) if (b / "metrics.jsonl").exists() else 0
        proc = subprocess.Popen(
            _cmd("resume", str(b), "--no-progress"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _kill_when(proc, b, rng.randint(done, max(done, total_lines - 2)), rng.uniform(0.0, 0.3))
    # 3) resumed to the end
    subprocess.run(_cmd("resume", str(b), "--no-progress"), check=True, capture_output=True)

    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    ma, mb = _metrics(a), _metrics(b)
    assert [r["step"] for r in mb] == sorted({r["step"] for r in mb})  # no duplicated steps
    assert ma == mb
    events = (b / "events.jsonl").read_text()
    assert "resume is exact" in events


def test_supervisor_restarts_a_crashed_run_and_it_ends_exact(tmp_path: Path) -> None:
    args = RECIPES["cartpole-ppo"]
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run(
        _cmd("train", "cartpole-ppo", *args, "--run-dir", str(a), "--no-progress"), check=True, capture_output=True
    )
    # the child training process is SIGKILLed after its 20th iteration, once
    env = {**os.environ, "PICKAXE_FAULT": "iteration:20", "PICKAXE_FAULT_ONCE": str(tmp_path / "fired")}
    proc = subprocess.run(
        _cmd("train", "cartpole-ppo", *args, "--run-dir", str(b), "--no-progress", "--max-restarts", "2"),
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fired").exists()
    events = [json.loads(line)["message"] for line in (b / "events.jsonl").read_text().splitlines()]
    restart = next(i for i, m in enumerate(events) if m.startswith("restart "))
    assert events[restart].startswith("restart 1/2 after exit status -9")
    assert "resume is exact" in next(m for m in events[restart:] if m.startswith("resumed"))
    assert _metrics(a) == _metrics(b)


def test_corrupt_newest_checkpoint_is_skipped_and_resume_stays_exact(tmp_path: Path) -> None:
    args = RECIPES["cartpole-ppo"]
    a, b = tmp_path / "a", tmp_path / "b"
    subprocess.run(
        _cmd("train", "cartpole-ppo", *args, "--run-dir", str(a), "--no-progress"), check=True, capture_output=True
    )
    env = {**os.environ, "PICKAXE_FAULT": "iteration:30"}
    subprocess.run(
        _cmd("train", "cartpole-ppo", *args, "--run-dir", str(b), "--no-progress"), env=env, capture_output=True
    )
    newest = sorted((b / "checkpoints").glob("step-*"))[-1]
    data = bytearray((newest / "tensors.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit-pattern in the middle of the tensors
    (newest / "tensors.safetensors").write_bytes(bytes(data))
    proc = subprocess.run(_cmd("resume", str(b), "--no-progress"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert newest.name in proc.stderr and "tensors.safetensors" in proc.stderr
    assert _metrics(a) == _metrics(b)


def test_resume_without_checkpoint_says_so_instead_of_starting_over(tmp_path: Path) -> None:
    args = RECIPES["cartpole-ppo"]
    b = tmp_path / "b"
    env = {**os.environ, "PICKAXE_FAULT": "iteration:2"}
    subprocess.run(
        _cmd("train", "cartpole-ppo", *args, "--run-dir", str(b), "--no-progress"), env=env, capture_output=True
    )
    assert len(_metrics(b)) == 2 and not list(b.glob("checkpoints/step-*"))
    proc = subprocess.run(_cmd("resume", str(b), "--no-progress"), capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"pickaxe: error: {b} has no checkpoint to resume from")
    assert f"`pickaxe resume {b} --restart` starts it again from step 0" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert len(_metrics(b)) == 2  # nothing lost


class _Walk(gym.Env):
    """A random walk whose state pickaxe cannot capture (it is not a gymnasium built-in)."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.normal()), 0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += (1.0 if action else -1.0) + float(self.np_random.normal())
        self.t += 1
        return np.array([self.x], np.float32), -abs(self.x), abs(self.x) > 10, self.t >= 50, {}


def test_uncapturable_env_resumes_deterministically(tmp_path: Path) -> None:
    gym.register("PickaxeTestWalk-v0", entry_point=_Walk)
    cfg = get_recipe("cartpole-ppo")
    cfg.env.id, cfg.env.eval_envs = "PickaxeTestWalk-v0", 2
    cfg.trainer.total_steps, cfg.trainer.save_every, cfg.trainer.eval_every = 2048, 1024, 1024
    train(cfg, run_dir=tmp_path / "full")
    for name in ("r1", "r2"):  # two resumes from the same checkpoint
        shutil.copytree(tmp_path / "full", tmp_path / name)
        for ckpt in (tmp_path / name / "checkpoints").glob("step-*"):
            if ckpt.name != "step-000000001024":
                shutil.rmtree(ckpt)
        (tmp_path / name / "checkpoints" / "latest").write_text("step-000000001024")
        resume(tmp_path / name)
    assert _metrics(tmp_path / "r1") == _metrics(tmp_path / "r2")
    assert "resume is deterministic" in (tmp_path / "r1" / "events.jsonl").read_text()
