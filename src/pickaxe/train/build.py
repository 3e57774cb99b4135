"""Build a runnable experiment (envs, model, algorithm, collector, trainer) from a ``TrainConfig``."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pickaxe.algos.base import Algorithm
from pickaxe.algos.imitation_configs import uses_demonstrations
from pickaxe.algos.multiagent_configs import is_multiagent
from pickaxe.algos.offline_configs import is_offline
from pickaxe.algos.offline_core import return_range_scale
from pickaxe.envs.make import SeededVectorEnv, make
from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.models.normalize import fit_obs_norm
from pickaxe.offline.dataset import check_fits, read_mixed
from pickaxe.offline.sampler import DatasetSampler
from pickaxe.offline.scores import references
from pickaxe.rollout.collector import Collector
from pickaxe.runs.checkpoint import has_checkpoint, no_checkpoint_error
from pickaxe.runs.folder import check_run_writable, disk_error
from pickaxe.runs.model import SELECTION_FILE, load_model
from pickaxe.runs.policies import acting_networks, prune_policies
from pickaxe.runs.run import Run, default_run_dir
from pickaxe.train.config import TrainConfig
from pickaxe.train.evaluate import evaluate, mean_ci
from pickaxe.train.llm_config import BestOfNConfig, LLMTrainConfig
from pickaxe.train.runtime import settle_for_training
from pickaxe.train.trainer import EnvEvaluator, FitResult, Trainer
from pickaxe.utils import resolve_device, seed_everything, set_torch_threads

if TYPE_CHECKING:
    from pickaxe.envs.multiagent import MultiAgentVectorEnv


def derive_seeds(seed: int) -> dict[str, int]:
    """Independent seeds for each consumer of randomness, derived from the run seed."""
    env, eval_env, buffer = np.random.SeedSequence(seed).generate_state(3)
    return {"env": int(env), "eval_env": int(eval_env), "buffer": int(buffer)}


ALGORITHMS: dict[str, str] = {
    "ppo": "pickaxe.algos.ppo:build_ppo",
    "dqn": "pickaxe.algos.dqn:build_dqn",
    "a2c": "pickaxe.algos.a2c:build_a2c",
    "recurrent-ppo": "pickaxe.algos.recurrent_ppo:build_recurrent_ppo",
    "sac": "pickaxe.algos.sac:build_sac",
    "td3": "pickaxe.algos.td3:build_td3",
    "ddpg": "pickaxe.algos.td3:build_ddpg",
    "bc": "pickaxe.algos.offline:build_bc",
    "td3-bc": "pickaxe.algos.td3_bc:build_td3_bc",
    "iql": "pickaxe.algos.iql:build_iql",
    "cql": "pickaxe.algos.cql:build_cql",
    "iql-online": "pickaxe.algos.offline_online:build_iql_online",
    "cql-online": "pickaxe.algos.offline_online:build_cql_online",
    "reinforce": "pickaxe.algos.reinforce:build_reinforce",
    "npg": "pickaxe.algos.trpo:build_npg",
    "trpo": "pickaxe.algos.trpo:build_trpo",
    "redq": "pickaxe.algos.redq:build_redq",
    "iqn": "pickaxe.algos.iqn:build_iqn",
    "fqf": "pickaxe.algos.iqn:build_fqf",
    "bdq": "pickaxe.algos.bdq:build_bdq",
    "bcq": "pickaxe.algos.bcq:build_bcq",
    "crr": "pickaxe.algos.crr:build_crr",
    "ppo-explore": "pickaxe.algos.explore:build_ppo_explore",
    "ippo": "pickaxe.algos.mappo:build_ippo",
    "mappo": "pickaxe.algos.mappo:build_mappo",
    "idqn": "pickaxe.algos.idqn:build_idqn",
    "gail": "pickaxe.algos.gail:build_gail",
}
"""Classic algorithm name (``TrainConfig.ALGOS``) -> ``module:function`` building it, imported on use. Each builder
takes ``(algo config, envs, model config, device, seed)`` and sizes its networks from the envs' spaces; adding an
algorithm is its config in ``TrainConfig.ALGOS``, its module with a builder, and one line here."""


def build_algorithm(cfg: TrainConfig, envs) -> Algorithm:
    """The algorithm named by the type of ``cfg.algo``, with networks sized from ``envs``."""
    name = cfg.algo_name()
    target = ALGORITHMS.get(name)
    if target is None:
        raise TypeError(f"no builder for algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    module, _, function = target.partition(":")
    builder = getattr(importlib.import_module(module), function)
    return builder(cfg.algo, envs, cfg.model, resolve_device(cfg.device), derive_seeds(cfg.seed)["buffer"])


def make_train_envs(cfg: TrainConfig, seed: int, run: Run | None = None) -> Any:
    """The training envs: in this process (``env.vectorization``), or with ``dist.placement=separate`` split across
    ``dist.workers`` Ray actors (same seeds, same numbers; a worker that dies is replaced, reported in the run's
    events)."""
    e, d = cfg.env, cfg.dist
    if d.placement != "separate":
        return make(e.id, e.num_envs, seed, e.vectorization, **e.kwargs)
    from pickaxe.dist.env_workers import RayVectorEnv
    from pickaxe.dist.runtime import ensure_ray

    ray = ensure_ray(d.address)
    if d.address is None:  # a local Ray cannot grow: workers that do not fit would wait forever
        have = ray.cluster_resources()
        for what, each, flag in (("CPU", d.worker_cpus, "cpus"), ("GPU", d.worker_gpus, "gpus")):
            need = d.workers * each
            if need > have.get(what, 0.0) + 1e-9:
                raise ConfigError(
                    f"--dist.workers {d.workers} x --dist.worker-{flag} {each:g} needs {need:g} {what}s, this "
                    f"machine's Ray has {have.get(what, 0.0):g}: use fewer workers, a smaller --dist.worker-{flag} "
                    "or --dist.address of a cluster"
                )
    on_event = (lambda message: run.event(message)) if run is not None else None
    return RayVectorEnv(
        e.id,
        e.num_envs,
        seed,
        d.workers,
        env_kwargs=e.kwargs,
        worker_cpus=d.worker_cpus,
        worker_gpus=d.worker_gpus,
        on_event=on_event,
    )


def build_trainer(cfg: TrainConfig, run: Run | None = None, progress: bool = False) -> Trainer:
    """Seed everything, make envs, networks, algorithm, collector, and the Trainer that runs them (an offline
    algorithm: :func:`build_offline_trainer`)."""
    if is_offline(cfg.algo):
        return build_offline_trainer(cfg, run, progress)
    if is_multiagent(cfg.algo):
        return build_multiagent_trainer(cfg, run, progress)
    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    e = cfg.env
    envs = make_train_envs(cfg, seeds["env"], run)
    eval_vec = e.vectorization if e.vectorization in ("vector", "auto") else "sync"  # same numbers as sync
    eval_envs = (
        make(e.id, e.eval_envs, seeds["eval_env"], eval_vec, evaluation=True, **e.kwargs) if e.eval_envs > 0 else None
    )
    algo = build_algorithm(cfg, envs)
    evaluator = None
    if uses_demonstrations(cfg.algo):  # gail: the --data.dataset pairs it imitates, scored against their references
        sampler, refs = demonstrations(cfg, envs, device, seeds["buffer"])
        algo.use_demonstrations(sampler)  # type: ignore[attr-defined]
        if eval_envs is not None:
            evaluator = OfflineEvaluator(eval_envs, cfg.trainer.eval_episodes, device, refs)
    if cfg.warm_start.run is not None:
        from pickaxe.train.online_start import start_from_offline

        start_from_offline(algo, cfg.warm_start, envs, e.id, device, seeds["buffer"])
    collector = Collector(envs, algo.policy, steps=cfg.collector.steps, device=device)
    return settled_trainer(
        cfg,
        algo,
        collector,
        run,
        progress,
        evaluator,
        eval_envs=eval_envs,
        eval_at_start=cfg.warm_start.run is not None,
    )


def settled_trainer(
    cfg: TrainConfig, algo: Any, source: Any, run: Run | None, progress: bool, evaluator: Any, **more: Any
) -> Trainer:
    """The Trainer of a classic, offline or multi-agent run over ``source`` (a collector or a dataset sampler), once
    its models are built: ``settle_for_training`` first (as for LLM runs: the ~340k objects of imports and build
    kept out of full GC passes)."""
    settle_for_training()
    return Trainer(
        algo,
        source,
        run=run,
        config=cfg.trainer,
        progress=progress,
        torch_threads=cfg.torch_threads,
        evaluator=evaluator,
        select=cfg.select,
        **more,
    )


def demonstrations(
    cfg: TrainConfig, envs: Any, device: torch.device, seed: int
) -> tuple[DatasetSampler, tuple[float, float] | None]:
    """GAIL's demonstrations: ``--data.dataset`` (and ``--data.mix``) read whole and checked against the env's spaces,
    as a ``DatasetSampler`` of ``algo.disc_batch_size`` pairs per draw seeded by ``seed``, with the first dataset's
    random and expert references (None when it records none)."""
    paths = [cfg.data.dataset, *cfg.data.mix]
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    for path in paths:
        check_fits(path, obs_space, action_space, cfg.env.id)
    transitions = read_mixed(paths)
    return DatasetSampler(transitions, cfg.algo.disc_batch_size, seed, device), references(transitions.metadata)


class OfflineEvaluator(EnvEvaluator):
    """``EnvEvaluator`` plus, when the dataset records random and expert references, the D4RL-style normalised score
    of every episode (``eval/normalized_score`` with its 95% CI)."""

    def __init__(self, envs: Any, episodes: int, device: Any, refs: tuple[float, float] | None) -> None:
        super().__init__(envs, episodes, device)
        self.refs = refs

    def samples(self, algo: Algorithm) -> dict[str, np.ndarray]:
        """Per-episode ``return``, ``length`` and (with references) ``normalized_score``."""
        from pickaxe.offline.scores import normalized_score

        values = super().samples(algo)
        if self.refs is not None:
            values["normalized_score"] = normalized_score(values["return"], *self.refs)
        return values

    def __call__(self, algo: Algorithm) -> dict[str, float]:
        """The env metrics and the normalised score."""
        values = self.samples(algo)
        returns, lengths = values["return"], values["length"]
        low, high = mean_ci(returns)
        out = {
            "eval/return_mean": float(returns.mean()),
            "eval/return_mean_ci_low": low,
            "eval/return_mean_ci_high": high,
            "eval/return_std": float(returns.std()),
            "eval/length_mean": float(lengths.mean()),
        }
        if "normalized_score" in values:
            scores = values["normalized_score"]
            low, high = mean_ci(scores)
            out.update(
                {
                    "eval/normalized_score": float(scores.mean()),
                    "eval/normalized_score_ci_low": low,
                    "eval/normalized_score_ci_high": high,
                }
            )
        return out


def build_offline_trainer(cfg: TrainConfig, run: Run | None = None, progress: bool = False) -> Trainer:
    """An offline run: the datasets (``--data.dataset`` and ``--data.mix``, read whole and checked against the env's
    spaces before anything trains) as a ``DatasetSampler`` in the collector's place, the algorithm sized from them
    (with ``algo.normalize_obs``, its networks' observation statistics set to those of every transition's
    observation), and evaluation on the env (with the normalised score when the dataset records references)."""
    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    paths = [cfg.data.dataset, *cfg.data.mix]
    transitions = read_mixed(paths)
    if run is not None:  # where the data came from, in the run (a dataset pickaxe made: its source run and weights)
        meta = transitions.metadata
        run.event(
            f"dataset {cfg.data.dataset}: {len(transitions)} transitions",
            echo=False,
            datasets=paths,
            source=meta.get("pickaxe_source"),
            collect=meta.get("pickaxe_collect"),
        )
    e = cfg.env
    eval_envs = make(e.id, max(e.eval_envs, 1), seeds["eval_env"], "sync", evaluation=True, **e.kwargs)
    try:
        for path in paths:
            check_fits(path, eval_envs.single_observation_space, eval_envs.single_action_space, e.id)
        sampler = DatasetSampler(transitions, cfg.collector.steps, seeds["buffer"], device)
        algo = build_algorithm(cfg, sampler)
        if getattr(cfg.algo, "normalize_obs", False):  # once, from every transition; a resume's checkpoint wins
            fit_obs_norm(algo.networks().values(), sampler.data["obs"])
        if getattr(cfg.algo, "reward_scale", "none") == "return-range":  # once too; a resume's checkpoint wins
            algo.reward_scale = return_range_scale(transitions.episode_returns)
            if run is not None:
                returns = transitions.episode_returns
                run.event(
                    f"reward scale {algo.reward_scale:.6g}: 1000 / (max - min) of the dataset's {len(returns)} "
                    f"episode returns ({returns.min():.1f} to {returns.max():.1f})",
                    reward_scale=algo.reward_scale,
                    episodes=len(returns),
                    return_min=float(returns.min()),
                    return_max=float(returns.max()),
                )
    except BaseException:
        eval_envs.close()
        raise
    evaluator = None
    if e.eval_envs > 0:
        evaluator = OfflineEvaluator(eval_envs, cfg.trainer.eval_episodes, device, references(transitions.metadata))
    else:
        eval_envs.close()
    return settled_trainer(cfg, algo, sampler, run, progress, evaluator)


def build_multiagent_trainer(cfg: TrainConfig, run: Run | None = None, progress: bool = False) -> Trainer:
    """A multi-agent run (IPPO, MAPPO): ``env.num_envs`` copies of the PettingZoo env as one
    ``MultiAgentVectorEnv``, the algorithm sized from its agents, the ``MultiAgentCollector``, and per-agent
    evaluation (``MultiAgentEvaluator``) on ``env.eval_envs`` copies."""
    from pickaxe.envs.multiagent import MultiAgentVectorEnv
    from pickaxe.rollout.multiagent import MultiAgentCollector
    from pickaxe.train.multiagent import MultiAgentEvaluator

    set_torch_threads(cfg.torch_threads)
    seed_everything(cfg.seed)
    seeds = derive_seeds(cfg.seed)
    device = resolve_device(cfg.device)
    e = cfg.env
    envs = MultiAgentVectorEnv(e.id, e.num_envs, seeds["env"], **e.kwargs)
    eval_envs = MultiAgentVectorEnv(e.id, e.eval_envs, seeds["eval_env"], **e.kwargs) if e.eval_envs > 0 else None
    algo = build_algorithm(cfg, envs)
    collector = MultiAgentCollector(envs, algo.policy, steps=cfg.collector.steps, device=device)
    evaluator = MultiAgentEvaluator(eval_envs, cfg.trainer.eval_episodes, device) if eval_envs is not None else None
    return settled_trainer(cfg, algo, collector, run, progress, evaluator)


Builder = Callable[[Any, Run | None, bool], Trainer]
BUILDERS: dict[str, str] = {
    "classic": "pickaxe.train.build:build_trainer",
    "llm": "pickaxe.train.llm_runs:build_llm_run",
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
    overwrite: bool = False,
    checked: bool = False,
) -> tuple[FitResult, Run]:
    """Train any registered config (``TrainConfig`` and others) into ``run_dir`` (default ``runs/<recipe>-<time>``).

    Everything is checked before the run directory is created: config values, env id and device
    (``cfg.check()``), trackers, the Prometheus port, and that the folder can be written. A folder that already
    holds a run is refused (``pickaxe resume`` continues it) unless ``overwrite``, which moves the old run aside
    to ``<run_dir>.old-<timestamp>``. If building the experiment fails with a user error, the new run folder is
    removed again. A full disk or an unwritable folder during training raises a one-line ``PickaxeError``.
    ``checked``: the caller already ran ``cfg.check()`` on this config (the CLI does, before importing torch).
    """
    builder = builder_for(cfg)
    if not checked:
        cfg.check()  # a bad value, env id, input, device or missing extra fails before the run directory exists
    _follow_if_learner(cfg)
    path = Path(run_dir) if run_dir is not None else default_run_dir(cfg.recipe)
    try:
        run = Run(
            path,
            config=cfg.to_dict(),
            seed=cfg.seed,
            track=track,
            prometheus_port=prometheus_port,
            overwrite=overwrite,
        )
    except Exception as e:
        error = disk_error(e, path, resumable=False)  # Run removed what it had written
        if error is None:
            raise
        raise error from None
    return _fit(builder, cfg, run, progress, resume=None), run


def resume(
    run_dir: str | Path,
    progress: bool = False,
    track: tuple[str, ...] = (),
    prometheus_port: int | None = None,
    allow_no_checkpoint: bool = False,
    learners: int | None = None,
    shard: str | None = None,
) -> tuple[FitResult, Run]:
    """Continue a run from its newest good checkpoint to its original budget.

    A run without a checkpoint is a one-line ``PickaxeError`` before anything is built, unless
    ``allow_no_checkpoint`` (what the ``--max-restarts`` supervisor and the queue's later attempts use) or the run
    keeps no checkpoints (best-of-n): then it starts again from step 0 in its folder, as a new run would, and says
    so on stderr and in ``events.jsonl``. ``learners``: continue on that many data-parallel learners instead of the
    run's own count (a sharded checkpoint is cut into the new learners' rows; one learner trains unsharded), and
    ``shard`` (``none`` or ``fsdp``) instead of its ``--dist.shard``; both recorded in ``config.json`` and
    ``events.jsonl``.
    """
    _follow_if_learner(None, run_dir)
    run = Run.open(run_dir, track=track, prometheus_port=prometheus_port)
    try:
        check_run_writable(run.path)  # a read-only run folder is one line before anything is built
        cfg = config_from_dict(run.config())
        check_supplied = getattr(cfg, "check_supplied", None)
        if check_supplied is not None:  # Python rewards and tools: passed again or importable, before any build
            check_supplied()
        if learners is not None or shard is not None:
            _relearn(cfg, run, learners, shard)
    except PickaxeError:
        run.close()  # trackers and the Prometheus endpoint it started
        raise
    how = "resume"
    if not has_checkpoint(run.path):
        if not allow_no_checkpoint and not isinstance(getattr(cfg, "algo", None), BestOfNConfig):
            run.close()
            raise no_checkpoint_error(run.path)
        how = "restart"
    return _fit(builder_for(cfg), cfg, run, progress, resume=how), run


def _relearn(cfg: Any, run: Run, learners: int | None, shard: str | None) -> None:
    """Lay a resumed run out on ``learners`` data-parallel learners and ``shard`` (``pickaxe resume --learners N
    --shard S``; None keeps the run's): checked before anything is built, then recorded in the run's
    ``config.json`` and ``events.jsonl``. One learner cannot shard: resumed on one, a sharded run trains unsharded
    (its checkpoint is read whole)."""
    dist_cfg = getattr(cfg, "dist", None)
    if dist_cfg is None or not hasattr(dist_cfg, "shard"):
        raise ConfigError("--learners/--shard: this run has no data-parallel learners to change; drop them")
    before = (dist_cfg.learners, dist_cfg.shard)
    if learners is not None:
        dist_cfg.learners = learners
    if shard is not None:
        dist_cfg.shard = shard
    elif dist_cfg.learners == 1:
        dist_cfg.shard, dist_cfg.offload = "none", "none"
    cfg.check()
    if (dist_cfg.learners, dist_cfg.shard) != before:
        run.set_config(cfg.to_dict())
        run.event(
            f"resumed on {dist_cfg.learners} learner(s) with --dist.shard {dist_cfg.shard} (was {before[0]}, "
            f"{before[1]})",
            learners=dist_cfg.learners,
            shard=dist_cfg.shard,
        )


def _fit(builder: Builder, cfg: Any, run: Run, progress: bool, resume: str | None) -> FitResult:
    """Build and run the Trainer, then close the run; a full disk or an unwritable run folder becomes a one-line
    ``PickaxeError`` (what was written before stays: metrics are flushed per record, checkpoints are atomic)."""
    try:
        result = _build_and_fit(builder, cfg, run, progress, resume)
    except Exception as e:
        with contextlib.suppress(Exception):
            run.close()
        error = disk_error(e, run.path)
        if error is None:
            raise
        raise error from e
    except BaseException:
        with contextlib.suppress(Exception):
            run.close()
        raise
    try:
        run.close()
    except Exception as e:
        error = disk_error(e, run.path)
        if error is None:
            raise
        raise error from e
    return result


def _build_and_fit(builder: Builder, cfg: Any, run: Run, progress: bool, resume: str | None) -> FitResult:
    """``resume``: None (a new run), ``"resume"`` (from its newest good checkpoint) or ``"restart"`` (a run without a
    checkpoint, started again from step 0). ``status.json`` reads running (phase loading) from here on."""
    run.set_phase("loading")
    leader = None
    try:
        if resume == "restart":
            _start_over(run)
        trainer = builder(cfg, run, progress)
        leader = _launch_learners(cfg, trainer)
    except PickaxeError as e:
        if resume is None:  # a user error found while building: leave no half-made run behind
            run.discard()
        else:
            run.end_with(e)
        raise
    except BaseException as e:
        run.end_with(e)
        raise
    try:
        if resume == "resume":
            try:
                trainer.resume()
            except BaseException as e:
                run.end_with(e)
                raise
        return trainer.fit()
    finally:
        if leader is not None:
            leader.close()
        trainer.close()


def _start_over(run: Run) -> None:
    """Start a run that has no checkpoint again from step 0 in its folder: what its stopped attempt logged (metrics,
    kept policies, the selection) is dropped, so it ends with what an uninterrupted run writes; said in one line on
    stderr and in ``events.jsonl``."""
    run.rewind(-1)
    prune_policies(run.path, -1)
    (run.path / SELECTION_FILE).unlink(missing_ok=True)
    run.event(f"{run.path} has no checkpoint to resume from: starting the run again from step 0", restart=True)


# ------------------------------------------------------------------- data-parallel learners (pickaxe.dist.learners)
def _launch_learners(cfg: Any, trainer: Trainer) -> Any:
    """With ``dist.learners`` > 1: start (or, under torchrun, join) the other learners and link the Trainer's
    algorithm to them; returns the link to close, None for one learner. A refusal closes the Trainer."""
    if getattr(getattr(cfg, "dist", None), "learners", 1) <= 1 and "WORLD_SIZE" not in os.environ:
        return None
    from pickaxe.dist.learners import launch

    try:
        return launch(cfg, trainer.algo, build_follower, trainer.checkpoints)
    except BaseException:
        trainer.close()
        raise


def _follow_if_learner(cfg: Any, run_dir: str | Path | None = None) -> None:
    """A torchrun learner other than rank 0 follows rank 0's updates (of ``cfg``, or of the run in ``run_dir``)
    and exits 0 when rank 0 ends: it writes no run folder."""
    if int(os.environ.get("RANK", "0")) == 0 or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from pickaxe.dist.learners import follow_run

    if cfg is None:
        cfg = config_from_dict(json.loads((Path(run_dir) / "config.json").read_text()))
    follow_run(cfg, build_follower)
    raise SystemExit(0)


def build_follower(config: dict[str, Any]) -> Any:
    """The Trainer of a data-parallel learner other than rank 0, from the run's config as ``to_dict`` gives it: built
    as ``pickaxe.dist.learners.follower_config`` says, without a run folder (rank 0 writes it)."""
    from pickaxe.dist.learners import follower_config

    cfg = config_from_dict(config)
    return builder_for(cfg)(follower_config(cfg), None, False)


def evaluate_run(
    cfg: TrainConfig, run_dir: str | Path, episodes: int = 10, checkpoint: str | int = "final"
) -> tuple[np.ndarray, np.ndarray]:
    """Rebuild a run's policy from its config and verified weights and evaluate it.

    ``checkpoint``: ``"final"`` (``model.safetensors``), ``"latest"``, ``"best"`` or an env step (a kept
    checkpoint); see :func:`pickaxe.runs.model.load_model`.
    """
    if is_multiagent(cfg.algo):
        return _evaluate_multiagent_run(cfg, run_dir, episodes, checkpoint)
    envs, algo, device = run_evaluation_setup(cfg)
    try:
        load_model(run_dir, acting_networks(algo.networks()), device, checkpoint=checkpoint)
        return evaluate(algo.policy, envs, episodes, device)
    finally:
        envs.close()


def _evaluate_multiagent_run(
    cfg: TrainConfig, run_dir: str | Path, episodes: int, checkpoint: str | int
) -> tuple[np.ndarray, np.ndarray]:
    """``evaluate_run`` of a multi-agent run: the episode returns summed over the agents, and the lengths."""
    values = evaluate_multiagent_samples(cfg, run_dir, episodes, checkpoint)
    return values["return"], values["length"].astype(np.int64)


def evaluate_multiagent_samples(
    cfg: TrainConfig, run_dir: str | Path, episodes: int, checkpoint: str | int = "final"
) -> dict[str, np.ndarray]:
    """A multi-agent run's policy (its config and verified weights: ``checkpoint`` as for :func:`evaluate_run`) on its
    own eval envs: per episode, the ``return`` summed over the agents, ``length`` and ``agent/<name>/return``
    (``train.multiagent.multiagent_estimates`` summarises them with CIs)."""
    from pickaxe.train.multiagent import MultiAgentEvaluator

    envs, algo, device = run_evaluation_setup(cfg)
    try:
        load_model(run_dir, acting_networks(algo.networks()), device, checkpoint=checkpoint)
        return MultiAgentEvaluator(envs, episodes, device).samples(algo)
    finally:
        envs.close()


def run_evaluation_setup(
    cfg: TrainConfig,
) -> tuple[SeededVectorEnv | MultiAgentVectorEnv, Algorithm, torch.device]:
    """The run's own eval envs (:func:`run_eval_envs`: the same episodes as its evaluations), its algorithm rebuilt
    from ``cfg`` (load a checkpoint's weights into its networks) and the device; the caller closes the envs."""
    set_torch_threads(cfg.torch_threads)
    device = resolve_device(cfg.device)
    envs = run_eval_envs(cfg)
    try:
        return envs, build_algorithm(cfg, envs), device
    except BaseException:
        envs.close()
        raise


def run_eval_envs(cfg: TrainConfig) -> SeededVectorEnv | MultiAgentVectorEnv:
    """The run's own eval envs: its eval seed and env count (at least one), so they play the episodes its evaluations
    played (a ``MultiAgentVectorEnv`` for a multi-agent run, else a ``SeededVectorEnv``); the caller closes them."""
    n, seed = cfg.env.eval_envs or 1, derive_seeds(cfg.seed)["eval_env"]
    if is_multiagent(cfg.algo):
        from pickaxe.envs.multiagent import MultiAgentVectorEnv

        return MultiAgentVectorEnv(cfg.env.id, n, seed, **cfg.env.kwargs)
    return make(cfg.env.id, n, seed, evaluation=True, **cfg.env.kwargs)
