"""Launching data-parallel learners for a run (``--dist.learners N``, or ``torchrun --nproc-per-node N``).

Rank 0 is the run's ordinary Trainer: it collects, evaluates, logs, writes the run folder and its checkpoints.
Its algorithm is linked to the other learners (:class:`Leader`): the state it starts from or loads (a resume, a
rollback after a non-finite step) is sent to them, and each ``update`` first sends the batch, the algorithm's
config (live changes included), its schedule position and the torch RNG state (classic PPO shuffles with it), so
every learner runs the same ``update`` in lockstep and computes its share of it (``pickaxe.dist.data_parallel``).
The other learners (:func:`follow`) only update: they write nothing. Messages go over a gloo group; gradients
over the default group (gloo on CPU, NCCL on CUDA, one GPU per learner).

Without torchrun, rank 0 (the ``pickaxe train`` process) starts the others itself (multiprocessing, spawn), each
building the same algorithm from the run's config; they exit when rank 0 stops them, and die with it.

With ``--dist.shard fsdp`` every learner shards its algorithm (``algo.shard``, FSDP2) once it holds rank 0's
state, so each keeps 1/N of the weights, gradients and optimizer state (rank 0 also keeps the unsharded policy its
rollout engine, evaluation and export read, refreshed after every update). The other learners build their models on
the ``meta`` device (``pickaxe.train.llm.builds_on_meta``): the start-up state skips those tensors, and sharding
scatters rank 0's rows into their shards, so they never hold a whole model. A checkpoint is then written by every
learner: rank 0's ``CheckpointManager`` calls the Leader's ``write_shards`` with the checkpoint's temporary folder,
the others write their shard files there and send back their digests for the manifest, and resuming reads each
learner's rows of every sharded tensor (any learner count: the rows are cut from the saved files). A frozen reference
the algorithm keeps (DPO's; the KL reference of GRPO and LLM PPO) is sharded too: rank 0's evaluation scores it
through the Leader's ``score_reference``, which has every learner score its share of the rows. So is the run's
reward model (the algorithm's ``reward_scorer``): rank 0's collector and evaluation score through ``score_rewards``.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from pickaxe.dist import data_parallel
from pickaxe.errors import ConfigError, NonFiniteError, PickaxeError, error_line

_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")

T = TypeVar("T")


def torchrun_world() -> int:
    """``WORLD_SIZE`` of a torchrun launch (1 when not under torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def learners_wanted(cfg: Any) -> int:
    """How many learners a run config asks for (``dist.learners``; 1 for a config without a ``dist`` section).
    Under torchrun the process count must agree with it (one line naming both otherwise)."""
    learners = int(getattr(getattr(cfg, "dist", None), "learners", 1))
    world = torchrun_world()
    if world > 1 and world != learners:
        raise ConfigError(
            f"torchrun started {world} processes but --dist.learners is {learners}: pass --dist.learners {world}"
        )
    return learners


_FOLLOWING: list[bool] = []  # set in a learner rank 0 started, before it builds its Trainer


def is_follower() -> bool:
    """Whether this process is a learner other than rank 0 (a torchrun rank > 0, or a learner rank 0 started): it
    must not create or open a run folder, and it never collects, so it builds no frozen models to collect with."""
    return bool(_FOLLOWING) or (torchrun_world() > 1 and int(os.environ.get("RANK", "0")) > 0)


def check_algorithm(algo: Any, learners: int) -> None:
    """Refuse, in one line, an algorithm that does not split its update among learners."""
    if not getattr(algo, "supports_data_parallel", False):
        raise ConfigError(
            f"--dist.learners {learners}: {type(algo).__name__} does not split its update among data-parallel "
            "learners (GRPO, PPO, SFT and LLM PPO do); use --dist.learners 1"
        )


def _device_of(cfg: Any) -> torch.device:
    """The device a run's config (or its ``to_dict``) names."""
    from pickaxe.utils import resolve_device

    device = cfg.get("device", "cpu") if isinstance(cfg, dict) else getattr(cfg, "device", "cpu")
    return resolve_device(device)


def _check_devices(cfg: Any, learners: int) -> None:
    """One GPU per learner on CUDA: ``device`` must be ``cuda`` or ``auto`` (learner i uses GPU i), with enough
    GPUs (torchrun across machines: per machine)."""
    device = _device_of(cfg)
    if device.type != "cuda":
        return
    if device.index is not None:
        raise ConfigError(
            f"--dist.learners {learners} puts learner i on GPU i: use --device cuda, not --device {device}"
        )
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", learners))
    if torch.cuda.device_count() < per_node:
        raise ConfigError(
            f"--dist.learners {learners} needs {per_node} GPUs on this machine (one per learner), torch sees "
            f"{torch.cuda.device_count()}: lower --dist.learners or use --device cpu"
        )


_TENSOR = "__pickaxe_tensor__"


def _split(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """``obj`` with every tensor replaced by ``(_TENSOR, index, shape, dtype)`` and appended to ``tensors``."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return (_TENSOR, len(tensors) - 1, tuple(obj.shape), str(obj.dtype).removeprefix("torch."))
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of :func:`_split`."""
    if isinstance(skeleton, tuple) and len(skeleton) == 4 and skeleton[0] == _TENSOR:
        return tensors[skeleton[1]]
    if isinstance(skeleton, dict):
        return {k: _join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        return type(skeleton)(_join(v, tensors) for v in skeleton)
    return skeleton


def _send_state(state: Any) -> None:
    """Send an algorithm's state to the other learners: its structure in one message, then each tensor by itself
    over the gloo group (a tensor's bytes are never pickled, and never the whole state at once). Tensors every
    other learner holds on the ``meta`` device (the models a sharded learner built without memory, as the run
    starts: sharding gives them rank 0's rows) are not sent (:func:`_skipped`)."""
    tensors: list[torch.Tensor] = []
    _send(("load", _split(state, tensors)))
    group = data_parallel.control_group()
    skipped = _skipped(None)
    for i, t in enumerate(tensors):
        if i not in skipped:
            dist.broadcast(t.detach().cpu().contiguous(), src=0, group=group)


def _skipped(on_meta: list[int] | None) -> set[int]:
    """The indices of the state's tensors that every learner other than rank 0 holds on the ``meta`` device
    (``on_meta``: this learner's, None on rank 0), agreed by all (a collective over the gloo group)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, on_meta, group=data_parallel.control_group())
    others = [set(x or ()) for x in everyone[1:]]
    return set.intersection(*others) if others else set()


def _receive_state(algo: Any, skeleton: Any) -> Any:
    """A learner other than rank 0: the state :func:`_send_state` sends. Where this learner's own state has the
    same tensors (same structure, shapes and dtypes on the CPU: rank 0's state as the run starts), each is received
    into its own tensor in place, so loading it needs no second copy; otherwise into new tensors. Its own tensors
    on the ``meta`` device, when every other learner has them there too, stay as they are (not sent)."""
    own: list[torch.Tensor] = []
    same = _tensor_specs(_split(algo.state_dict(), own)) == _tensor_specs(skeleton)
    group = data_parallel.control_group()
    skipped = _skipped([i for i, t in enumerate(own) if t.is_meta] if same else [])
    received: list[torch.Tensor] = []
    for i, (_, shape, dtype) in enumerate(_tensor_specs(skeleton)):
        if i in skipped:
            received.append(own[i])
            continue
        if same and own[i].device.type == "cpu" and own[i].is_contiguous():
            target = own[i]
        else:
            target = torch.empty(shape, dtype=getattr(torch, dtype))
        dist.broadcast(target, src=0, group=group)
        received.append(target)
    return _join(skeleton, received)


def _tensor_specs(skeleton: Any) -> list[tuple[int, tuple[int, ...], str]]:
    """The ``(index, shape, dtype)`` of every tensor of a :func:`_split` skeleton, in index order."""
    found: list[tuple[int, tuple[int, ...], str]] = []

    def walk(x: Any) -> None:
        if isinstance(x, tuple) and len(x) == 4 and x[0] == _TENSOR:
            found.append((x[1], x[2], x[3]))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(skeleton)
    return sorted(found)


def _send(message: Any) -> None:
    dist.broadcast_object_list([message], src=0, group=data_parallel.control_group())


def _receive() -> Any:
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=data_parallel.control_group())
    return box[0]


def _set_config(algo: Any, config: Any) -> None:
    """Copy ``config``'s values (rank 0's, with its live changes) onto ``algo.config`` in place."""
    if dataclasses.is_dataclass(config):
        for field in dataclasses.fields(config):
            setattr(algo.config, field.name, getattr(config, field.name))


class Leader:
    """Rank 0's side: links ``algo`` (the run's algorithm) to the other learners by wrapping its ``update``,
    ``load_state_dict`` and ``set_progress`` on the instance (its type, and so its checkpoints, are unchanged).
    Sends the algorithm's current state at once, so every learner starts from rank 0's weights."""

    def __init__(self, algo: Any, processes: list[Any] | None = None, shard: str | None = None) -> None:
        self.algo = algo
        self.processes = processes or []
        self.progress: tuple[int, int] | None = None
        self.busy = False  # inside an update: the other learners may be waiting in one of its collectives
        self._update, self._load, self._set_progress = algo.update, algo.load_state_dict, algo.set_progress
        algo.update, algo.load_state_dict, algo.set_progress = self.update, self.load_state_dict, self.set_progress
        _send_state(algo.state_dict())
        if shard is not None:  # every learner now holds rank 0's state: shard it on all of them together
            self._lead(("shard", shard), lambda: algo.shard(shard))
            if getattr(algo, "reference_sharded", False):  # a sharded reference: every learner scores with it
                self._score = algo.score_reference
                algo.score_reference = self.score_reference
            scorer = getattr(algo, "reward_scorer", None)
            if getattr(scorer, "sharded", False):  # a sharded reward model: every learner scores with it too
                self._reward = scorer.score_tokens
                scorer.score_tokens = self.score_rewards

    def write_shards(self, folder: Path) -> dict[str, dict[str, Any]]:
        """A sharded checkpoint's other files: every other learner writes its shards of the algorithm's state into
        ``folder`` (the checkpoint's temporary folder); returns their manifest entries. Rank 0's
        ``CheckpointManager`` calls it (``shard_writer``) after writing its own files, before the manifest."""
        _send(("write", str(folder)))
        self.busy = True
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.gather_object({}, gathered, dst=0, group=data_parallel.control_group())
        self.busy = False
        entries: dict[str, dict[str, Any]] = {}
        for rank, got in enumerate(gathered[1:], start=1):
            if isinstance(got, str):
                raise PickaxeError(f"data-parallel learner {rank} could not write its checkpoint shards: {got}")
            entries.update(got)
        return entries

    def start_shards(self, folder: Path) -> Callable[[], dict[str, dict[str, Any]]]:
        """A background checkpoint's other files (``shard_starter`` of rank 0's ``CheckpointManager``): asks every
        other learner to copy its shards to host memory and write them into ``folder`` in the background (they do
        it before their next update); returns the wait for their manifest entries, which rank 0's writing thread
        calls. A learner this process started that dies meanwhile fails the save instead of hanging it."""
        from pickaxe.runs.checkpoint import wait_rank_shards

        _send(("write_async", str(folder)))
        processes = list(self.processes)
        world = dist.get_world_size()

        def alive() -> bool:
            return all(p.is_alive() for p in processes)

        return lambda: wait_rank_shards(folder, range(1, world), alive)

    def set_progress(self, step: int, total_steps: int) -> None:
        """The algorithm's ``set_progress``; remembered, and sent with the next update."""
        self.progress = (step, total_steps)
        self._set_progress(step, total_steps)

    def update(self, batch: Any) -> dict[str, float]:
        """Send the batch (and config, schedule position, RNG state) to the learners, then update with them."""
        _send(("update", batch.to("cpu"), copy.deepcopy(self.algo.config), self.progress, torch.get_rng_state()))
        self.busy = True
        try:
            metrics = self._update(batch)
        except NonFiniteError:  # refused on every learner alike, after the step's collective: they wait for more
            self.busy = False
            raise
        self.busy = False
        return metrics

    def score_reference(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """The algorithm's ``score_reference`` outside an update (rank 0's evaluation: ``eval/kl``, DPO's held-out
        pairs) with its reference sharded: the tokens are sent to the other learners, which score their share of
        the rows with their shards of it."""
        tensors = tuple(t.detach().to("cpu") for t in (input_ids, attention_mask, loss_mask))
        return self._lead(("score", *tensors, float(temperature)),
                          lambda: self._score(input_ids, attention_mask, loss_mask, temperature))  # fmt: skip

    def score_rewards(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The sharded reward model's ``score_tokens`` on rank 0 (its collector's rewards, its evaluation's): the
        rows are sent to the other learners, which score their share of them with their shards of it."""
        message = ("reward", input_ids.detach().to("cpu"), attention_mask.detach().to("cpu"))
        return self._lead(message, lambda: self._reward(input_ids, attention_mask))

    def _lead(self, message: tuple[Any, ...], call: Callable[[], T]) -> T:
        """Send ``message`` so the other learners join, then run rank 0's side of the collective (``busy`` while it
        runs: an error leaves it set, so ``close`` does not wait on learners that may be stuck in it)."""
        _send(message)
        self.busy = True
        out = call()
        self.busy = False
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state`` here and, once it loaded (a checkpoint that does not fit is refused first), on every
        learner."""
        self._load(state)
        _send_state(state)

    def close(self) -> None:
        """Stop the other learners and leave the group. After an error in the middle of an update they may wait in
        a collective that never comes: the ones this process started are terminated instead (under torchrun, rank
        0's non-zero exit ends them)."""
        if not self.busy:
            with contextlib.suppress(Exception):
                _send(("stop",))
        for p in self.processes:
            if self.busy:
                p.terminate()
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        for name in ("update", "load_state_dict", "set_progress", "score_reference"):  # the class's methods again
            vars(self.algo).pop(name, None)
        scorer = getattr(self.algo, "reward_scorer", None)
        if scorer is not None:  # its own method again too
            vars(scorer).pop("score_tokens", None)
        data_parallel.shutdown()


def follow(algo: Any) -> int:
    """A learner other than rank 0: apply what rank 0 sends (state to load, batches to update on, in lockstep)
    until it says stop; returns the number of updates. A non-finite step is refused on every learner alike (rank
    0's Trainer decides what follows: it rolls back, which sends the checkpoint's state here, or stops)."""
    updates = 0
    writing: Any = None  # the thread writing this learner's shards of a background checkpoint
    while True:
        message = _receive()
        kind = message[0]
        if kind == "stop":
            if writing is not None:
                writing.join()
            return updates
        if kind == "load":
            algo.load_state_dict(_receive_state(algo, message[1]))
            continue
        if kind == "shard":
            algo.shard(message[1])
            continue
        if kind == "write":
            _write_shards(algo, Path(message[1]))
            continue
        if kind == "score":  # rank 0 evaluates with the sharded reference: this learner's share of the rows
            algo.score_reference(*message[1:])
            continue
        if kind == "reward":  # rank 0 scores completions with the sharded reward model: this learner's share
            algo.reward_scorer.score_tokens(*message[1:])
            continue
        if kind == "write_async":
            from pickaxe.runs.checkpoint import start_rank_shards

            writing = start_rank_shards(Path(message[1]), {"algo": algo.state_dict()}, dist.get_rank())
            continue
        _, batch, config, progress, rng = message
        _set_config(algo, config)
        if progress is not None:
            algo.set_progress(*progress)
        torch.set_rng_state(rng)
        with contextlib.suppress(NonFiniteError), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rank 0 gives the same warnings (on-policy checks) once
            algo.update(batch)
        updates += 1


def _write_shards(algo: Any, folder: Path) -> None:
    """A learner other than rank 0: write its shards of the algorithm's state into the checkpoint folder rank 0 is
    writing, and send rank 0 their manifest entries (or, if writing failed, the error in one line)."""
    from pickaxe.runs.checkpoint import write_rank_shards

    try:
        entries: Any = write_rank_shards(folder, {"algo": algo.state_dict()}, dist.get_rank())
    except Exception as e:  # rank 0 names it and fails the save; this learner goes on following
        entries = error_line(e)
    dist.gather_object(entries, None, dst=0, group=data_parallel.control_group())


def check_sharding(algo: Any, cfg: Any) -> str | None:
    """The offload mode to shard ``algo`` with (``--dist.shard fsdp``), None without sharding; an algorithm that
    cannot be sharded is refused in one line."""
    dist_cfg = getattr(cfg, "dist", None)
    if getattr(dist_cfg, "shard", "none") == "none":
        return None
    if not getattr(algo, "supports_sharding", False):
        raise ConfigError(
            f"--dist.shard {dist_cfg.shard}: {type(algo).__name__} cannot shard its models (SFT, GRPO, LLM PPO, "
            "the reward model and DPO can); drop --dist.shard"
        )
    return str(dist_cfg.offload)


def follower_config(cfg: Any) -> Any:
    """The run's config as a learner other than rank 0 builds it: rollouts in its own process (no Ray workers; it
    never collects), no evaluation before training (it never evaluates), no SFT warm start (rank 0 sends the
    warm-started weights with the rest of its state before the first update) and its frozen reference on the host
    (only rank 0's collector scores with it)."""
    cfg = copy.deepcopy(cfg)
    if hasattr(getattr(cfg, "warm_start", None), "updates"):
        cfg.warm_start.updates = 0
    dist_cfg = getattr(cfg, "dist", None)
    if dist_cfg is not None:
        dist_cfg.placement, dist_cfg.workers, dist_cfg.mode, dist_cfg.address = "colocated", 1, "sync", None
    if hasattr(getattr(cfg, "eval", None), "before"):
        cfg.eval.before = False
    if hasattr(getattr(cfg, "collector", None), "offload_reference"):
        cfg.collector.offload_reference = True  # it never collects: its copy of the frozen reference waits on the host
    return cfg


Build = Callable[[dict[str, Any]], Any]
"""Builds a follower's Trainer (no run folder; see ``follower_config``) from a run's config as ``to_dict`` gives it.
The training layer passes it in (``pickaxe.train.build.build_follower``); it must pickle, for spawned learners."""


def _build_algorithm(config: dict[str, Any], build: Build) -> tuple[Any, Any]:
    """(algorithm, trainer) of ``config`` built without a run folder, as rank 0 builds its own."""
    trainer = build(config)
    return trainer.algo, trainer


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the process that started it dies (a SIGKILLed rank 0 leaves no learner
    waiting in a collective)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawned_learner(rank: int, config: dict[str, Any], world: int, port: int, built: Any, build: Build) -> None:
    """Entry point of a learner started by rank 0 (multiprocessing, spawn). Puts ``(rank, None)`` on ``built``
    once its algorithm is built, or ``(rank, error)`` if building failed, before joining the group."""
    _die_with_parent()
    _FOLLOWING.append(True)
    device = _device_of(config)
    try:
        if device.type == "cuda":
            torch.cuda.set_device(rank)
        algo, trainer = _build_algorithm(config, build)
    except BaseException as e:
        built.put((rank, error_line(e)))
        raise
    built.put((rank, None))
    data_parallel.init(rank, world, port=port, device=device)
    try:
        follow(algo)
    finally:
        data_parallel.shutdown()
        trainer.close()


def launch(cfg: Any, algo: Any, build: Build, checkpoints: Any = None) -> Leader | None:
    """Rank 0's side of a run with ``dist.learners`` > 1 (None for one learner): start the other learners (or,
    under torchrun, join them), each building its algorithm with ``build``, and link ``algo`` to them. Call after
    building rank 0's Trainer; ``close()`` the returned ``Leader`` when training ends. With ``--dist.shard fsdp``,
    ``checkpoints`` (the Trainer's ``CheckpointManager``) gets the other learners' shard writer and reads sharded
    checkpoints lazily (each learner its own rows)."""
    learners = learners_wanted(cfg)
    if learners <= 1:
        return None
    check_algorithm(algo, learners)
    shard = check_sharding(algo, cfg)
    _check_devices(cfg, learners)
    device = _device_of(cfg)
    if torchrun_world() > 1:
        data_parallel.init_from_env(device)
        return _link(Leader(algo, shard=shard), checkpoints, shard is not None)
    import torch.multiprocessing as mp

    port = data_parallel.free_port()
    context = mp.get_context("spawn")
    built = context.Queue()
    processes = []
    for rank in range(1, learners):
        args = (rank, cfg.to_dict(), learners, port, built, build)
        p = context.Process(target=_spawned_learner, args=args, daemon=True)
        p.start()
        processes.append(p)
    try:
        _wait_until_built(processes, built)
        data_parallel.init(0, learners, port=port, device=device)
        return _link(Leader(algo, processes, shard), checkpoints, shard is not None)
    except BaseException:
        for p in processes:
            p.terminate()
        raise


def _link(leader: Leader, checkpoints: Any, sharded: bool) -> Leader:
    """With a sharded algorithm, let rank 0's checkpoints be written by every learner and read lazily."""
    if checkpoints is not None and sharded:
        checkpoints.shard_writer = leader.write_shards
        checkpoints.shard_starter = leader.start_shards
        checkpoints.lazy_shards = True
    return leader


def _wait_until_built(processes: list[Any], built: Any) -> None:
    """Wait until every started learner has built its algorithm; a learner that failed (or died) is a one-line
    ``PickaxeError`` here, instead of rank 0 waiting for it in the group's rendezvous."""
    import queue

    waiting = set(range(1, len(processes) + 1))
    while waiting:
        try:
            rank, error = built.get(timeout=1.0)
        except queue.Empty:
            dead = [r for r in waiting if not processes[r - 1].is_alive()]
            if dead:
                code = processes[dead[0] - 1].exitcode
                raise PickaxeError(f"data-parallel learner {dead[0]} exited (status {code}) while building") from None
            continue
        if error is not None:
            raise PickaxeError(f"data-parallel learner {rank} could not build the run's algorithm: {error}")
        waiting.discard(rank)


def follow_run(cfg: Any, build: Build) -> int:
    """A torchrun learner other than rank 0: build the run's algorithm with ``build``, join the group and follow
    rank 0 until it stops; returns the number of updates. It writes nothing (rank 0 writes the run folder)."""
    learners = learners_wanted(cfg)
    _check_devices(cfg, learners)
    device = _device_of(cfg)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    algo, trainer = _build_algorithm(cfg.to_dict(), build)
    check_algorithm(algo, learners)
    check_sharding(algo, cfg)
    data_parallel.init_from_env(device)
    try:
        return follow(algo)
    finally:
        data_parallel.shutdown()
        trainer.close()
