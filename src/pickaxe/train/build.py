"""Build a runnable experiment (envs, model, algorithm, collector, trainer) from a ``TrainConfig``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.algos.base import Algorithm
from pickaxe.algos.configs import DQNConfig, PPOConfig
from pickaxe.algos.dqn import DQN
from pickaxe.algos.ppo import PPO
from pickaxe.envs.make import make
from pickaxe.errors import ConfigError
from pickaxe.models.actor_critic import ActorCritic
from pickaxe.models.q_network import QNetwork
from pickaxe.rollout.collector import Collector
from pickaxe.runs.run import Run, default_run_dir, load_model
from pickaxe.train.config import TrainConfig
from pickaxe.train.evaluate import evaluate
from pickaxe.train.llm_config import LLMTrainConfig
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
BUILDERS: dict[str, str] = {
    "classic": "pickaxe.train.build:build_trainer",
    "llm": "pickaxe.train.llm:build_llm_trainer",
}
"""Config kind -> ``module:function`` building its Trainer, imported on use (classic runs never load transformers)."""
CONFIG_KINDS: dict[str, type] = {"classic": TrainConfig, "llm": LLMTrainConfig}
"""The ``"kind"`` in a run's ``config.json`` -> its config type."""


def builder_for(cfg: Any) -> Builder:
    """The function that builds a Trainer for ``cfg`` (chosen by its ``KIND``)."""
    target = BUILDERS.get(getattr(cfg, "KIND", ""))
    if target is None:
        raise TypeError(f"no builder for {type(cfg).__name__}; known config kinds: {sorted(BUILDERS)}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def config_from_dict(data: Any) -> Any:
    """Rebuild a run's config from its ``config.json`` content, whatever its kind."""
    kind = data.get("kind", "classic") if isinstance(data, dict) else None
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
    builder = builder_for(cfg)
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
    return _fit(builder_for(cfg), cfg, run, progress, resume=True), run


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
