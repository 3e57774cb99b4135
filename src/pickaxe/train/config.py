"""The typed config of a training run; a recipe is a named, complete ``TrainConfig``."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pickaxe.algos.configs import A2CConfig, DQNConfig, PPOConfig, RecurrentPPOConfig
from pickaxe.algos.control_configs import DDPGConfig, SACConfig, TD3Config
from pickaxe.algos.explore_configs import ExplorePPOConfig
from pickaxe.algos.extra_configs import (
    BranchingDQNConfig,
    FQFConfig,
    IQNConfig,
    NPGConfig,
    REDQConfig,
    ReinforceConfig,
    TRPOConfig,
)
from pickaxe.algos.imitation_configs import GAILConfig, uses_demonstrations
from pickaxe.algos.multiagent_configs import (
    IDQNConfig,
    IPPOConfig,
    MAPPOConfig,
    is_multiagent,
    needs_state,
    takes_box_actions,
)
from pickaxe.algos.offline_configs import (
    BCConfig,
    BCQConfig,
    CQLConfig,
    CQLOnlineConfig,
    CRRConfig,
    IQLConfig,
    IQLOnlineConfig,
    TD3BCConfig,
    is_offline,
)
from pickaxe.config_keys import check_field, ranged, validate
from pickaxe.errors import ConfigError
from pickaxe.eval.selection import SelectConfig


@dataclass
class TrainerConfig:
    """Loop settings shared by every recipe (classic and LLM)."""

    total_steps: int = ranged(100_000, ge=1)
    """Env steps to train for."""
    eval_every: int = ranged(10_000, ge=0)
    """Env steps between evaluations (0: only at the end)."""
    eval_episodes: int = ranged(10, ge=1)
    target_return: float | None = None
    """The value of ``target_metric`` that counts as solved (recorded as ``solved_step``); None: no target."""
    target_metric: str = "eval/return_mean"
    """The eval metric ``target_return`` is a value of (goal envs: ``eval/success_rate``)."""
    stop_at_target: bool = True
    """Stop at the first evaluation that reaches ``target_return`` (False: train on, still record when)."""
    log_every: int = ranged(0, ge=0)
    """Env steps between log records (0: every update). Evaluations are always logged."""
    save_every: int = ranged(0, ge=0)
    """Env steps between checkpoints on top of those at evaluations (0: none). Needs a Run."""
    save_at_eval: bool = True
    """Checkpoint at every evaluation, with its eval return as the metric (needs a Run).

    The default that makes every run resumable without choosing an interval: a crash loses at most the work
    since the last evaluation, the best evaluation is always on disk for ``keep_best``, and a checkpoint costs a
    small fraction of the evaluation it follows (cartpole-ppo on a busy 2-core machine: ~0.1 s against ~1 s).
    Ctrl-C and SIGTERM checkpoint at the next iteration boundary anyway; the end of training always does.
    Evaluations that beat the best so far are checkpointed even when this is False."""
    keep_last: int = ranged(3, ge=1)
    """Checkpoints kept by recency."""
    keep_best: int = ranged(1, ge=0)
    """Checkpoints kept by eval return (on top of keep_last)."""
    keep_policies: bool = True
    """Keep the policy weights alone (no optimizer or buffer state) at every evaluation, under
    ``RUN/policies/``, so every evaluated step stays selectable after keep_last has pruned the full checkpoints.
    Needs a Run."""
    async_checkpoint: bool = False
    """Write checkpoints in the background: the step waits only for a copy of the state in host memory (on a GPU,
    the device-to-host copy), a helper thread writes and commits it atomically while training goes on, and a kill
    during the write leaves the previous checkpoint in place. Costs host memory equal to the state (``pickaxe plan``
    counts it); the final checkpoint and the one of a Ctrl-C or SIGTERM are written before the run ends. Off: the
    streamed synchronous write, which holds no copy (the default: on a CPU the copy is the whole state again)."""
    on_nonfinite: Literal["rollback", "stop"] = "rollback"
    """On a NaN/Inf loss, gradient or parameter: reload the last good checkpoint, or stop."""
    max_rollbacks: int = ranged(3, ge=0)
    """Rollbacks allowed before a non-finite value stops the run."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class EnvConfig:
    """Which environment, how many copies, and the keyword arguments it is made with."""

    id: str = "CartPole-v1"
    """A registered gymnasium id, or ``module:EnvId`` to import ``module`` (which registers it) first."""
    num_envs: int = ranged(8, ge=1, le=65_536)
    vectorization: Literal["sync", "async", "vector", "envpool", "auto"] = "sync"
    """sync: step copies in this process (cheap envs); async: one subprocess per copy (expensive envs); vector:
    numpy-vectorised in one array step (CartPole; same numbers as sync, faster); envpool: EnvPool's C++ pool;
    auto: vector where pickaxe has a numpy implementation of the env, else sync."""
    eval_envs: int = ranged(10, ge=0, le=65_536)
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env's constructor (gymnasium.make), e.g. {"max_episode_steps": 50}; on the
    command line --env.kwargs '{"max_episode_steps": 50}' or --env.kwargs.max_episode_steps 50."""

    def __post_init__(self) -> None:
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise ConfigError(f"env.kwargs must be a JSON object with string keys, got {self.kwargs!r}")
        validate(self)


@dataclass
class ModelConfig:
    """Network shape."""

    hidden: tuple[int, ...] = ranged(default_factory=lambda: (64, 64), ge=1, le=1_000_000)
    activation: Literal["tanh", "relu", "elu", "gelu"] = "tanh"
    shared: bool = False
    """Actor-critics (ppo, a2c): actor and critic share the hidden layers, with a linear head each (False: two
    separate MLPs). The recurrent policy shares its torso and LSTM unless --algo.separate-critic."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class CollectorConfig:
    """Collection settings."""

    steps: int = ranged(2048, ge=1)
    """Env steps per collect, all envs together (a multiple of env.num_envs)."""

    def __post_init__(self) -> None:
        validate(self)


