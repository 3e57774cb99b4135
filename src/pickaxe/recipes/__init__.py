"""Named, complete training configs. ``pickaxe recipes`` lists them."""

from __future__ import annotations

import difflib
from typing import Any

from pickaxe.errors import PickaxeError
from pickaxe.recipes.classic import CLASSIC_RECIPES
from pickaxe.recipes.explore import EXPLORE_RECIPES
from pickaxe.recipes.goals import GOAL_RECIPES
from pickaxe.recipes.llm import LLM_RECIPES  # configs only: loads no LLM libraries
from pickaxe.recipes.multiagent import MULTIAGENT_RECIPES
from pickaxe.recipes.offline import OFFLINE_RECIPES
from pickaxe.recipes.recipe import Recipe

__all__ = ["RECIPES", "Recipe", "RecipeError", "get_recipe"]

RECIPES: dict[str, Recipe] = {
    **CLASSIC_RECIPES,
    **EXPLORE_RECIPES,
    **GOAL_RECIPES,
    **OFFLINE_RECIPES,
    **MULTIAGENT_RECIPES,
    **LLM_RECIPES,
}


class RecipeError(PickaxeError, KeyError):
    """An unknown recipe name."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_recipe(name: str) -> Any:
    """A fresh config of recipe ``name``; unknown names raise ``RecipeError`` with the closest ones."""
    if name not in RECIPES:
        close = difflib.get_close_matches(name, list(RECIPES), n=1, cutoff=0.0)
        raise RecipeError(f"unknown recipe {name!r}; did you mean {close[0]!r}? (`pickaxe recipes` lists all)")
    return RECIPES[name].make()
