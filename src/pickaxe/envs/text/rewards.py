"""Reward functions for prompt environments: ``fn(prompt, completion, metadata) -> float``.

``metadata`` is the example's metadata with its reference answer under ``"answer"``. A ``PromptEnv`` sums several
functions with weights. A reward may also score a batch at a time (:class:`BatchReward`, e.g. a reward model).

:func:`parse_reward_spec` reads a command-line reward spec (``exact+0.5*mypkg.rewards:score``) into weighted
terms; :func:`score_rewards` scores a batch with every term, collecting failures (an exception or a non-finite
value) per sample instead of raising, so one bad sample does not take the batch down.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pickaxe.errors import ConfigError, PickaxeError
from pickaxe.supplied import object_record, resolve, supplied

RewardFn = Callable[[str, str, dict[str, Any]], float]
"""``(prompt, completion, metadata) -> reward``."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def exact_match(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """1 when the completion, stripped of surrounding whitespace, equals the reference answer; else 0."""
    return float(completion.strip() == str(metadata["answer"]).strip())


def numeric_match(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
    """1 when the first number in the completion equals the reference answer as a number; else 0."""
    found = _NUMBER.search(completion)
    if found is None:
        return 0.0
    try:
        return float(abs(float(found.group()) - float(metadata["answer"])) < 1e-9)
    except ValueError:
        return 0.0


def format_reward(pattern: str) -> RewardFn:
    """A reward of 1 when the whole stripped completion matches regex ``pattern`` (a format check)."""
    compiled = re.compile(pattern)

    def reward(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        return float(compiled.fullmatch(completion.strip()) is not None)

    reward.__name__ = f"format[{pattern}]"
    return reward


def length_penalty(max_chars: int) -> RewardFn:
    """``-1`` per ``max_chars`` characters beyond ``max_chars`` (0 within the budget): weight it to taste."""

    def reward(prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        return -max(0, len(completion) - max_chars) / max_chars

    reward.__name__ = f"length_penalty[{max_chars}]"
    return reward


REWARDS: dict[str, RewardFn] = {"exact": exact_match, "numeric": numeric_match}
"""Rewards a config can name by a short name (``--data.reward exact``); see :func:`parse_reward_spec` for more."""


def reward_name(fn: Reward) -> str:
    """A short name for metrics (``rollout/reward/<name>``)."""
    return getattr(fn, "__name__", type(fn).__name__)


# ---------------------------------------------------------------------------------------------- batched rewards


@runtime_checkable
class BatchReward(Protocol):
    """A reward scored a batch at a time (a reward model runs one forward pass over many completions).

    ``batch(prompts, completions, metadatas)`` returns one score per completion, in order (``completions[i]``
    answers ``prompts[i]``; ``metadatas[i]`` as a plain reward's ``metadata``). The collector calls it once per
    batch with every completion. An object may also be callable as ``fn(prompt, completion, metadata)``; one that
    is not is wrapped by :func:`as_reward` so that single scores go through ``batch`` with one completion.
    """

    def batch(
        self, prompts: Sequence[str], completions: Sequence[str], metadatas: Sequence[dict[str, Any]]
    ) -> Sequence[float]:
        """One score per completion."""
        ...


Reward = RewardFn | BatchReward
"""What ``PromptEnv`` accepts as a reward: a function, or an object with ``batch``."""


def is_batched(fn: Reward) -> bool:
    """True when ``fn`` scores a batch at a time (it has a callable ``batch`` attribute)."""
    return callable(getattr(fn, "batch", None))


class _BatchOnly:
    """A ``BatchReward`` without ``__call__``, made callable: one completion goes through ``batch``."""

    def __init__(self, inner: BatchReward) -> None:
        self.inner = inner
        self.__name__ = reward_name(inner)

    def __call__(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        return float(self.inner.batch([prompt], [completion], [metadata])[0])

    def batch(
        self, prompts: Sequence[str], completions: Sequence[str], metadatas: Sequence[dict[str, Any]]
    ) -> Sequence[float]:
        return self.inner.batch(prompts, completions, metadatas)


def as_reward(fn: Reward) -> RewardFn:
    """``fn`` as a callable ``fn(prompt, completion, metadata)``, keeping its ``batch`` when it has one."""
    if callable(fn):
        return fn
    if is_batched(fn):
        return _BatchOnly(fn)
    raise TypeError(
        f"{fn!r} is not a reward: pass a function fn(prompt, completion, metadata) -> float or an object with "
        "batch(prompts, completions, metadatas)"
    )


# ---------------------------------------------------------------------------------------------- failures


class RewardWarning(UserWarning):
    """A reward raised or returned a non-finite value for some completions of a batch (they were excluded)."""


class RewardFailedError(PickaxeError):
    """A reward failed where the run cannot go on: on every completion of a batch, or on a single scored sample."""


@dataclass(frozen=True)
class RewardFailure:
    """One reward that could not score one sample: ``error`` is ``"ValueError: ..."`` or ``"returned nan"``."""

    reward: str
    index: int
    prompt: str
    completion: str
    error: str
    exception: BaseException | None = None

    def describe(self, width: int = 80) -> str:
        """``prompt '...' completion '...': error``, prompt and completion cut to ``width`` characters."""
        return f"prompt {_clip(self.prompt, width)!r}, completion {_clip(self.completion, width)!r}: {self.error}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class RewardScores:
    """Rewards of a batch of completions (see :meth:`PromptEnv.score_batch`).

    ``parts[name][i]``: reward ``name`` of completion ``i``, unweighted, NaN where it failed. ``total[i]``: the
    weighted sum, NaN where a reward with a nonzero weight failed. ``valid[i]``: False exactly there (the sample
    must not be trained on). A weight-0 (metric-only) reward that fails leaves the sample valid.
    """

    total: list[float]
    parts: dict[str, list[float]]
    valid: list[bool]
    failures: list[RewardFailure] = field(default_factory=list)


def _finite(value: Any) -> tuple[float, str | None]:
    """``(float(value), None)``, or ``(nan, why)`` when it is not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan, f"returned {value!r}, not a number"
    if not math.isfinite(number):
        return math.nan, f"returned {number}"
    return number, None


def _score_one_reward(
    name: str,
    fn: Reward,
    prompts: Sequence[str],
    completions: Sequence[str],
    metadatas: Sequence[dict[str, Any]],
) -> tuple[list[float], list[RewardFailure]]:
    """One reward over a batch: values (NaN where it failed) and its failures. A batched reward that raises is
    retried one completion at a time, so the failure names the completion that caused it."""
    n = len(completions)
    raw: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n
    if is_batched(fn):
        try:
            out = list(fn.batch(prompts, completions, metadatas))  # type: ignore[union-attr]
        except Exception:
            out = None
        if out is not None:
            if len(out) != n:
                raise RewardFailedError(
                    f"reward {name!r} returned {len(out)} scores for {n} completions; its batch() must return one "
                    "score per completion, in order"
                )
            raw = out
        else:
            for i in range(n):
                try:
                    raw[i] = fn.batch([prompts[i]], [completions[i]], [metadatas[i]])[0]  # type: ignore[union-attr]
                except Exception as e:
                    errors[i] = e
    else:
        for i in range(n):
            try:
                raw[i] = fn(prompts[i], completions[i], metadatas[i])  # type: ignore[operator]
            except Exception as e:
                errors[i] = e
    values, failures = [], []
    for i in range(n):
        error = errors[i]
        if error is not None:
            values.append(math.nan)
            why = f"{type(error).__name__}: {error}"
        else:
            value, why = _finite(raw[i])
            values.append(value)
        if why is not None:
            failures.append(RewardFailure(name, i, prompts[i], completions[i], why, error))
    return values, failures


def score_rewards(
    rewards: Sequence[tuple[str, Reward, float]],
    prompts: Sequence[str],
    completions: Sequence[str],
    metadatas: Sequence[dict[str, Any]],
) -> RewardScores:
    """Score every completion with every ``(name, reward, weight)``: batched rewards once for the whole batch,
    plain ones sample by sample. Failures (an exception or a non-finite value) are collected, not raised."""
    if not len(prompts) == len(completions) == len(metadatas):
        raise ValueError(
            f"got {len(prompts)} prompts, {len(completions)} completions and {len(metadatas)} metadatas; "
            "pass one of each per sample"
        )
    n = len(completions)
    parts: dict[str, list[float]] = {}
    failures: list[RewardFailure] = []
    total = [0.0] * n
    valid = [True] * n
    for name, fn, weight in rewards:
        values, failed = _score_one_reward(name, fn, prompts, completions, metadatas)
        parts[name] = values
        failures.extend(failed)
        if weight == 0:  # metric-only: logged, never part of the training reward
            continue
        for i, value in enumerate(values):
            total[i] += weight * value
        for f in failed:
            valid[f.index] = False
    total = [t if ok else math.nan for t, ok in zip(total, valid, strict=True)]
    return RewardScores(total, parts, valid, failures)


# ---------------------------------------------------------------------------------------------- reward specs


class RewardSpecError(ConfigError):
    """A reward spec (``--data.reward``) that cannot be read or resolved; the message names the term and the fix."""


_WEIGHT = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_TERM = re.compile(rf"\s*(?:(?P<weight>{_WEIGHT})\s*\*\s*)?(?P<ref>[^+*\s]+)\s*")
_IMPORT_PATH = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_EXAMPLE = "e.g. 'exact' or 'exact+0.5*mypkg.rewards:score'"


def parse_reward_spec(spec: str, named: Mapping[str, Reward] | None = None) -> list[tuple[str, Reward, float]]:
    """Read a reward spec into ``(name, reward, weight)`` terms for ``PromptEnv(rewards=...)``.

    Grammar (whitespace around terms is ignored)::

        spec   := term ("+" term)*
        term   := [weight "*"] reward
        weight := a number: 2, 0.5, -0.1, 1e-3 (default 1; 0 = logged as a metric, not trained on)
        reward := NAME          a name in ``named`` (looked up first) or a built-in of ``REWARDS``: exact, numeric
                | MODULE:ATTR   an import path: MODULE is imported (the current directory is tried last),
                                ATTR (dotted for nested attributes) fetched from it

    Subtract with a negative weight: ``exact+-0.1*mypkg.rewards:length``. An import path may point at

    * a function ``fn(prompt, completion, metadata) -> float`` (or any callable object with that signature);
    * an object with ``batch(prompts, completions, metadatas) -> list[float]`` (a :class:`BatchReward`);
    * a class: it is instantiated with no arguments and the instance must be one of the above.

    A factory that takes arguments is not called: call it in your module (``score = length_penalty(200)``) and
    name the result. The name of a term (its metric ``rollout/reward/<name>``) is the NAME, or the import path with
    ``:`` written as ``.`` (``mypkg.rewards.score``). Raises :class:`RewardSpecError` (exit status 2 on the
    command line) naming the bad term and the fix.
    """
    named = dict(named or {})
    if not isinstance(spec, str) or not spec.strip():
        raise RewardSpecError(f"the reward spec is empty; name at least one reward, {_EXAMPLE}")
    terms: list[tuple[str, Reward, float]] = []
    pos = 0
    while True:
        match = _TERM.match(spec, pos)
        end = match.end() if match else pos
        if match is None or (end < len(spec) and spec[end] != "+"):
            rest = spec[pos:].split("+")[0].strip() or spec[pos:].strip()
            raise RewardSpecError(
                f"reward spec {spec!r}: cannot read the term {rest!r}; write terms as NAME or WEIGHT*NAME joined by "
                f"'+' ({_EXAMPLE}; subtract with a negative weight: 'exact+-0.1*mypkg.rewards:length')"
            )
        weight = float(match.group("weight")) if match.group("weight") else 1.0
        name, fn = _resolve(match.group("ref"), spec, named)
        if any(name == other for other, _, _ in terms):
            raise RewardSpecError(
                f"reward spec {spec!r} names {name!r} twice; merge them into one term with the summed weight"
            )
        terms.append((name, fn, weight))
        if end == len(spec):
            break
        pos = end + 1
        if not spec[pos:].strip():
            raise RewardSpecError(f"reward spec {spec!r} ends with '+'; remove it or add the reward after it")
    if all(w == 0 for _, _, w in terms):
        raise RewardSpecError(
            f"every reward of {spec!r} has weight 0 (metric only); give at least one a nonzero weight to train on"
        )
    return terms


def _resolve(ref: str, spec: str, named: dict[str, Reward]) -> tuple[str, Reward]:
    """``(name, reward)`` of one term's reference: a name or an import path."""
    if ref in named:
        as_reward(named[ref])  # a TypeError for a caller's named object that is no reward
        return ref, named[ref]
    if ref in REWARDS:
        return ref, REWARDS[ref]
    path = _IMPORT_PATH.fullmatch(ref)
    if path is None:
        known = sorted({*named, *REWARDS})
        close = difflib.get_close_matches(ref, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        dotted = "write it as module:function, " if "." in ref and ":" not in ref else ""
        raise RewardSpecError(
            f"unknown reward {ref!r} in {spec!r}; {hint}known names: {', '.join(known)}, or an import path "
            f"({dotted}e.g. 'mypkg.rewards:score')"
        )
    module_name, attr = path.group("module"), path.group("attr")
    module = _import(module_name, ref)
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            owner = ".".join([module_name, *attr.split(".")[:i]])
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "check the name"
            raise RewardSpecError(f"reward {ref!r}: {owner!r} has no attribute {part!r}; {hint}")
        obj = getattr(obj, part)
    return f"{module_name}.{attr}", _as_spec_reward(obj, ref)


def _import(module_name: str, ref: str) -> Any:
    """Import ``module_name``; when it is not found, try again with the current directory on ``sys.path`` (a
    console script's ``sys.path`` does not hold it, unlike ``python -m``)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        ours = module_name == missing or module_name.startswith(missing + ".")
        cwd = os.getcwd()
        if ours and missing and cwd not in sys.path and "" not in sys.path:
            sys.path.append(cwd)
            try:
                return importlib.import_module(module_name)
            except ModuleNotFoundError:
                sys.path.remove(cwd)
            except Exception as inner:
                raise _import_error(module_name, ref, inner) from inner
        if ours:
            raise RewardSpecError(
                f"reward {ref!r}: no module named {missing!r}; check the spelling, install the package or run from "
                "the folder that holds it (or add that folder to PYTHONPATH)"
            ) from None
        raise _import_error(module_name, ref, e) from e
    except Exception as e:
        raise _import_error(module_name, ref, e) from e


def _import_error(module_name: str, ref: str, e: BaseException) -> RewardSpecError:
    return RewardSpecError(f"reward {ref!r}: importing {module_name!r} raised {type(e).__name__}: {e}; fix that module")


def _as_spec_reward(obj: Any, ref: str) -> Reward:
    """A resolved import-path object as a reward: classes are instantiated with no arguments, functions checked to
    take ``(prompt, completion, metadata)``."""
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as e:
            raise RewardSpecError(
                f"reward {ref!r}: the class could not be instantiated with no arguments ({type(e).__name__}: {e}); "
                "give it defaults for every argument or point at a ready instance in your module"
            ) from e
    if is_batched(obj):
        return obj
    if not callable(obj):
        raise RewardSpecError(
            f"reward {ref!r} is a {type(obj).__name__}, not a reward; point at a function "
            "fn(prompt, completion, metadata) -> float or an object with batch(prompts, completions, metadatas)"
        )
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return obj
    try:
        signature.bind("prompt", "completion", {})
    except TypeError as e:
        raise RewardSpecError(
            f"reward {ref!r} cannot be called as fn(prompt, completion, metadata) ({e}); point at such a function "
            "(call a factory in your module and name its result: score = make_reward(...))"
        ) from None
    return obj


# ---------------------------------------------------------------------------------------------- Python rewards


def python_reward_record(name: str, fn: Reward) -> str:
    """How a run's ``config.json`` remembers a reward passed as a Python object (``data.python_rewards``):
    ``NAME=MODULE:QUALNAME`` (:func:`pickaxe.supplied.object_record`); not a built-in's name."""
    if name in REWARDS:
        raise ConfigError(f"reward name {name!r} is a built-in reward's; name yours otherwise, rewards={{'mine': fn}}")
    as_reward(fn)  # a TypeError for an object that is no reward
    return object_record(name, fn, "reward")


def supplied_rewards(rewards: Mapping[str, Reward]) -> AbstractContextManager[None]:
    """Within the block, the runs built here score ``data.python_rewards`` with these objects (name -> reward):
    what ``pickaxe.train(..., rewards=...)`` and ``pickaxe.resume(..., rewards=...)`` wrap a run in."""
    return supplied("reward", rewards)


def python_rewards(records: Sequence[str]) -> dict[str, Reward]:
    """Each ``NAME=MODULE:QUALNAME`` record of ``data.python_rewards`` resolved (:func:`pickaxe.supplied.resolve`:
    passed again, or imported by that path as a reward spec's ``MODULE:ATTR`` is)."""
    return resolve("reward", records, lambda path: _resolve(path, path, {})[1], "rewards")