@dataclass
class DataConfig:
    """Offline runs (bc, td3-bc, iql, cql, bcq, crr): the Minari dataset(s) they learn from instead of env steps;
    gail: the demonstrations it imitates."""

    dataset: str | None = None
    """A Minari dataset folder (``pickaxe collect RUN --out DIR`` writes one; one made with Minari works too). Its
    spaces must be the env's (``--env.id``), which evaluates the policy."""
    mix: tuple[str, ...] = ()
    """More datasets whose transitions join --data.dataset's, sampled as one (e.g. medium-expert: --data.dataset
    EXPERT --data.mix MEDIUM); the first dataset's random/expert references score the run."""
    make: Literal["expert", "medium", "random"] | None = None
    """Without --data.dataset: the dataset of this kind made from pickaxe's own source run of the env (CartPole:
    cartpole-ppo; Pendulum: pendulum-sac; Hopper: hopper-ppo; HalfCheetah: halfcheetah-sac; seed 0), made once and
    cached under $PICKAXE_DATASETS (default ~/.cache/pickaxe/datasets), keyed by env, kind and the source's settings."""
    source_steps: int | None = ranged(None, ge=1)
    """Env steps of the source run that --data.make trains (None: its recipe's budget, stopping at its target)."""

    def __post_init__(self) -> None:
        if isinstance(self.mix, str):
            self.mix = (self.mix,)
        validate(self)
        # absolute, so that a resume, a sweep job or an eval from another folder reads the same files
        if self.dataset is not None:
            self.dataset = str(Path(self.dataset).absolute())
        self.mix = tuple(str(Path(p).absolute()) for p in self.mix)


WARM_STARTS: dict[str, tuple[str, ...]] = {"td3": ("td3-bc",), "iql-online": ("iql",), "cql-online": ("cql",)}
"""Online algorithm -> the offline algorithms whose runs ``--warm-start.run`` continues with it (the same networks
under the same names, so every weight carries over: TD3+BC's actor, twin critics and targets are TD3's; IQL and CQL
continue as themselves, trained online)."""
CONTINUES_TRAINING = ("iql-online", "cql-online")
"""Online algorithms that are their offline algorithm trained online: they continue its whole training state
(optimizer moments, temperature), read from the offline run's final checkpoint, not only its weights."""


