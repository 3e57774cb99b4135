"""``pickaxe arena RUN_DIR``: generate and store the responses of a run's checkpoints for the blind arena.

The responses go to ``RUN_DIR/arena.sqlite`` by default (:data:`DEFAULT_DB`), where ``pickaxe ui`` finds them: its
arena page lists the arenas of every ``arena.sqlite`` in a run folder under RUNS_DIR.
"""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

from pickaxe.argparsing import merge_repeated, parse, wants_help
from pickaxe.config_keys import ranged
from pickaxe.errors import PickaxeError

__all__ = ["DEFAULT_DB", "ArenaArgs", "main"]

DEFAULT_DB = "arena.sqlite"
"""The arena file of a run: ``RUN_DIR/arena.sqlite``."""


@dataclass
class ArenaArgs:
    """Generate every chosen checkpoint's response to held-out prompts of an LLM run, ahead of time, for the blind
    arena of `pickaxe ui` (Arena page). Reruns only generate what is missing."""

    run_dir: tyro.conf.Positional[str]
    """The LLM run folder."""
    checkpoints: tuple[str, ...] = ("all",)
    """Env steps (e.g. 640 1280), final, latest or best; `all`: every kept policy or checkpoint and the final model."""
    prompts: int = ranged(32, ge=1, le=10_000)
    """How many held-out prompts of the run's task."""
    db: str | None = None
    """Arena file (default RUN_DIR/arena.sqlite, where `pickaxe ui` looks)."""
    name: str | None = None
    """Arena name inside the file (default: the run folder's name)."""
    max_new_tokens: int | None = ranged(None, ge=1, le=4096)
    """Tokens per response (default the run's engine.max_new_tokens)."""
    temperature: float = ranged(0.0, ge=0.0)
    """0: greedy responses; above 0: sampled (seeded)."""
    device: str = "cpu"
    """Where the models run: cpu, cuda, cuda:N or auto."""


def main(argv: list[str]) -> int:
    """``pickaxe arena RUN_DIR [--checkpoints STEP... | all] [--prompts N] [--db PATH] [--name NAME]``; returns 0,
    raises a one-line ``PickaxeError`` for bad input (the CLI prints it and exits 2)."""
    argv = list(argv)
    if not wants_help(argv) and (not argv or argv[0].startswith("-")):
        raise PickaxeError("pickaxe arena needs a run directory first, e.g. `pickaxe arena runs/my-run --prompts 32`")
    args = parse(ArenaArgs, merge_repeated(argv, "--checkpoints", "all, or final, latest, best or env steps"),
                 "pickaxe arena")  # fmt: skip
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").is_file():
        raise PickaxeError(f"{run_dir} is not a run directory (no config.json); pass the folder of an LLM run")
    checkpoints: list[str] | str = "all" if list(args.checkpoints) == ["all"] else list(args.checkpoints)
    if "all" in checkpoints and checkpoints != "all":
        raise PickaxeError("--checkpoints takes `all` alone or a list of steps (final, latest, best, or env steps)")
    from pickaxe.eval.arena import ArenaStore
    from pickaxe.train.generate import llm_run_config, prepare_arena

    llm_run_config(run_dir)  # a classic or reward-model run is refused before the arena file exists
    db = Path(args.db) if args.db else run_dir / DEFAULT_DB
    name = args.name or run_dir.resolve().name
    created = not db.exists()
    try:
        store = ArenaStore(db)
    except (OSError, sqlite3.Error) as e:  # a folder where the file should be, permissions, not a database
        raise PickaxeError(f"cannot open the arena file {db} ({' '.join(str(e).split())}); pass another --db") from None
    try:
        made = prepare_arena(
            store,
            name,
            run_dir,
            checkpoints,
            n_prompts=args.prompts,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            device=args.device,
            progress=lambda line: print(line, file=sys.stderr),
        )
    except PickaxeError:
        store.close()
        if created:  # refused before any response was stored: leave no arena file behind
            _remove_db(db)
        raise
    labels = store.labels(name)
    where = (
        f"vote with `pickaxe ui {run_dir.parent}` (Arena page)"
        if db == run_dir / DEFAULT_DB
        else f"note: `pickaxe ui` finds arenas only in RUN_DIR/{DEFAULT_DB}, so it will not list this one"
    )
    print(
        f"arena {name!r} in {db}: {len(labels)} checkpoints ({', '.join(labels)}) x {store.prompt_count(name)} "
        f"prompts, {made} responses generated now; {where}"
    )
    return 0


def _remove_db(db: Path) -> None:
    """Delete an arena file this command created, with SQLite's side files."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
