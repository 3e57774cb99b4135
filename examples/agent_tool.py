"""An agent with a tool you wrote: GRPO over multi-turn episodes in which the model may call it.

    python examples/agent_tool.py [TOTAL_STEPS]

A tool is any object with a ``name``, a ``description``, a JSON schema of its arguments (``parameters``) and
``__call__(arguments) -> ToolResult``; the ToolBox checks the model's calls against the schema before calling it and
turns every mistake into a result the model reads. The model calls it as
``<tool_call>{"name": "stock", "arguments": {"item": "apple"}}</tool_call>``. Untrained, the tiny model here rarely
calls it: this shows the wiring (the recipes teach tool use with demonstrations first, `calc-agent-grpo`).
"""

import json
import sys
from collections.abc import Mapping
from typing import Any

import pickaxe as px
from pickaxe.envs.agents.tools import ToolBox, ToolResult

STOCK = {"apple": 12, "pear": 7, "plum": 30, "fig": 4}


class Stock:
    """How many of an item the shop holds."""

    name = "stock"
    description = "How many of an item are in stock."

    def __init__(self) -> None:
        self.parameters = {
            "type": "object",
            "properties": {"item": {"type": "string", "description": "the item, e.g. apple"}},
            "required": ["item"],
        }

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        count = STOCK.get(str(arguments["item"]).strip().lower())
        if count is None:
            return ToolResult(f"no item {arguments['item']!r}; items: {', '.join(STOCK)}", False, "not_found")
        return ToolResult(str(count), True)


steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_024
with open("questions.jsonl", "w") as f:
    for item, count in STOCK.items():
        f.write(json.dumps({"prompt": f"How many {item}s?", "answer": str(count)}) + "\n")

with ToolBox([Stock()]) as box:  # what the episodes' calls go through
    print("a well-formed call:", box.call("stock", '{"item": "plum"}').text)
    print("a mistaken call:", box.call("stock", {"thing": "plum"}).text)

run = px.train(
    "calc-agent-grpo",  # the agent recipe's settings, with this tool and these prompts instead
    "runs/example-agent",
    overwrite=True,
    tools=[Stock()],
    **{
        "agent.tools": ("stock",),
        "agent.demo": "none",
        "warm_start.updates": 0,
        "data.path": "questions.jsonl",
        "data.eval_path": "questions.jsonl",
        "collector.prompts": 4,
        "collector.group_size": 4,
        "eval.prompts": 4,
        "eval.samples": 0,
        "trainer.total_steps": steps,
        "trainer.eval_every": max(steps // 2, 16),
    },
)
print(f"held-out: mean reward {run.eval_return:.3f}, well-formed tool use {run.final['eval/reward/tool_use']:.2f}")
# a resume in a new process passes the tool again: px.resume("runs/example-agent", tools=[Stock()])
