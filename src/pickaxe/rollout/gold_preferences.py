"""Preference pairs over a policy's own samples, labelled by a hidden gold scorer (the RLHF recipes' stand-in for
human raters).

For each prompt the engine samples ``samples`` completions; every two distinct, non-empty completions whose gold
scores differ become one pair. With ``label_temperature`` 0 the higher-scored completion is ``chosen`` (a perfect
rater); above 0 the label is drawn from the Bradley–Terry model ``P(a preferred) = sigmoid((g_a - g_b) / T)``
(a noisy rater, as people are). Each pair records both gold scores, so a reader can audit the labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pickaxe.envs.text.example import Example
from pickaxe.envs.text.preferences import PreferencePair
from pickaxe.rollout.engines.base import Engine, SamplingParams
from pickaxe.rollout.text_collector import completion_text, encode_prompts

__all__ = ["GoldScorer", "gold_pairs", "sample_gold_preferences"]

GoldScorer = Callable[[str, str, dict[str, Any]], float]
"""``gold(prompt, completion, metadata) -> float``: higher is better."""


def gold_pairs(
    example: Example,
    completions: Sequence[str],
    gold: GoldScorer,
    rng: np.random.Generator,
    label_temperature: float = 0.0,
    group: int = 0,
) -> list[PreferencePair]:
    """The labelled pairs of one prompt's ``completions`` (duplicates and empty ones dropped; pairs of equal gold
    skipped), in order ``(0, 1), (0, 2), ..., (1, 2), ...`` of the distinct completions."""
    meta = example.reward_metadata()
    distinct = list(dict.fromkeys(c for c in completions if c.strip()))
    scores = [float(gold(example.prompt, c, meta)) for c in distinct]
    pairs = []
    for a in range(len(distinct)):
        for b in range(a + 1, len(distinct)):
            if scores[a] == scores[b]:
                continue
            if label_temperature > 0:
                p_a = 1.0 / (1.0 + math.exp(-(scores[a] - scores[b]) / label_temperature))
                a_wins = bool(rng.random() < p_a)
            else:
                a_wins = scores[a] > scores[b]
            win, lose = (a, b) if a_wins else (b, a)
            pairs.append(
                PreferencePair(
                    example.prompt,
                    distinct[win],
                    distinct[lose],
                    group=group,
                    metadata={"gold_chosen": scores[win], "gold_rejected": scores[lose]},
                )
            )
    return pairs


def sample_gold_preferences(
    engine: Engine,
    tokenizer: Any,
    examples: Sequence[Example],
    params: SamplingParams,
    gold: GoldScorer,
    seed: int = 0,
    label_temperature: float = 0.0,
) -> list[PreferencePair]:
    """Sample ``params.n`` completions of each of ``examples`` with ``engine`` and label every scorable pair with
    ``gold`` (see :func:`gold_pairs`); ``group`` is the prompt's index in ``examples``, ``row`` the pair's index.
    The engine's weights are whatever it holds (sync them first)."""
    rng = np.random.default_rng(seed)
    eos = int(tokenizer.eos_token_id)
    completions = engine.generate(encode_prompts(tokenizer, examples), params)
    texts: list[list[str]] = [[] for _ in examples]
    for c in completions:
        texts[c.prompt_index].append(completion_text(tokenizer, c.token_ids, eos))
    pairs: list[PreferencePair] = []
    for i, ex in enumerate(examples):
        pairs += gold_pairs(ex, texts[i], gold, rng, label_temperature, group=i)
    for row, pair in enumerate(pairs):
        pair.row = row
    return pairs