@dataclass
class OnlineStartConfig:
    """Offline-to-online: an online run that starts from a finished offline run's final weights (every network,
    critics and targets included), its replay buffer seeded with that run's dataset (``--data.dataset`` and
    ``--data.mix`` of the offline run)."""

    run: str | None = None
    """The offline run's folder (it must have finished: ``model.safetensors``); see ``WARM_STARTS`` for which
    algorithm continues which."""
    seed_replay: bool = True
    """Put the offline run's dataset in the replay buffer before the first env step."""

    def __post_init__(self) -> None:
        validate(self)
        if self.run is not None:  # absolute, as --data.dataset: a resume or a sweep job reads the same run
            self.run = str(Path(self.run).absolute())


@dataclass
class DistConfig:
    """Where rollouts and learners run: in the learner's process (the default), or as Ray workers on this machine
    or a Ray cluster. The Trainer and the algorithms are the same in every placement."""

    placement: Literal["colocated", "separate"] = "colocated"
    """colocated: envs (classic, as env.vectorization says) or the rollout engine (LLM, sharing the learner's
    module) run in the learner's process; separate: in Ray actors, env workers (classic) or engine workers with
    their own copy of the weights, updated after every update (LLM). Needs the dist extra."""
    workers: int = ranged(1, ge=1, le=4096)
    """Rollout workers (Ray actors) with placement=separate: the envs (classic) or a batch's prompts (LLM) are
    split among them."""
    mode: Literal["sync", "pipelined", "async"] = "sync"
    """LLM with placement=separate. sync: each batch is generated with the newest weights (the numbers of
    colocated). pipelined: batch k is generated by policy version k - max_staleness while the batches before it
    train (reproducible from the seed, exactly resumable). async: workers generate ahead with the newest weights
    they hold, and batches more than max_staleness versions old are dropped (fastest; not reproducible)."""
    max_staleness: int = ranged(1, ge=1, le=64)
    """Policy versions a batch may lag the learner by (pipelined: exactly this many; async: at most)."""
    address: str | None = None
    """Ray cluster to join (``auto``, ``host:6379`` or ``ray://host:10001``); None: start Ray on this machine."""
    worker_cpus: float = ranged(1.0, ge=0, le=4096)
    """CPUs Ray reserves for each rollout worker."""
    worker_gpus: float = ranged(0.0, ge=0, le=4096)
    """GPUs Ray reserves for each rollout worker (fractions share one GPU)."""
    learners: int = ranged(1, ge=1, le=4096)
    """Data-parallel learner processes (torch.distributed: gloo on CPU, NCCL on GPU); each takes a share of every
    update's micro-batches and the gradients are summed, so the update equals the single-process one."""
    shard: Literal["none", "fsdp"] = "none"
    """LLM learners. none: every learner holds the whole model, its gradients and optimizer state. fsdp: they are
    sharded across the learners (PyTorch FSDP2, one decoder layer per unit; ZeRO-3), so each holds 1/N of the
    training state; needs --dist.learners 2 or more."""
    offload: Literal["none", "optimizer", "params"] = "none"
    """With --dist.shard fsdp: keep AdamW's state in host memory and step there, the shards and gradients staying
    on the device (optimizer), or keep the sharded parameters, gradients and optimizer state there (params; FSDP2's
    CPU offload); slower, for a training state larger than the device. On a CPU device there is nothing to offload
    to and it changes nothing."""
    shard_reference: bool = True
    """With --dist.shard fsdp: shard the frozen reference model too (DPO's, and GRPO's and PPO's KL reference unless
    it is the LoRA policy), so each learner holds 1/N of it and scores its share of every batch with the others;
    false keeps it whole (the KL reference on rank 0, scored there by the collector; DPO's on every learner)."""
    shard_reward_model: bool = True
    """With --dist.shard fsdp: shard the frozen reward model (--data.reward-model) too, so each learner holds 1/N of
    it and scores its share of every batch of completions with the others (rank 0 asks them to join); false keeps
    it whole on rank 0, which alone scores with it."""

    def __post_init__(self) -> None:
        validate(self)

    def check(self, llm: bool) -> None:
        """Checks across fields: the modes and worker counts need placement=separate, and Ray installed."""
        if self.shard != "none" and not llm:
            raise ConfigError(f"--dist.shard {self.shard} shards LLM learners; classic runs: drop --dist.shard")
        if self.shard != "none" and self.learners < 2:
            raise ConfigError(f"--dist.shard {self.shard} shards across learners: add --dist.learners 2 (or more)")
        if self.offload != "none" and self.shard == "none":
            raise ConfigError(f"--dist.offload {self.offload} offloads sharded state: add --dist.shard fsdp")
        if self.placement == "colocated":
            for key, value, default in (("mode", self.mode, "sync"), ("workers", self.workers, 1)):
                if value != default:
                    raise ConfigError(f"--dist.{key} {value} needs rollout workers: add --dist.placement separate")
            if self.address is not None:
                raise ConfigError("--dist.address joins a Ray cluster for workers: add --dist.placement separate")
            return
        if not llm and self.mode != "sync":
            raise ConfigError(
                f"--dist.mode {self.mode} is for LLM runs (rollouts ahead of the learner); classic env workers step "
                "in lockstep with the policy: drop --dist.mode"
            )
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("--dist.placement separate runs workers on Ray: pip install 'pickaxe[dist]'")
        if self.address is not None:
            check_ray_address(self.address, "--dist.address")


