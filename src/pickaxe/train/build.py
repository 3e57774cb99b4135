"""Build a runnable experiment (envs, model, algorithm, collector, trainer) from a ``TrainConfig``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.algos.base import Algorithm
from pickaxe.algos.dqn import DQN, DQNConfig
from pickaxe.algos.ppo import PPO, PPOConfig
from pickaxe.envs.make import make
from pickaxe.errors import ConfigError
from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.q_network import QNetwork
from pickaxe.rollout.collector import Collector
from pickaxe.runs.run import Run, default_run_dir, load_model
from pickaxe.train.config import TrainConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.train.trainer import FitResult, Trainer
from pickaxe.utils import resolve_device, seed_everything, set_torch_threads


def derive_seeds(seed: int) -> dict[str, int]:
    """Independent seeds for each consumer of randomness, derived from the run seed."""
    env, eval_env, buffer = np.random.SeedSequence(seed).generate_state(3)
    return {"env": int(env), "eval_env": int(eval_env), "buffer": int(buffer)}


def build_algorithm(cfg: TrainConfig, envs) -> Algorithm:
    """The algorithm named by the type of ``cfg.algo``, with networks sized from ``envs``."""
    device = resolve_device(cfg.device)
    hidden, act = tuple(cfg.model.hidden), cfg.model.activation
    if isinstance(cfg.algo, PPOConfig):
        return PPO(ActorCritic.for_env(envs, hidden=hidden, activation=act).to(device), cfg.algo)
    if isinstance(cfg.algo, DQNConfig):
        qnet = QNetwork.for_env(envs, hidden=hidden, activation=act).to(device)
        return DQN(qnet, cfg.algo, seed=derive_seeds(cfg.seed)["buffer"])
    raise TypeError(f"no algorithm for config type {type(cfg.algo).__name__}")


def build_trainer(cfg: TrainConfig, run: Run | None = None, progress: bool = False) -> Trainer:
    """Seed everything, make envs, networks, algorithm, collector, and the Trainer that runs them."""
    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    envs = make(cfg.env.id, cfg.env.num_envs, seeds["env"], cfg.env.vectorization)
    eval_envs = make(cfg.env.id, cfg.env.eval_envs, seeds["eval_env"]) if cfg.env.eval_envs > 0 else None
    algo = build_algorithm(cfg, envs)
    collector = Collector(envs, algo.policy, steps=cfg.collector.steps, device=device)
    return Trainer(
        algo,
        collector,
        eval_envs=eval_envs,
        run=run,
        config=cfg.trainer,
        progress=progress,
        torch_threads=cfg.torch_threads,
    )


Builder = Callable[[Any, Run | None, bool], Trainer]
BUILDERS: dict[type, Builder] = {}
CONFIG_KINDS: dict[str, type] = {}


def register_builder(config_type: type, builder: Builder, kind: str | None = None) -> None:
    """Make ``train`` accept ``config_type`` configs (e.g. the LLM one), built by ``builder(cfg, run, progress)``.

    ``kind`` is the value of ``"kind"`` in that config's ``to_dict()``, so a run directory can be rebuilt.
    """
    BUILDERS[config_type] = builder
    if kind is not None:
        CONFIG_KINDS[kind] = config_type


register_builder(TrainConfig, lambda cfg, run, progress: build_trainer(cfg, run=run, progress=progress), "classic")


def config_from_dict(data: dict[str, Any]) -> Any:
    """Rebuild a run's config from its ``config.json`` content, whatever its kind."""
    kind = data.get("kind", "classic")
    if kind not in CONFIG_KINDS and kind == "llm":
        import pickaxe.train.llm  # noqa: F401 - registers the LLM config kind
    if kind not in CONFIG_KINDS:
        raise ConfigError(f"unknown config kind {kind!r} in config.json; known: {sorted(CONFIG_KINDS)}")
    return CONFIG_KINDS[kind].from_dict(data)


def train(
    cfg: Any,
    run_dir: str | Path | None = None,
    progress: bool = False,
    track: tuple[str, ...] = (),
    prometheus_port: int | None = None,
) -> tuple[FitResult, Run]:
    """Train any registered config (``TrainConfig`` and others) into ``run_dir`` (default ``runs/<recipe>-<time>``).

    The config is validated by building envs' ids and devices before the run directory is created.
    """
    builder = BUILDERS.get(type(cfg))
    if builder is None:
        raise TypeError(f"no builder registered for {type(cfg).__name__}; see pickaxe.train.build.register_builder")
    cfg.check()  # a bad env id, device or missing extra fails before the run directory exists
    run = Run(
        run_dir or default_run_dir(cfg.recipe),
        config=cfg.to_dict(),
        seed=cfg.seed,
        track=track,
        prometheus_port=prometheus_port,
    )
    return _fit(builder, cfg, run, progress, resume=False), run


def resume(
    run_dir: str | Path, progress: bool = False, track: tuple[str, ...] = (), prometheus_port: int | None = None
) -> tuple[FitResult, Run]:
    """Continue a run from its newest good checkpoint to its original budget (from scratch if it has none)."""
    run = Run.open(run_dir, track=track, prometheus_port=prometheus_port)
    cfg = config_from_dict(run.config())
    return _fit(BUILDERS[type(cfg)], cfg, run, progress, resume=True), run


def _fit(builder: Builder, cfg: Any, run: Run, progress: bool, resume: bool) -> FitResult:
    try:
        trainer = builder(cfg, run, progress)
        try:
            if resume:
                trainer.resume()
            return trainer.fit()
        finally:
            trainer.close()
    finally:
        run.close()


def evaluate_run(cfg: TrainConfig, run_dir: str | Path, episodes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Rebuild a finished run's policy from its config and ``model.safetensors`` and evaluate it."""
    set_torch_threads(cfg.torch_threads)
    device = resolve_device(cfg.device)
    envs = make(cfg.env.id, max(1, min(episodes, cfg.env.eval_envs or 1)), derive_seeds(cfg.seed)["eval_env"])
    try:
        algo = build_algorithm(cfg, envs)
        load_model(run_dir, algo.networks(), device)
        return evaluate(algo.policy, envs, episodes, device)
    finally:
        envs.close()
