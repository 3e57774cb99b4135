"""Text environments: ``PromptEnv`` (prompts + weighted rewards), generated verifiable tasks, reward functions."""

from pickaxe.envs.text.example import Example
from pickaxe.envs.text.preferences import PreferencePair, load_preferences
from pickaxe.envs.text.prompt_env import DatasetError, PromptEnv, load_examples
from pickaxe.envs.text.rewards import REWARDS, exact_match, format_reward, length_penalty, numeric_match
from pickaxe.envs.text.tasks import (
    TASKS,
    Arithmetic,
    Countdown,
    DigitTask,
    GeneratedTask,
    Reverse,
    SortDigits,
    evaluate_expression,
    make_task,
)

__all__ = [
    "REWARDS",
    "TASKS",
    "Arithmetic",
    "Countdown",
    "DatasetError",
    "DigitTask",
    "Example",
    "GeneratedTask",
    "PreferencePair",
    "PromptEnv",
    "Reverse",
    "SortDigits",
    "evaluate_expression",
    "exact_match",
    "format_reward",
    "length_penalty",
    "load_examples",
    "load_preferences",
    "make_task",
    "numeric_match",
]
