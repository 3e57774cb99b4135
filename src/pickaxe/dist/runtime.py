"""Starting or joining Ray: one place that imports it (with the fix when it is missing) and initialises it."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from pickaxe.errors import PickaxeError

RAY_NOTICES = {"ray._private.authentication.authentication_token_setup": ("Token authentication is enabled",)}
"""Ray's log records that pickaxe keeps out of its output while Ray starts (logger name: message beginnings): the
notice that a new local cluster turned token authentication on, its default. Ray's warnings (e.g. that token
authentication is off) still show."""


class _DropNotices(logging.Filter):
    """Drops the records of a logger whose message begins with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def _quiet_notices() -> Iterator[None]:
    """:data:`RAY_NOTICES` dropped for the block."""
    filters = [(logging.getLogger(name), _DropNotices(prefixes)) for name, prefixes in RAY_NOTICES.items()]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def import_ray() -> Any:
    """The ``ray`` module, or a one-line ``PickaxeError`` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise PickaxeError("this needs Ray: pip install 'pickaxe[dist]' (or pip install ray)") from None
    return ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> Any:
    """Ray, initialised: joins the cluster at ``address`` (``auto``, ``host:port``, ``ray://host:10001``) or, with
    None, starts a local instance with ``num_cpus`` logical CPUs (default: this machine's). A Ray already
    initialised in this process is reused as it is. The dashboard is not started (it is a web server and
    several seconds of start-up; ``ray start --head --include-dashboard`` gives it to a cluster). Ray's notices
    (:data:`RAY_NOTICES`) are kept out of pickaxe's output while it starts."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "configure_logging": False}
    if address is not None:
        try:
            with _quiet_notices():
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            text = str(e).strip()
            first = text.splitlines()[0].split(". ")[0].rstrip(".") if text else type(e).__name__
            raise PickaxeError(
                f"cannot join the Ray cluster at {address!r}: {first}; start it with `ray start --head` or leave the "
                "address out to start Ray on this machine"
            ) from None
        return ray
    # the workers import pickaxe from the same place as this process (a source checkout on PYTHONPATH included)
    env = {k: os.environ[k] for k in ("PYTHONPATH", "PICKAXE_FAULT") if k in os.environ}
    with _quiet_notices():
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, runtime_env={"env_vars": env} if env else None, **kwargs)
    return ray
