"""The algorithm catalog behind ``pickaxe algos``: every algorithm, its config and the recipes that use it.

Torch-free: it reads the config types of ``TrainConfig.ALGOS`` (classic) and ``LLMTrainConfig.ALGOS`` (LLM) and
builds each recipe's config to see which algorithm it names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pickaxe.recipes.recipe import Recipe


@dataclass(frozen=True)
class AlgoEntry:
    """One algorithm: its registry name, kind (``classic`` or ``llm``), config type, summary and recipes."""

    name: str
    kind: str
    config: type
    summary: str
    recipes: tuple[str, ...]

    def fields(self) -> list[tuple[str, Any]]:
        """``(key, default)`` of every field of the config, as ``--algo.KEY`` takes them."""
        defaults = self.config()
        return [(f.name, getattr(defaults, f.name)) for f in dataclasses.fields(self.config)]


def summary_of(config: type) -> str:
    """An algorithm's one-line summary: its config's ``summary`` attribute, else the first sentence of its
    docstring."""
    text = getattr(config, "summary", None)
    if isinstance(text, str) and text:
        return text
    doc = " ".join((config.__doc__ or "").split()).replace("``", "")
    return doc.split(". ")[0].rstrip(".")


def algo_catalog(recipes: dict[str, Recipe] | None = None) -> list[AlgoEntry]:
    """Every registered algorithm, classic first, each with the recipes (of ``recipes``, default all) using it."""
    from pickaxe.train.config import TrainConfig
    from pickaxe.train.llm_config import LLMTrainConfig

    if recipes is None:
        from pickaxe.recipes import RECIPES

        recipes = RECIPES
    users: dict[tuple[str, str], list[str]] = {}
    for recipe in recipes.values():
        cfg = recipe.make()
        users.setdefault((cfg.KIND, cfg.algo_name()), []).append(recipe.name)
    return [
        AlgoEntry(name, run_config.KIND, config, summary_of(config), tuple(users.get((run_config.KIND, name), ())))
        for run_config in (TrainConfig, LLMTrainConfig)
        for name, config in run_config.ALGOS.items()
    ]
