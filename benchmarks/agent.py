"""Where an agent GRPO step's time goes: generation, tool calls, the rest of collecting, and the update.

For each tool (``--tools``, default ``calculator,python``): the ``calc-agent-grpo`` recipe with that tool and its
demonstrations, a fixed SFT warm start of ``--warm`` updates (enough for well-formed calls in most episodes; no
NLL target, so every tool starts from the same amount of training), then ``--steps`` timed GRPO steps after one
untimed one. Per step: ``generate`` (the engine's time over every turn of every episode), ``tools`` (the rounds'
``ToolBox.call_many``: the calculator in threads, the python tool one sandboxed process per call),
``collect_other`` (the rest of ``collect``: rewards, packing, the reference's log-probs, rendering the tool results)
and ``update`` (``GRPO.update``). Prints the median seconds of each part and its share of the step, and tool calls
per step and per second of tool time.

    python benchmarks/agent.py [--quick] [--tools calculator,python] [--warm 300] [--steps 4]

The last line is one JSON object: per tool, ``<part>_s`` and ``<part>_share`` medians, ``step_s``, ``calls_per_step``,
``calls_per_tool_s``, ``turns``, ``tool_use``; plus ``load_average`` and ``cpus``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

from pickaxe.recipes.llm import LLM_RECIPES
from pickaxe.train.llm import build_llm_trainer

PARTS = ("generate", "tools", "collect_other", "update")


def measure(tool: str, warm: int, steps: int, prompts: int) -> dict[str, float]:
    """The medians of one tool's timed steps."""
    cfg = LLM_RECIPES["calc-agent-grpo"].make()
    cfg.agent.tools, cfg.agent.demo = (tool,), tool
    cfg.warm_start.updates, cfg.warm_start.target_nll = warm, None
    cfg.collector.prompts = prompts
    cfg.eval.before = False
    cfg.device = "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the warm start's "target not reached": none is set
        trainer = build_llm_trainer(cfg)
    collector, algo = trainer.collector, trainer.algo
    rows: list[dict[str, float]] = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        batch = collector.collect()
        t1 = time.perf_counter()
        m = collector.metrics()
        algo.update(batch)
        t2 = time.perf_counter()
        if i == 0:
            continue  # warm-up: first allocations, first sandbox processes
        generate, tools = m["time/agent_generate_s"], m["time/tools_s"]
        rows.append(
            {
                "generate": generate,
                "tools": tools,
                "collect_other": (t1 - t0) - generate - tools,
                "update": t2 - t1,
                "step": t2 - t0,
                "calls": m["tools/calls"],
                "turns": m["rollout/agent/turns"],
                "tool_use": m["rollout/agent/tool_use"],
            }
        )
    trainer.close()
    out: dict[str, float] = {}
    for key in (*PARTS, "step"):
        out[f"{key}_s"] = statistics.median(r[key] for r in rows)
    for key in PARTS:
        out[f"{key}_share"] = statistics.median(r[key] / r["step"] for r in rows)
    out["calls_per_step"] = statistics.median(r["calls"] for r in rows)
    out["calls_per_tool_s"] = statistics.median(r["calls"] / max(r["tools"], 1e-9) for r in rows)
    out["turns"] = statistics.median(r["turns"] for r in rows)
    out["tool_use"] = statistics.median(r["tool_use"] for r in rows)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short warm start and two steps (smoke run)")
    parser.add_argument("--tools", default="calculator,python", help="tools to measure, comma-separated")
    parser.add_argument("--warm", type=int, default=300, help="SFT warm-start updates before the timed steps")
    parser.add_argument("--steps", type=int, default=4, help="timed GRPO steps per tool")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (8 episodes each)")
    args = parser.parse_args(argv)
    unknown = [t for t in args.tools.split(",") if t not in ("calculator", "python")]
    if unknown:
        parser.error(f"--tools: {unknown[0]!r} has no demonstrations; choose calculator, python or both")
    if args.quick:
        args.warm, args.steps, args.prompts = 60, 2, 8
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cpus)")
    result: dict[str, object] = {}
    for tool in args.tools.split(","):
        r = measure(tool, args.warm, args.steps, args.prompts)
        result[tool] = r
        shares = ", ".join(f"{p} {r[f'{p}_s']:.2f} s ({r[f'{p}_share']:.0%})" for p in PARTS)
        print(
            f"{tool}: step {r['step_s']:.2f} s = {shares}; {r['calls_per_step']:.0f} calls/step "
            f"({r['calls_per_tool_s']:.0f} calls per tool-second), {r['turns']:.2f} turns, tool use {r['tool_use']:.2f}"
        )
    result["load_average"] = os.getloadavg()[0]
    result["cpus"] = os.cpu_count() or 0
    print(json.dumps(result))


if __name__ == "__main__":
    main()
