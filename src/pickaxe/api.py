"""pickaxe from Python: ``pickaxe.load`` a run's policy and act or generate with it, ``pickaxe.train`` a recipe or a
config with overrides (checked exactly as ``pickaxe train`` checks its flags), ``pickaxe.resume`` a run.

::

    import pickaxe as px

    run = px.train("cartpole-ppo", run_dir="runs/ppo", seed=2, algo={"lr": 3e-4})
    policy = px.load("runs/ppo", checkpoint="best")
    action = policy.act(obs)                          # one observation, or a batch
    episodes = policy.play(gym.make("CartPole-v1"), episodes=5)

LLM runs take the user's data, reward and model the same way: ``px.train(LLMTrainConfig(...) or a recipe,
rewards={"score": fn}, **{"data.path": "prompts.jsonl", "model.path": "my-model"})``; a Python reward is recorded
by name in ``config.json`` (``data.python_rewards``) and a resume in another process passes it again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pickaxe.errors import ConfigError, PickaxeError

__all__ = ["TrainedRun", "load", "resume", "train"]


def run_config(run_dir: str | Path) -> Any:
    """The config of the run in ``run_dir`` (its ``config.json``); a missing folder, a folder that holds no pickaxe
    run and an unreadable or foreign ``config.json`` are each one ``PickaxeError`` line. Torch-free."""
    from pickaxe.recipes.args import load_run_config

    path = Path(run_dir)
    if not path.exists():
        raise PickaxeError(f"{path} does not exist; pass the folder of a pickaxe run (`pickaxe runs` lists them)")
    if not path.is_dir():
        raise PickaxeError(f"{path} is a file; pass the folder of a pickaxe run (`pickaxe runs` lists them)")
    if not (path / "config.json").is_file():
        raise PickaxeError(f"{path} is not a pickaxe run folder: it has no config.json (`pickaxe runs` lists runs)")
    try:
        return load_run_config(path)
    except PickaxeError as e:
        raise PickaxeError(f"{path} is not a pickaxe run folder: {e}") from None


def load(run_dir: str | Path, checkpoint: str | int = "best", device: str = "cpu") -> Any:
    """A run's policy, ready to act, from its folder.

    ``checkpoint``: ``"best"`` (the step the run's ``selection.json`` names, as ``pickaxe eval --checkpoint best``
    picks it), ``"final"`` (``model.safetensors``), ``"latest"`` (the newest good checkpoint) or an env step (a kept
    checkpoint, or the policy kept at that step's evaluation). The weights are verified against their recorded
    sizes and sha256 digests before they load.

    A classic run gives a :class:`~pickaxe.train.acting.ClassicPolicy`: ``act(obs, deterministic=True)`` on one
    observation or a batch (observation normalisation and flattening applied as in training), ``play(env,
    episodes)`` in a gymnasium env, ``evaluate()`` in the run's own eval envs. A multi-agent run (IPPO, MAPPO,
    independent DQN) gives a :class:`~pickaxe.train.multiagent_acting.MultiAgentPolicy`: ``act(obs_dict)`` for every
    agent of a PettingZoo parallel env's observations, ``play(env, episodes)``, ``evaluate()``; the team's and each
    agent's returns. An LLM run gives a
    :class:`~pickaxe.train.generate.RunPolicy`: ``generate(prompts)`` (greedy by default, the prompts rendered as
    training rendered them). A missing or foreign folder, an unknown checkpoint name, a checkpoint the run does not
    have and damaged weights are each one ``PickaxeError`` line.
    """
    cfg = run_config(run_dir)
    from pickaxe.runs.model import checkpoint_choice

    which = checkpoint_choice(checkpoint)  # a bad name is one line before torch is imported
    if cfg.KIND == "classic":
        from pickaxe.algos.multiagent_configs import is_multiagent

        if is_multiagent(cfg.algo):
            from pickaxe.train.multiagent_acting import MultiAgentPolicy

            return MultiAgentPolicy.load(run_dir, cfg, which, device)
        from pickaxe.train.acting import ClassicPolicy

        return ClassicPolicy.load(run_dir, cfg, which, device)
    from pickaxe.train.generate import load_run_policy

    try:
        return load_run_policy(run_dir, which, device)
    except FileNotFoundError as e:
        raise PickaxeError(str(e)) from None


@dataclass
class TrainedRun:
    """A run folder after training: its ``path``, ``config``, env ``steps``, the ``final`` evaluation (the last
    record's ``eval/`` metrics, with its ``step``), the ``best`` step by the run's selection rule (``selection.json``:
    ``step``, ``metric``, ``mean``, ``low``, ``high``, ``reason``) and the ``history`` of this call's records."""

    path: Path
    config: Any = field(repr=False)
    steps: int = 0
    final: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def eval_return(self) -> float | None:
        """The final evaluation's mean return (LLM runs: held-out mean reward; reward models: pair accuracy)."""
        return self.final.get("eval/return_mean") if self.final else None

    def load(self, checkpoint: str | int = "best", device: str = "cpu") -> Any:
        """:func:`load` of this run."""
        return load(self.path, checkpoint, device)

    @classmethod
    def read(cls, run_dir: str | Path, history: list[dict[str, Any]] | None = None) -> TrainedRun:
        """The run in ``run_dir`` as its files record it."""
        from pickaxe.runs.tracking import read_metrics

        path = Path(run_dir)
        records = read_metrics(path) if (path / "metrics.jsonl").is_file() else []
        evals = [r for r in records if any(k.startswith("eval/") for k in r)]
        final = {k: v for k, v in evals[-1].items() if k == "step" or k.startswith("eval/")} if evals else None
        try:
            best = json.loads((path / "selection.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            best = None
        steps = max((int(r.get("step", 0)) for r in records), default=0)
        return cls(path, run_config(path), steps, final, best if isinstance(best, dict) else None, history or [])


Reward = Callable[..., Any]
RewardsArg = Reward | Sequence[Reward] | Mapping[str, Reward] | None


def _named_rewards(rewards: RewardsArg) -> dict[str, Reward]:
    """``rewards`` as name -> reward: a mapping as it is, a function (or a list of them) by its ``__name__``."""
    if rewards is None:
        return {}
    if isinstance(rewards, Mapping):
        return dict(rewards)
    items = [rewards] if callable(rewards) or hasattr(rewards, "batch") else list(rewards)
    out: dict[str, Reward] = {}
    for fn in items:
        name = getattr(fn, "__name__", type(fn).__name__)
        if name == "<lambda>" or name in out:
            raise ConfigError(
                f"rewards: name each reward ({'a lambda has no name' if name == '<lambda>' else f'{name!r} twice'}): "
                "pass a dict, rewards={'my_score': fn}"
            )
        out[name] = fn
    return out


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 1}, "trainer.total_steps": 2, "seed__x": 3}`` -> dotted keys; ``env.kwargs`` stays a dict."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        dotted = prefix + str(key).replace("__", ".")
        if isinstance(value, Mapping) and dotted != "env.kwargs":
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _flag_words(key: str, value: Any) -> list[str]:
    """One override as the command line's words: ``--key VALUE...``."""
    if isinstance(value, Mapping):
        return [f"--{key}", json.dumps(value)]
    if isinstance(value, tuple | list):
        return [f"--{key}", *(str(v) for v in value)]
    if isinstance(value, bool) or value is None:
        return [f"--{key}", str(value)]
    if isinstance(value, Path):
        return [f"--{key}", str(value)]
    return [f"--{key}", json.dumps(value) if key.startswith("env.kwargs.") else str(value)]


def _named_tools(tools: Any) -> dict[str, Any]:
    """``tools`` (a tool, a list of them or a dict name -> tool) as name -> tool, each checked to be a tool."""
    from pickaxe.envs.agents.tools import check_tool

    if tools is None:
        return {}
    items = list(tools.values()) if isinstance(tools, Mapping) else [tools] if callable(tools) else list(tools)
    out: dict[str, Any] = {}
    for tool in items:
        try:
            name = check_tool(tool)
        except ValueError as e:
            raise ConfigError(f"tools: {e}") from None
        if name in out:
            raise ConfigError(f"tools: two tools are named {name!r}; give each tool a distinct name")
        out[name] = tool
    return out


def configure(recipe_or_config: Any, rewards: RewardsArg = None, tools: Any = None, **overrides: Any) -> Any:
    """The config :func:`train` would train: a recipe's name or a config (copied, not changed) with ``overrides``
    applied and checked as ``pickaxe train``'s flags are (an unknown key with the closest one, a wrong type, a value
    outside its range: one ``ConfigError`` line), and ``rewards`` recorded (see :func:`train`). Torch-free; the
    checks that need the env registry or input files run in :func:`train` (``cfg.check()``)."""
    from pickaxe.recipes import get_recipe
    from pickaxe.recipes.args import parse_config

    if isinstance(recipe_or_config, str):
        base, prog = get_recipe(recipe_or_config), f"pickaxe train {recipe_or_config}"
    elif hasattr(recipe_or_config, "to_dict") and hasattr(recipe_or_config, "KIND"):
        base, prog = copy.deepcopy(recipe_or_config), f"pickaxe.train({recipe_or_config.recipe})"
    else:
        raise ConfigError(
            f"pickaxe.train takes a recipe name (`pickaxe recipes`) or a run config (TrainConfig, LLMTrainConfig), "
            f"got {type(recipe_or_config).__name__}"
        )
    flat = _flatten(overrides)
    named = _named_rewards(rewards)
    own_tools = _named_tools(tools)
    if (named or own_tools) and base.KIND != "llm":
        raise ConfigError(f"{'rewards' if named else 'tools'}= is for LLM runs (a classic run's env is its own)")
    if own_tools:
        from pickaxe.supplied import object_record

        flat["agent.python_tools"] = tuple(object_record(n, t, "tool") for n, t in own_tools.items())
        if "agent.tools" not in flat:  # the recipe's tools and these
            flat["agent.tools"] = (*[t for t in base.agent.tools if t not in own_tools], *own_tools)
    if named:
        from pickaxe.envs.text.rewards import python_reward_record

        records = [python_reward_record(n, fn) for n, fn in named.items()]
        flat["data.python_rewards"] = tuple(records)
        gold = str(flat.get("data.gold") or "")
        if "data.reward" not in flat and not any(n in gold for n in named):
            flat["data.reward"] = "+".join(named)  # the training reward, weight 1 each
    args = [w for key, value in flat.items() for w in _flag_words(key, value)]
    cfg, options = parse_config(base, args, prog)
    if options.max_restarts is not None:
        raise ConfigError("max_restarts supervises the command line's process; from Python, call pickaxe.resume")
    unused = {k: getattr(options, k) for k in ("run_dir", "overwrite", "no_progress", "track", "prometheus_port")}
    if any(unused.values()):
        name = next(k for k, v in unused.items() if v)
        raise ConfigError(f"pass {name} as pickaxe.train's own argument, not as an override")
    return cfg


def train(
    recipe_or_config: Any,
    /,
    run_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    progress: bool = False,
    rewards: RewardsArg = None,
    tools: Any = None,
    track: tuple[str, ...] = (),
    **overrides: Any,
) -> TrainedRun:
    """Train a recipe (``"cartpole-ppo"``) or a config (``TrainConfig``, ``LLMTrainConfig``) with ``overrides`` into
    ``run_dir`` (default ``runs/<recipe>-<time>``), exactly as ``pickaxe train`` does, and return the run.

    ``overrides`` are config keys as the command line names them: ``seed=2``, a section as a dict
    (``algo={"lr": 3e-4}``) or dotted keys (``**{"algo.lr": 3e-4}``; ``algo__lr=3e-4`` too), checked as the flags are.
    ``rewards`` (LLM runs): Python reward functions ``fn(prompt, completion, metadata) -> float`` (or objects with
    ``batch(prompts, completions, metadatas)``), a dict name -> function or a list named by ``__name__``; they are the
    training reward (weight 1 each) unless ``data.reward`` or ``data.gold`` names them (``"exact+0.5*score"``).
    ``tools`` (LLM agent runs): the user's own tools (see ``pickaxe.envs.agents.tools.Tool``: ``name``,
    ``description``, a JSON-schema ``parameters`` and ``__call__(arguments) -> ToolResult``), a list or a dict, added
    to ``agent.tools`` unless it is given. ``config.json`` records each Python object as NAME=MODULE:QUALNAME:
    :func:`resume` in another process passes them again. A
    folder that already holds a run is refused unless ``overwrite`` (which moves it aside); ``progress`` shows the
    live view; ``track`` also sends metrics to ``wandb`` / ``mlflow``.
    """
    cfg = configure(recipe_or_config, rewards, tools, **overrides)
    from pickaxe.recipes.datasets import ensure_dataset
    from pickaxe.train.build import train as train_run

    with _supplying(rewards, tools):  # the checks find the Python rewards and tools by name
        cfg.check()  # before a dataset is made for it
        ensure_dataset(cfg)  # an offline recipe given no dataset: its --data.make one, made once and cached
        result, run = train_run(cfg, run_dir=run_dir, progress=progress, track=tuple(track), overwrite=overwrite)
    return TrainedRun.read(run.path, result.history)


@contextmanager
def _supplying(rewards: RewardsArg, tools: Any) -> Iterator[None]:
    """The Python rewards and tools passed to :func:`train` or :func:`resume`, found by name while a run builds."""
    from pickaxe.supplied import supplied

    with supplied("reward", _named_rewards(rewards)), supplied("tool", _named_tools(tools)):
        yield


def resume(run_dir: str | Path, *, progress: bool = False, rewards: RewardsArg = None, tools: Any = None) -> TrainedRun:
    """Continue the run in ``run_dir`` from its newest good checkpoint to its original budget (``pickaxe resume``),
    bit for bit as if it had never stopped, and return it. ``rewards`` and ``tools``: the Python rewards and tools
    the run was trained with (by the names it recorded), unless their modules are importable; a missing one is one
    ``ConfigError`` line naming it, before anything is built."""
    run_config(run_dir)  # a missing or foreign folder: one line
    with _supplying(rewards, tools):
        from pickaxe.train.build import resume as resume_run

        result, run = resume_run(run_dir, progress=progress)
    return TrainedRun.read(run.path, result.history)
