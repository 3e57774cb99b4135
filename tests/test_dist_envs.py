"""Env workers on Ray (``--dist.placement separate``): the same numbers as envs in the learner's process, exact
resume through the workers, and a worker killed mid-run replaced without changing the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from pickaxe.envs.make import make
from pickaxe.recipes import get_recipe
from pickaxe.runs.run import Run, read_metrics
from pickaxe.train.build import build_trainer, resume, train
from pickaxe.train.config import TrainConfig
from pickaxe.train.trainer import TrainingInterrupted

pytest.importorskip("ray")


class Walk(gym.Env):
    """A random walk whose state pickaxe cannot capture (not a gymnasium built-in); workers import this module."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.normal()), 0
        return np.array([self.x], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.x += (1.0 if action else -1.0) + float(self.np_random.normal())
        self.t += 1
        return np.array([self.x], np.float32), -abs(self.x), abs(self.x) > 5, self.t >= 9, {"t": self.t}


if "PickaxeDistWalk-v0" not in gym.registry:
    gym.register("PickaxeDistWalk-v0", entry_point=Walk)
WALK = f"{__name__}:PickaxeDistWalk-v0"  # the workers import this module to register it, from this folder
HERE = {
    "env_vars": {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    }
}


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal values, types, dtypes and dict keys (in order), recursively."""
    assert type(a) is type(b), where
    if isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                _same(x, y, f"{where}[{i}]")
        else:
            assert np.array_equal(a, b), where
    else:
        assert a == b, where


def _kill(ray: Any, actor: Any) -> None:
    """Kill a worker and wait until it is gone: ``ray.kill`` returns at once, and a kill that lands after the next
    step instead of before it changes what the worker must replay (a replayed-call count one more, or a restart
    instead of a replay)."""
    ray.kill(actor)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=5)
        except Exception:
            return
        time.sleep(0.05)
    raise AssertionError("a killed env worker still answered after 15 s")


def _steps(ray: Any, env_id: str, kills: dict[int, int], **kwargs: Any) -> tuple[Any, list[str]]:
    """Step an in-process env and a RayVectorEnv (5 envs, 2 workers) side by side with the same random actions,
    killing worker ``kills[t]`` before step ``t``; every result must be the same."""
    from pickaxe.dist.env_workers import RayVectorEnv

    events: list[str] = []
    ref = make(env_id, 5, 123, max_episode_steps=7)
    envs = RayVectorEnv(env_id, 5, 123, 2, {"max_episode_steps": 7}, on_event=events.append, **kwargs)
    try:
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert envs.single_observation_space == ref.single_observation_space
        assert envs.observation_space == ref.observation_space and envs.action_space == ref.action_space
        _same(ref.reset(), envs.reset())
        rng = np.random.default_rng(0)
        for t in range(40):
            if t in kills:
                _kill(ray, envs.worker_actors[kills[t]])
            actions = rng.integers(0, 2, 5)
            _same(ref.step(actions), envs.step(actions), f"step {t}")
        _same(ref.get_attr("pickaxe_state"), envs.get_attr("pickaxe_state"))
        mask = np.array([True, False, False, True, False])
        _same(ref.reset(options={"reset_mask": mask}), envs.reset(options={"reset_mask": mask}))
        return envs.restarts, events
    finally:
        envs.close()


def test_workers_step_like_the_in_process_env_and_survive_kills(ray_local: Any) -> None:
    # episodes of at most 7 steps: final_obs/final_info and their masks in many steps; snapshots every 5 calls,
    # kills right after one and between two
    restarts, events = _steps(ray_local, "CartPole-v1", {11: 1, 23: 0}, snapshot_every=5)
    assert restarts == 2
    assert len(events) == 2 and all("died" in e and "exactly" in e for e in events)


def test_without_snapshots_a_worker_replays_from_its_start(ray_local: Any) -> None:
    # what envs whose state cannot be captured get: the log of every call since the worker was made. FrozenLake's
    # info "prob" is an int after a reset and a float after a step: the merged array takes the dtype of the first
    # sub-env that has the key, over all workers, as in one process
    restarts, events = _steps(ray_local, "FrozenLake-v1", {17: 1}, snapshot_every=10**9)
    assert restarts == 1 and "replayed 18 calls from its start" in events[0]


@pytest.mark.slow  # a runtime env for the workers (to import this module) costs ~20 s here
def test_uncapturable_env_replays_from_its_start(ray_local: Any) -> None:
    restarts, events = _steps(ray_local, WALK, {17: 1}, runtime_env=HERE)
    assert restarts == 1 and "replayed 18 calls from its start" in events[0]


def _restarted_episodes(ray: Any, kills: tuple[int, ...]) -> tuple[list[Any], list[str]]:
    """Steps of 4 CartPoles on 2 workers without snapshots that can replay 5 calls; worker 1 is killed before
    each step in ``kills``."""
    from pickaxe.dist.env_workers import RayVectorEnv

    events: list[str] = []
    envs = RayVectorEnv("CartPole-v1", 4, 7, 2, snapshot_every=10**9, max_replay=5, on_event=events.append)
    try:
        out = [envs.reset()]
        for t in range(12):
            if t in kills:
                _kill(ray, envs.worker_actors[1])
            out.append(envs.step(np.array([t % 2, 1, 0, t % 3 // 2])))
        return out, events
    finally:
        envs.close()


def test_past_the_replay_limit_a_worker_restarts_its_episodes_as_truncated(ray_local: Any) -> None:
    # killed before step 6 (7 calls made: too many to replay): its envs restart from a fixed seed; killed again
    # before step 9 (3 calls since that restart): replayed exactly, as if the second kill had not happened
    once, _ = _restarted_episodes(ray_local, kills=(6,))
    twice, events = _restarted_episodes(ray_local, kills=(6, 9))
    _same(once, twice)
    _, reward, terminated, truncated, info = twice[7]
    assert truncated[2:].all() and not terminated[2:].any() and (reward[2:] == 0).all()
    last_seen = twice[6][0]
    assert np.array_equal(np.stack(info["final_obs"][2:]), last_seen[2:])  # the episodes end where the learner was
    assert "restarted its episodes from a fixed seed" in events[0]
    assert "replayed 3 calls from its start" in events[1]


def test_env_a_worker_cannot_make_is_one_line(ray_local: Any) -> None:
    from pickaxe.dist.env_workers import RayVectorEnv
    from pickaxe.errors import PickaxeError

    with pytest.raises(PickaxeError) as exc:
        RayVectorEnv("pickaxe_no_such_module:Nothing-v0", 2, 0, 2)
    message = str(exc.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("env workers could not make 'pickaxe_no_such_module:Nothing-v0'")
    assert "cannot import module 'pickaxe_no_such_module'" in message


def _cfg(separate: bool) -> TrainConfig:
    cfg = get_recipe("cartpole-ppo")
    cfg.env.num_envs, cfg.env.eval_envs, cfg.device = 4, 2, "cpu"
    cfg.trainer.total_steps, cfg.trainer.eval_every, cfg.trainer.eval_episodes = 2048, 1024, 2
    cfg.trainer.stop_at_target = False
    if separate:
        cfg.dist.placement, cfg.dist.workers = "separate", 2
    return cfg


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The metrics of the small CartPole PPO run with its envs in the learner's process."""
    path = tmp_path_factory.mktemp("dist-envs") / "in-process"
    train(_cfg(separate=False), run_dir=path)
    return read_metrics(path, deterministic=True)


def test_separate_workers_give_the_in_process_metrics(ray_local: Any, reference: list[dict], tmp_path: Path) -> None:
    train(_cfg(separate=True), run_dir=tmp_path / "r")
    assert read_metrics(tmp_path / "r", deterministic=True) == reference
    assert len(reference) == 8


def test_killed_worker_is_replaced_and_the_run_is_unchanged(
    ray_local: Any, reference: list[dict], tmp_path: Path
) -> None:
    cfg = _cfg(separate=True)
    run = Run(tmp_path / "r", config=cfg.to_dict(), seed=cfg.seed, tensorboard=False)
    trainer = build_trainer(cfg, run=run)
    envs, policy = trainer.collector.envs, trainer.collector.policy
    acts = 0

    class KillingPolicy:
        """The run's policy; before the 300th action it kills env worker 1."""

        def act(self, obs: Any, deterministic: bool = False) -> Any:
            nonlocal acts
            acts += 1
            if acts == 300:
                ray_local.kill(envs.worker_actors[1])
            return policy.act(obs, deterministic)

    trainer.collector.policy = KillingPolicy()
    try:
        trainer.fit()
    finally:
        trainer.close()
        run.close()
    assert envs.restarts == 1
    assert read_metrics(tmp_path / "r", deterministic=True) == reference
    events = [json.loads(line)["message"] for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert any(m.startswith("env worker 1 (envs 2-3) died") for m in events)


def test_interrupted_run_resumes_exactly_through_new_workers(
    ray_local: Any, reference: list[dict], tmp_path: Path
) -> None:
    cfg = _cfg(separate=True)
    run = Run(tmp_path / "r", config=cfg.to_dict(), seed=cfg.seed, tensorboard=False)
    trainer = build_trainer(cfg, run=run)
    real_iteration = trainer._iteration

    def iteration(*args: Any) -> Any:
        record = real_iteration(*args)
        if trainer.step == 1280:  # mid-episode for most envs, between evaluations
            trainer._stop_signal = 2  # what a Ctrl-C does: checkpoint at this boundary and stop
        return record

    trainer._iteration = iteration
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    trainer.close()  # the workers go with the process
    run.close()
    assert (tmp_path / "r" / "checkpoints" / "latest").read_text().strip() == "step-000000001280"
    resume(tmp_path / "r")
    assert read_metrics(tmp_path / "r", deterministic=True) == reference
    assert "resume is exact" in (tmp_path / "r" / "events.jsonl").read_text()


@pytest.mark.slow  # two processes that each start Ray (~15 s here)
def test_killed_process_resumes_exactly_through_new_workers(reference: list[dict], tmp_path: Path) -> None:
    args = ["cartpole-ppo", "--env.num-envs", "4", "--env.eval-envs", "2", "--device", "cpu"]
    args += ["--trainer.total-steps", "2048", "--trainer.eval-every", "1024", "--trainer.eval-episodes", "2"]
    args += ["--trainer.stop-at-target", "False", "--save-every", "512", "--no-progress"]
    args += ["--dist.placement", "separate", "--dist.workers", "2", "--run-dir", str(tmp_path / "r")]
    env = {**os.environ, "PICKAXE_FAULT": "iteration:5"}  # SIGKILL after the 5th iteration (step 1280)
    proc = subprocess.run([sys.executable, "-m", "pickaxe.cli", "train", *args], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    proc = subprocess.run(
        [sys.executable, "-m", "pickaxe.cli", "resume", str(tmp_path / "r"), "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed from step-000000001024 at step 1024; resume is exact" in proc.stderr
    assert read_metrics(tmp_path / "r", deterministic=True) == reference


def test_more_workers_than_envs_is_one_line_at_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pickaxe.cli import main

    args = ["train", "cartpole-ppo", "--env.num-envs", "2", "--collector.steps", "256"]
    args += ["--dist.placement", "separate", "--dist.workers", "3", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--dist.workers 3 is more than env.num_envs (2)" in err
    assert not (tmp_path / "r").exists()


def test_workers_that_do_not_fit_a_local_ray_are_refused(ray_local: Any, tmp_path: Path) -> None:
    from pickaxe.errors import ConfigError

    cfg = _cfg(separate=True)
    cfg.dist.worker_cpus = 3.0  # 2 x 3 CPUs; the local Ray has 4: the second actor would wait forever
    with pytest.raises(ConfigError, match=r"--dist.workers 2 x --dist.worker-cpus 3 needs 6 CPUs, .* has 4"):
        train(cfg, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