def check_ray_address(address: str, flag: str) -> None:
    """A ``host:port`` or ``ray://host:port`` Ray address must answer a TCP connection within 3 s (else joining
    it would wait minutes before failing); ``auto`` is left to Ray. One-line ``ConfigError`` naming the fix."""
    import socket

    if address == "auto":
        return
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{flag} {address!r} is not a Ray address: use auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise ConfigError(
            f"{flag} {address}: no Ray cluster answers there ({e.strerror or e}); start one with `ray start --head "
            f"--port {port}` or leave {flag} out to start Ray on this machine"
        ) from None


def device_field() -> Any:
    """The ``device`` field of every run config: auto (CUDA when available), cpu, cuda, cuda:N or mps."""
    return ranged("auto", pattern=r"auto|cpu|mps|cuda(:\d+)?", choices="auto, cpu, cuda, cuda:N or mps")


class RunConfig:
    """What every run config shares: JSON round trip with its ``kind`` and the name of its algorithm.

    Subclasses (dataclasses with an ``algo`` field) set ``KIND`` (the ``"kind"`` in ``config.json``) and
    ``ALGOS`` (algorithm name -> algorithm config type).
    """

    KIND: ClassVar[str]
    ALGOS: ClassVar[dict[str, type]]

    def __post_init__(self) -> None:
        validate(self, "")

    def check(self, pending: Sequence[Path] = ()) -> None:
        """Fail fast, before a run directory exists: every value in range (keys named in full), the checks of
        ``check_more``, ``--select.metric`` names a metric the run logs, and the device exists. ``pending``:
        absolute folders an earlier pipeline stage writes; inputs under them are checked when their stage starts."""
        from pickaxe.train.eval_metrics import check_select_metric

        validate(self, "")
        self.check_more(pending)
        check_select_metric(self)
        from pickaxe.utils import resolve_device  # imports torch: after every check that does not need it

        resolve_device(self.device)  # type: ignore[attr-defined]

    def check_more(self, pending: Sequence[Path] = ()) -> None:
        """Checks across fields or against the installed software; each kind of run adds its own (``pending``: see
        ``check``)."""

    def algo_name(self) -> str:
        """The registry name of ``self.algo``'s config type."""
        for name, typ in self.ALGOS.items():
            if type(self.algo) is typ:  # type: ignore[attr-defined]
                return name
        known = ", ".join(t.__name__ for t in self.ALGOS.values())
        raise ConfigError(f"unknown algorithm config type {type(self.algo).__name__}; use one of {known}")  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, with ``kind`` and ``algo_name`` recording what ``algo`` configures."""
        out = _to_plain(self)
        out["algo_name"] = self.algo_name()
        out["kind"] = self.KIND
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Inverse of ``to_dict`` (e.g. a run's ``config.json``); unknown keys raise ``ConfigError``."""
        if not isinstance(data, dict):
            raise ConfigError(f"a run config must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        data.pop("kind", None)
        name = data.pop("algo_name", None)
        if not isinstance(name, str) or name not in cls.ALGOS:
            raise ConfigError(f"config names algorithm {name!r}; known: {sorted(cls.ALGOS)}")
        cfg = _from_plain(cls, {k: v for k, v in data.items() if k != "algo"}, "")
        cfg.algo = _from_plain(cls.ALGOS[name], data.get("algo", {}), "algo.")
        return cfg


@dataclass
class TrainConfig(RunConfig):
    """Everything that decides a run's numbers."""

    KIND: ClassVar[str] = "classic"
    ALGOS: ClassVar[dict[str, type]] = {
        "ppo": PPOConfig,
        "dqn": DQNConfig,
        "a2c": A2CConfig,
        "recurrent-ppo": RecurrentPPOConfig,
        "sac": SACConfig,
        "td3": TD3Config,
        "ddpg": DDPGConfig,
        "bc": BCConfig,
        "td3-bc": TD3BCConfig,
        "iql": IQLConfig,
        "cql": CQLConfig,
        "iql-online": IQLOnlineConfig,
        "cql-online": CQLOnlineConfig,
        "reinforce": ReinforceConfig,
        "npg": NPGConfig,
        "trpo": TRPOConfig,
        "redq": REDQConfig,
        "iqn": IQNConfig,
        "fqf": FQFConfig,
        "bdq": BranchingDQNConfig,
        "bcq": BCQConfig,
        "crr": CRRConfig,
        "ppo-explore": ExplorePPOConfig,
        "ippo": IPPOConfig,
        "mappo": MAPPOConfig,
        "idqn": IDQNConfig,
        "gail": GAILConfig,
    }

    algo: Any = field(default_factory=PPOConfig)
    """The algorithm's config; its type picks the algorithm (PPOConfig, DQNConfig)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    """The best-checkpoint rule (``RUN/selection.json``, ``pickaxe eval --checkpoints best``)."""
    dist: DistConfig = field(default_factory=DistConfig)
    data: DataConfig = field(default_factory=DataConfig)
    """Offline algorithms' datasets (``--data.dataset``)."""
    warm_start: OnlineStartConfig = field(default_factory=OnlineStartConfig)
    """Offline-to-online: continue an offline run online (``--warm-start.run DIR``)."""
    seed: int = ranged(0, ge=0, lt=2**63)
    device: str = device_field()
    """auto (CUDA when available), cpu, cuda, cuda:N or mps."""
    torch_threads: int = ranged(1, ge=1, le=4096)
    """Torch intra-op threads; 1 is fastest for small models on shared CPUs."""
    recipe: str = "custom"

    def check_more(self, pending: Sequence[Path] = ()) -> None:
        """The collector's steps fit the envs and the env id is registered."""
        from pickaxe.envs.make import check_env_id

        steps, n = self.collector.steps, self.env.num_envs
        if steps % n:
            lower, upper = max(n, steps // n * n), (steps // n + 1) * n
            raise ConfigError(
                f"collector.steps ({steps}) must be a multiple of env.num_envs ({n}): "
                f"use --collector.steps {lower} or {upper}"
            )
        if self.check_multiagent():
            self.check_data()
            return
        check_env_id(self.env.id)
        from pickaxe.envs.make import check_env_spaces

        her = getattr(self.algo, "her", "none")
        if her != "none" and self.warm_start.run is not None:
            raise ConfigError(
                f"--algo.her {her} cannot start from an offline run's datasets (they hold no episodes per env): drop "
                "--warm-start.run or use --algo.her none"
            )
        # spaces a network and the algo can take (goal observations for hindsight replay)
        check_env_spaces(self.env.id, self.env.kwargs, self.algo_name(), goals=her != "none")
        self.check_data()
        self.check_warm_start()
        self.dist.check(llm=False)
        if self.dist.learners > 1 and isinstance(self.algo, DQNConfig):
            raise ConfigError(
                f"--dist.learners {self.dist.learners}: DQN does not split its update among learners; use "
                "--dist.learners 1"
            )
        if self.dist.workers > self.env.num_envs:
            raise ConfigError(
                f"--dist.workers {self.dist.workers} is more than env.num_envs ({self.env.num_envs}): each worker "
                f"steps at least one env; use --dist.workers {self.env.num_envs} or more envs"
            )

    def check_multiagent(self) -> bool:
        """A PettingZoo env id needs a multi-agent algorithm (MAPPO an env with a global state, independent DQN
        Discrete actions), and a multi-agent algorithm a PettingZoo env, trained in one process; returns whether the
        run is multi-agent (its env then checked here)."""
        from pickaxe.envs.multiagent import check_multiagent_env, is_multiagent_id

        name, env_id = self.algo_name(), self.env.id
        multi_env = is_multiagent_id(env_id)
        if not is_multiagent(self.algo):
            if multi_env:
                raise ConfigError(
                    f"{env_id!r} is a multi-agent (PettingZoo) env and {name} trains one agent: use a multi-agent "
                    "algorithm (recipes simple-spread-ippo, simple-spread-mappo) or a gymnasium env"
                )
            return False
        if not multi_env:
            import importlib.util

            if importlib.util.find_spec("pettingzoo") is None:  # e.g. mpe2's envs without the marl extra
                raise ConfigError(f"{name} needs PettingZoo and its envs: pip install 'pickaxe[marl]'")
            raise ConfigError(
                f"{name} trains the agents of a PettingZoo env, and {env_id!r} is not one: use --env.id module:name "
                "(e.g. mpe2:simple_spread_v3)"
            )
        if self.dist.learners > 1 or self.dist.placement != "colocated" or self.env.vectorization != "sync":
            raise ConfigError(
                f"{name} steps its envs in this process with one learner: drop --dist.* and --env.vectorization"
            )
        if self.warm_start.run is not None:
            raise ConfigError(f"--warm-start.run: {name} cannot continue an offline run; drop --warm-start.run")
        check_multiagent_env(env_id, self.env.kwargs, name, needs_state(self.algo), takes_box_actions(self.algo))
        return True

    def check_warm_start(self) -> None:
        """``--warm-start.run``: a finished run of an offline algorithm this one continues (``WARM_STARTS``), on the
        same env with the same network sizes, whose dataset is recorded when the replay is to be seeded from it. The
        run's ``algo.normalize_obs`` becomes this one's: its networks then take the offline run's frozen observation
        statistics (loaded with its weights). An online algorithm with ``normalize_obs`` and no warm start is
        refused: it computes no statistics itself."""
        import json

        w, name = self.warm_start, self.algo_name()
        if w.run is None:
            if (name in WARM_STARTS or name == "ddpg") and getattr(self.algo, "normalize_obs", False):
                fix = "add --warm-start.run DIR or drop" if name in WARM_STARTS else "drop"
                raise ConfigError(
                    f"--algo.normalize-obs: {name} normalises observations only by the dataset statistics of an "
                    f"offline run it continues (--warm-start.run); {fix} --algo.normalize-obs"
                )
            if not is_offline(self.algo) and getattr(self.algo, "reward_scale", "none") != "none":
                raise ConfigError(
                    f"--algo.reward-scale: {name} scales rewards only as the offline run it continues did "
                    "(--warm-start.run); add --warm-start.run DIR or drop --algo.reward-scale"
                )
            return
        sources = WARM_STARTS.get(name)
        if not sources:
            pairs = ", ".join(f"{', '.join(s)} -> {a}" for a, s in WARM_STARTS.items())
            raise ConfigError(
                f"--warm-start.run: {name} cannot continue an offline run (offline-to-online pairs: {pairs}); use one "
                "of those algorithms' recipes or drop --warm-start.run"
            )
        run = Path(w.run)
        try:
            source = json.loads((run / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"--warm-start.run {run}: not a readable run folder ({type(e).__name__}); give the "
                f"folder of a finished {' or '.join(sources)} run"
            ) from None
        if source.get("algo_name") not in sources:
            raise ConfigError(
                f"--warm-start.run {run} is a {source.get('algo_name')} run; {name} continues {' or '.join(sources)} "
                "runs only"
            )
        if not (run / "model.safetensors").is_file():
            raise ConfigError(f"--warm-start.run {run} has not finished (no model.safetensors): `pickaxe resume` it")
        if name in CONTINUES_TRAINING and not (run / "checkpoints" / "latest").exists():
            raise ConfigError(
                f"--warm-start.run {run} keeps no checkpoint, whose optimizer state {name} continues: give a run "
                "folder with its checkpoints/"
            )
        env_id = source.get("env", {}).get("id")
        if env_id != self.env.id:
            raise ConfigError(
                f"--warm-start.run {run} trained on {env_id}, this run is on {self.env.id}: use --env.id {env_id}"
            )
        model = source.get("model", {})
        if list(model.get("hidden", [])) != list(self.model.hidden) or model.get("activation") != self.model.activation:
            hidden = ",".join(str(h) for h in model.get("hidden", []))
            raise ConfigError(
                f"--warm-start.run {run} has networks of --model.hidden {hidden} --model.activation "
                f"{model.get('activation')}: give this run the same"
            )
        if getattr(self.algo, "twin", True) is not True:
            raise ConfigError(f"--warm-start.run {run} has twin critics: drop --algo.twin false")
        if w.seed_replay and not source.get("data", {}).get("dataset"):
            raise ConfigError(f"--warm-start.run {run} records no dataset: add --warm-start.seed-replay false")
        # the networks see the inputs they were trained on: the offline run's statistics, frozen (its weights file)
        self.algo.normalize_obs = bool(source.get("algo", {}).get("normalize_obs", False))
        scale = source.get("algo", {}).get("reward_scale", "none")
        if name in CONTINUES_TRAINING:  # the scale itself comes with the offline run's training state
            self.algo.reward_scale = scale
        elif scale != "none":
            raise ConfigError(
                f"--warm-start.run {run} scaled its rewards (--algo.reward-scale {scale}), so its critics' values "
                f"are not in the env's units that {name} learns from: warm-start from a run without reward scaling"
            )

    def check_data(self) -> None:
        """Offline algorithms need ``--data.dataset``, whose files verify and whose spaces are the env's, and
        ``collector.steps`` a multiple of ``algo.batch_size``; online ones take no dataset."""
        d = self.data
        imitates = uses_demonstrations(self.algo)
        if not is_offline(self.algo) and not imitates:
            if d.dataset is not None or d.mix or d.make is not None:
                raise ConfigError(
                    "--data.dataset and --data.make are for the offline algorithms (bc, td3-bc, iql, cql, bcq, crr) "
                    f"and gail; {self.algo_name()} learns from the env: drop --data.dataset (and --data.make)"
                )
            return
        if imitates and (d.dataset is None or d.make is not None):
            raise ConfigError(
                f"{self.algo_name()} imitates demonstrations: add --data.dataset DIR (`pickaxe collect RUN "
                "--episodes N --out DIR` makes one from a run's policy); --data.make is for the offline algorithms"
            )
        if d.dataset is None and d.make is None:
            raise ConfigError(
                f"{self.algo_name()} learns from a dataset: add --data.dataset DIR (`pickaxe collect RUN --episodes N "
                "--out DIR` makes one from a run's policy) or --data.make expert|medium|random"
            )
        if imitates:
            if self.dist.learners > 1:
                raise ConfigError(f"{self.algo_name()} trains its discriminator in one process: drop --dist.learners")
        elif self.dist.learners > 1 or self.dist.placement != "colocated":
            raise ConfigError(
                f"{self.algo_name()} learns from a dataset in one process: drop --dist.learners and --dist.placement"
            )
        steps, size = self.collector.steps, getattr(self.algo, "batch_size", 1)
        if not imitates and steps % size:
            raise ConfigError(
                f"collector.steps ({steps}) must be a multiple of algo.batch_size ({size}): use --collector.steps "
                f"{max(size, steps // size * size)} or {(steps // size + 1) * size}"
            )
        from pickaxe.envs.make import spaces_of
        from pickaxe.offline.dataset import check_fits, verify

        obs_space, action_space = spaces_of(self.env.id, self.env.kwargs)
        made = () if d.dataset is None else (d.dataset,)  # --data.make: made (and checked) once the config is
        for path in (*made, *d.mix):
            verify(path)
            check_fits(path, obs_space, action_space, self.env.id)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    return obj


def _from_plain(typ: type, data: Any, prefix: str) -> Any:
    """Build config class ``typ`` from JSON data, checking every value against its field (keys named in full)."""
    if not isinstance(data, dict):
        where = f"{prefix.rstrip('.')} " if prefix else ""
        raise ConfigError(f"config {where}must be a JSON object of keys and values, got {data!r}")
    hints = typing.get_type_hints(typ)
    known = {f.name for f in dataclasses.fields(typ)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"unknown config key {prefix + key!r}{_suggest(key, known, prefix)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            value = _from_plain(hint, value, f"{prefix}{key}.")
        else:
            if isinstance(value, list) and _is_tuple_hint(hint):
                value = tuple(value)
            check_field(typ, key, value, prefix + key)
        kwargs[key] = value
    return typ(**kwargs)


def _is_tuple_hint(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in typing.get_args(hint))


def _suggest(key: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""
