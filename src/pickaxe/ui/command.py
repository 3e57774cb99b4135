"""``pickaxe ui [RUNS_DIR] [--port P] [--host H] [--queue-db PATH] [--max-generations N]``: serve the local web
app."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import tyro

from pickaxe.argparsing import parse
from pickaxe.config_keys import ranged
from pickaxe.errors import PickaxeError
from pickaxe.ui import DEFAULT_MAX_GENERATIONS

__all__ = ["UiArgs", "main"]


@dataclass
class UiArgs:
    """Serve the local web app: runs, queue, checkpoints, playground and arena pages (offline; Ctrl-C stops)."""

    runs_dir: tyro.conf.Positional[str] = "runs"
    """Folder holding the runs (searched at any depth, as `pickaxe runs` does)."""
    port: int = ranged(8000, ge=1, le=65535)
    """Port to listen on."""
    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback makes the app (which has no authentication) reachable by others."""
    queue_db: str | None = None
    """Queue database shown on the Queue page (default $PICKAXE_QUEUE or ~/.pickaxe/queue.db)."""
    max_generations: int = ranged(DEFAULT_MAX_GENERATIONS, ge=1, le=256)
    """Playground generations run at once; a request beyond them is answered "busy" (429) at once."""


def main(argv: list[str]) -> int:
    """``pickaxe ui``: parse ``argv`` (the words after ``ui``) and serve until Ctrl-C.

    A user error (no such folder, a bad or busy port, an unknown option) prints one line and returns 2;
    ``--help`` prints the usage and returns 0.
    """
    try:
        args = parse(UiArgs, list(argv), "pickaxe ui")
        try:
            from pickaxe.ui.app import serve
        except ImportError as e:
            missing = e.name or "fastapi"
            hint = f"pickaxe ui needs the web extra ({missing} is missing): pip install 'pickaxe[web]'"
            raise PickaxeError(hint) from None

        serve(
            args.runs_dir, host=args.host, port=args.port, queue_db=args.queue_db, max_generations=args.max_generations
        )
    except PickaxeError as e:
        print(f"pickaxe: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # tyro after printing --help
        if e.code in (0, None):
            return 0
        raise
    except KeyboardInterrupt:
        return 0
    return 0
