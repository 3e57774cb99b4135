"""The typed config of a training run; a recipe is a named, complete ``TrainConfig``."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pickaxe.algos.dqn import DQNConfig
from pickaxe.algos.ppo import PPOConfig
from pickaxe.errors import ConfigError
from pickaxe.train.trainer import TrainerConfig


@dataclass
class EnvConfig:
    """Which environment and how many copies."""

    id: str = "CartPole-v1"
    num_envs: int = 8
    vectorization: Literal["sync", "async"] = "sync"
    """sync: step copies in this process (cheap envs); async: one subprocess per copy (expensive envs)."""
    eval_envs: int = 10


@dataclass
class ModelConfig:
    """Network shape."""

    hidden: tuple[int, ...] = (64, 64)
    activation: Literal["tanh", "relu", "elu", "gelu"] = "tanh"


@dataclass
class CollectorConfig:
    """Collection settings."""

    steps: int = 2048
    """Env steps per collect, all envs together (a multiple of env.num_envs)."""


class RunConfig:
    """What every run config shares: JSON round trip with its ``kind`` and the name of its algorithm.

    Subclasses (dataclasses with an ``algo`` field) set ``KIND`` (the ``"kind"`` in ``config.json``) and
    ``ALGOS`` (algorithm name -> algorithm config type).
    """

    KIND: ClassVar[str]
    ALGOS: ClassVar[dict[str, type]]

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
        data = dict(data)
        data.pop("kind", None)
        name = data.pop("algo_name", None)
        if name not in cls.ALGOS:
            raise ConfigError(f"config names algorithm {name!r}; known: {sorted(cls.ALGOS)}")
        cfg = _from_plain(cls, {k: v for k, v in data.items() if k != "algo"}, "")
        cfg.algo = _from_plain(cls.ALGOS[name], data.get("algo", {}), "algo.")
        return cfg


@dataclass
class TrainConfig(RunConfig):
    """Everything that decides a run's numbers."""

    KIND: ClassVar[str] = "classic"
    ALGOS: ClassVar[dict[str, type]] = {"ppo": PPOConfig, "dqn": DQNConfig}

    algo: Any = field(default_factory=PPOConfig)
    """The algorithm's config; its type picks the algorithm (PPOConfig, DQNConfig)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 0
    device: str = "auto"
    """auto (CUDA when available), cpu, cuda or cuda:N."""
    torch_threads: int = 1
    """Torch intra-op threads; 1 is fastest for small models on shared CPUs."""
    recipe: str = "custom"

    def check(self) -> None:
        """Fail fast, before a run directory exists: the env id is registered and the device exists."""
        from pickaxe.envs.make import check_env_id
        from pickaxe.utils import resolve_device

        check_env_id(self.env.id)
        resolve_device(self.device)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    return obj


def _from_plain(typ: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(typ)
    known = {f.name for f in dataclasses.fields(typ)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"unknown config key {prefix + key!r}{_suggest(key, known, prefix)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = _from_plain(hint, value, f"{prefix}{key}.")
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return typ(**kwargs)


def _suggest(key: str, choices: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""
