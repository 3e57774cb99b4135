"""``PromptEnv``: the LLM environment is a set of prompts plus weighted reward functions.

Prompts come from a generated task (``pickaxe.envs.text.tasks``), a local JSONL/JSON/Parquet file or a
``datasets.Dataset``. Loading validates every row; a bad one raises ``DatasetError`` naming the file, the row
and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pickaxe.envs.text.example import Example
from pickaxe.envs.text.rewards import (
    Reward,
    RewardFailedError,
    RewardFn,
    RewardScores,
    as_reward,
    exact_match,
    reward_name,
    score_rewards,
)
from pickaxe.envs.text.tasks import GeneratedTask
from pickaxe.errors import ConfigError, PickaxeError

__all__ = ["DatasetError", "Example", "PromptEnv", "load_examples", "read_rows"]


class DatasetError(PickaxeError):
    """A prompt dataset that cannot be used: missing file, unreadable row, missing or empty field."""


def load_examples(
    source: str | Path | Any,
    prompt_key: str = "prompt",
    answer_key: str | None = "answer",
) -> list[Example]:
    """Read and validate prompts from a ``.jsonl``/``.json``/``.parquet`` file or a ``datasets.Dataset``.

    Each row needs a non-empty string under ``prompt_key`` and, unless ``answer_key`` is None, a value under
    ``answer_key`` (stored as a string); the other fields become the example's metadata. Any bad row raises
    ``DatasetError`` with the file, where the row is (a JSONL file's line number, else the 0-based row) and what to
    fix.
    """
    name, rows = read_rows(source, "prompt file")
    examples = [_validate(row, where, prompt_key, answer_key) for where, row in rows]
    if not examples:
        raise DatasetError(f"{name} holds no rows; a prompt dataset needs at least one")
    return examples


def read_rows(source: str | Path | Any, what: str) -> tuple[str, list[tuple[str, Any]]]:
    """The display name of ``source`` (a ``.jsonl``/``.json``/``.parquet`` file, or rows such as a
    ``datasets.Dataset``) and its rows, each with where it is: ``<file>: line N`` in a JSONL file (1-based, blank
    lines counted), else ``<file>: row i`` (0-based). The file is read whole first; an unreadable line or file is a
    ``DatasetError`` naming it (``what``: e.g. ``preference file``). What prompt and preference files share."""
    if not isinstance(source, str | Path):
        name = f"<{type(source).__name__}>"
        return name, [(f"{name}: row {i}", row) for i, row in enumerate(source)]
    path = Path(source)
    name = str(path)
    if not path.is_file():
        raise DatasetError(f"{what} {name!r} does not exist; pass a .jsonl, .json or .parquet file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return name, [(f"{name}: line {n}", row) for n, row in _read_jsonl(path)]
    if suffix == ".json":
        rows: Sequence[Any] = _read_json(path)
    elif suffix == ".parquet":
        import datasets

        rows = datasets.Dataset.from_parquet(str(path))
    else:
        raise DatasetError(f"{name}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")
    return name, [(f"{name}: row {i}", row) for i, row in enumerate(rows)]


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """``(line number, row)`` for every non-blank line."""
    out = []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(
                f"{path}: line {n} is not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
                "re-encode the file as UTF-8"
            ) from None
        try:
            out.append((n, json.loads(text)))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: line {n} is not valid JSON ({e.msg} at column {e.colno}); fix it") from None
    return out


def _read_json(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not valid UTF-8 (byte {e.start}); re-encode the file as UTF-8") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}); fix it or use .jsonl") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path} must hold a JSON list of objects (one per row)")
    return data


def _text(value: Any, where: str, key: str) -> str:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(f"{where}: field {key!r} is not valid UTF-8 (byte {e.start}); re-encode it") from None
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise DatasetError(f"{where}: field {key!r} holds invalid Unicode (lone surrogates); clean the data") from None
    return value


def _validate(row: Any, where: str, prompt_key: str, answer_key: str | None) -> Example:
    if not isinstance(row, dict):
        raise DatasetError(f"{where} is a {type(row).__name__}, not an object with a {prompt_key!r} field")
    if prompt_key not in row or row[prompt_key] is None:
        raise DatasetError(f"{where} has no {prompt_key!r} field (fields: {sorted(row)}); add it or set the prompt key")
    prompt = _text(row[prompt_key], where, prompt_key)
    if not prompt.strip():
        raise DatasetError(f"{where}: the prompt is empty; remove the row or fill it in")
    answer = None
    if answer_key is not None:
        if answer_key not in row or row[answer_key] is None:
            raise DatasetError(
                f"{where} has no {answer_key!r} field (fields: {sorted(row)}); add it or set the answer key"
            )
        value = row[answer_key]
        answer = _text(value, where, answer_key) if isinstance(value, str | bytes) else str(value)
    metadata = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
    return Example(prompt, answer, metadata)


TRAJECTORY_KEY = "trajectory"
"""The key of a reward's ``metadata`` that holds a multi-turn episode's counts (``turns``, ``calls``,
``malformed``, ``tool_errors``, ``answered``, ``model_tokens``, ``env_tokens``): what per-episode rewards read."""


def score_examples(
    terms: Sequence[tuple[str, RewardFn, float]],
    examples: Sequence[Example],
    completions: Sequence[str],
    infos: Sequence[Mapping[str, Any] | None] | None = None,
) -> RewardScores:
    """``score_rewards`` of ``(name, reward, weight)`` terms over ``completions[i]`` answering ``examples[i]``, each
    reward's metadata the example's plus, given ``infos[i]``, that dict under :data:`TRAJECTORY_KEY`."""
    if len(examples) != len(completions):
        raise ValueError(f"got {len(examples)} examples and {len(completions)} completions; pass one each")
    metadatas = [ex.reward_metadata() for ex in examples]
    if infos is not None:
        for metadata, info in zip(metadatas, infos, strict=True):
            if info is not None:
                metadata[TRAJECTORY_KEY] = dict(info)
    return score_rewards(terms, [ex.prompt for ex in examples], list(completions), metadatas)


def _reward_term(item: Any) -> tuple[str, RewardFn, float]:
    """``(name, callable reward, weight)`` of one ``rewards`` entry: a reward, a pair or a triple."""
    if isinstance(item, tuple):
        if len(item) == 3:
            name, fn, weight = item
        elif len(item) == 2:
            (fn, weight), name = item, None
        else:
            raise ConfigError(
                f"a reward entry has {len(item)} items; pass reward, (reward, weight) or (name, reward, weight)"
            )
        fn = as_reward(fn)
        return (name if name is not None else reward_name(fn)), fn, float(weight)
    fn = as_reward(item)
    return reward_name(fn), fn, 1.0


class PromptEnv:
    """Prompts plus weighted rewards: ``sample(n)`` draws training examples (seeded), ``eval_examples(n)``
    returns the fixed held-out ones, ``score(example, completion)`` returns the weighted reward.

    ``source`` is a generated task (its ``verify`` is the default reward; held-out problems come from its
    held-out split) or a list of ``Example`` (default reward ``exact_match``; the held-out set is ``eval_source``
    or, without one, a seeded ``eval_fraction`` of the list, never sampled for training).
    ``rewards`` holds rewards, ``(reward, weight)`` pairs or ``(name, reward, weight)`` triples (what
    :func:`~pickaxe.envs.text.rewards.parse_reward_spec` returns); a reward is a function
    ``fn(prompt, completion, metadata)`` or a :class:`~pickaxe.envs.text.rewards.BatchReward`. Names (default: the
    function's ``__name__``) must be unique; they key the per-reward metrics. A weight of 0 makes a metric-only
    reward: scored and logged, never part of the training reward. The first reward is the correctness check
    evaluation uses. The held-out set is fixed by ``eval_seed`` (default: derived from ``seed``).
    """

    def __init__(
        self,
        source: GeneratedTask | Sequence[Example],
        rewards: Sequence[Reward | tuple[Reward, float] | tuple[str, Reward, float]] | None = None,
        eval_source: Sequence[Example] | None = None,
        seed: int = 0,
        eval_size: int = 200,
        eval_fraction: float = 0.1,
        eval_seed: int | None = None,
    ) -> None:
        self.task = source if hasattr(source, "verify") and hasattr(source, "sample") else None
        default: RewardFn = self.task.verify if self.task is not None else exact_match
        terms = [_reward_term(r) for r in (rewards or [default])]
        names = [name for name, _, _ in terms]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"two rewards are named {twice[0]!r}; name them apart with (name, reward, weight) triples"
            )
        self.rewards: list[tuple[RewardFn, float]] = [(fn, w) for _, fn, w in terms]
        """``(reward, weight)`` pairs, each reward callable as ``fn(prompt, completion, metadata)``."""
        self.reward_names: list[str] = names
        """The rewards' names, in the order of ``rewards``."""
        self.rng = np.random.default_rng(seed)
        if eval_seed is None:
            eval_seed = int(np.random.SeedSequence(seed).generate_state(2)[1])
        if self.task is not None:
            self.train: list[Example] = []
            self.heldout = self.task.heldout(eval_size, eval_seed)
        else:
            data = list(source)  # type: ignore[arg-type]
            if eval_source is not None:
                self.train, self.heldout = data, list(eval_source)
            else:
                perm = np.random.default_rng(eval_seed).permutation(len(data))
                n_eval = min(eval_size, max(1, round(eval_fraction * len(data)))) if len(data) > 1 else 0
                self.heldout = [data[i] for i in perm[:n_eval]]
                self.train = [data[i] for i in perm[n_eval:]]
            if not self.train:
                raise DatasetError("the prompt dataset has no training rows left after the held-out split")
        self._order: list[int] = []

    def sample(self, n: int) -> list[Example]:
        """``n`` training examples: fresh random problems of a task, or the next rows of a reshuffled-per-epoch
        dataset."""
        if self.task is not None:
            return [self.task.sample(self.rng, "train") for _ in range(n)]
        out = []
        for _ in range(n):
            if not self._order:
                self._order = [int(i) for i in self.rng.permutation(len(self.train))]
            out.append(self.train[self._order.pop()])
        return out

    def eval_examples(self, n: int | None = None) -> list[Example]:
        """The first ``n`` (default all) held-out examples; the same every call."""
        return self.heldout if n is None else self.heldout[:n]

    def score(self, example: Example, completion: str) -> tuple[float, dict[str, float]]:
        """The weighted sum of the rewards of ``completion``, and each unweighted reward by name.

        A reward that raises or returns a non-finite value raises ``RewardFailedError`` naming the reward and the
        sample (use :meth:`score_batch` to score many completions and skip the failed ones instead).
        """
        scores = self.score_batch([example], [completion])
        if scores.failures:
            failure = scores.failures[0]
            raise RewardFailedError(
                f"reward {failure.reward!r} failed on {failure.describe()}; fix the reward function"
            ) from failure.exception
        return scores.total[0], {name: values[0] for name, values in scores.parts.items()}

    def score_batch(
        self,
        examples: Sequence[Example],
        completions: Sequence[str],
        infos: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> RewardScores:
        """Every reward of every completion (``completions[i]`` answers ``examples[i]``): batched rewards in one
        call, the others one by one. A reward that raises or returns a non-finite value for a sample is recorded
        in ``failures`` and makes the sample invalid when its weight is nonzero; nothing is raised for it.
        ``infos`` (per completion, optional) join each reward's metadata under ``trajectory``, as in a
        ``ToolEnv``."""
        terms = [(name, fn, w) for name, (fn, w) in zip(self.reward_names, self.rewards, strict=True)]
        return score_examples(terms, examples, completions, infos)

    def state_dict(self) -> dict[str, Any]:
        """Sampling RNG and the position in the current data epoch."""
        return {"rng": self.rng.bit_generator.state, "order": list(self._order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.rng.bit_generator.state = state["rng"]
        self._order = list(state["order"])
