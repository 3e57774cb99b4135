"""The ``pickaxe ui`` application: the JSON API and the pages of runs, a run, queue, checkpoints, playground and arena.

``create_app(runs_dir, queue_db)`` builds it; ``serve`` runs it with uvicorn on 127.0.0.1 unless another host is
asked for. Every error the API returns is JSON ``{"detail": "<one line>"}``; every asset a page needs is under
``/static`` (nothing from a CDN).
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from pickaxe.errors import PickaxeError
from pickaxe.exp.queue_store import default_db_path
from pickaxe.ui import DEFAULT_MAX_GENERATIONS

__all__ = ["LOOPBACK_HOSTS", "STATIC_DIR", "create_app", "listen", "serve"]

STATIC_DIR = Path(__file__).parent / "static"
"""The pages, scripts, styles and vendored libraries, served at ``/static``."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts only this machine can reach; any other gets the no-authentication warning."""

LISTEN_BACKLOG = 2048
"""Connections the server socket queues before accepting them (uvicorn's own default)."""

PAGES = {
    "/": "runs.html",
    "/runs": "runs.html",
    "/run": "run.html",
    "/queue": "queue.html",
    "/checkpoints": "checkpoints.html",
}
"""Page routes served by this module (the arena and playground routers serve their own)."""


def create_app(
    runs_dir: str | Path,
    queue_db: str | Path | None = None,
    *,
    allowed_hosts: Iterable[str] | None = None,
    max_generations: int = DEFAULT_MAX_GENERATIONS,
) -> FastAPI:
    """The app over the runs under ``runs_dir`` and the job queue ``queue_db`` (default: ``$PICKAXE_QUEUE`` or
    ``~/.pickaxe/queue.db``, read when a page asks; a missing queue is an empty queue page, not an error).

    Requests that change something (POST, PUT, PATCH, DELETE) must send ``Content-Type: application/json``: a
    browser sends that across sites only after a CORS preflight, which this app never grants, so another web
    page cannot cancel jobs or cast votes through the user's browser. With ``allowed_hosts`` (``serve`` passes
    the loopback names when it listens on loopback), a request naming another ``Host`` is refused (DNS rebinding).

    At most ``max_generations`` playground generations run at once; more are answered 429 (see
    :class:`pickaxe.ui.playground.GenerationSlots`). Request bodies are capped while they stream in
    (:func:`pickaxe.ui.body.read_capped`).

    Raises ``PickaxeError`` when ``runs_dir`` is not a folder or ``max_generations`` is below 1.
    """
    from pickaxe.ui import arena, checkpoints, playground, queue, run_view, runs

    root = Path(runs_dir).expanduser()
    if not root.is_dir():
        raise PickaxeError(f"{root} is not a folder; `pickaxe ui RUNS_DIR` serves the runs under RUNS_DIR")
    if isinstance(max_generations, bool) or not isinstance(max_generations, int) or max_generations < 1:
        raise PickaxeError(f"--max-generations must be an integer >= 1, got {max_generations!r}")
    app = FastAPI(title="pickaxe", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.generation_slots = playground.GenerationSlots(max_generations)
    app.state.runs_dir = root.resolve()
    app.state.queue_db = Path(queue_db).expanduser() if queue_db is not None else default_db_path()
    app.state.summary_cache = runs.SummaryCache()
    app.state.record_cache = runs.RecordCache()

    hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    @app.middleware("http")
    async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if hosts is not None:
            name = _host_name(request.headers.get("host", ""))
            if name not in hosts:
                return JSONResponse({"detail": f"host {name!r} is not served here; open the app by its address"}, 400)
        if request.method in ("POST", "PUT", "PATCH", "DELETE"):
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                detail = f"{request.method} requests must send Content-Type: application/json (the pages do)"
                return JSONResponse({"detail": detail}, 415)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _one_line(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default detail is a list of dicts; the pages show one line
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x not in ("query", "body", "path"))
            parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
        return JSONResponse({"detail": "bad request: " + "; ".join(parts)}, status_code=422)

    for route, name in PAGES.items():
        app.add_api_route(route, _page(name), methods=["GET"], include_in_schema=False)
    for module in (runs, run_view, queue, checkpoints, arena, playground):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _host_name(host: str) -> str:
    """``"127.0.0.1:8000"`` -> ``"127.0.0.1"``, ``"[::1]:8000"`` -> ``"::1"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _page(name: str) -> Callable[[], Awaitable[FileResponse]]:
    """The endpoint serving the page ``static/<name>`` (never cached: the pages change with the package)."""
    path = STATIC_DIR / name

    async def page() -> FileResponse:
        return FileResponse(path, media_type="text/html", headers={"Cache-Control": "no-store"})

    page.__name__ = f"page_{path.stem}"
    return page


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound to ``host:port`` and listening; one ``PickaxeError`` line when ``port`` is out of
    range or another program listens there.

    ``SO_REUSEADDR`` is set, as servers do: the connections of a ``pickaxe ui`` that was killed linger for a minute
    (TIME_WAIT) and would otherwise keep its port from being bound again until they expire. A port some other
    socket listens on is still refused. uvicorn serves this very socket, so no other program can take the port
    between the check and the start."""
    if not 1 <= port <= 65535:
        raise PickaxeError(f"--port must be between 1 and 65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise PickaxeError(
            f"cannot listen on {host}:{port} ({e.strerror or e}); choose another port with --port"
        ) from None
    return sock


def serve(
    runs_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    queue_db: str | Path | None = None,
    log_level: str = "warning",
    max_generations: int = DEFAULT_MAX_GENERATIONS,
) -> None:
    """Serve the app with uvicorn until Ctrl-C. A host other than loopback gets a one-line warning on stderr:
    the app has no authentication, its queue page can cancel and queue jobs and its run page can change a running
    run."""
    import uvicorn

    app = create_app(
        runs_dir,
        queue_db,
        allowed_hosts=LOOPBACK_HOSTS if host in LOOPBACK_HOSTS else None,
        max_generations=max_generations,
    )
    sock = listen(host, port)
    if host not in LOOPBACK_HOSTS:
        print(
            f"pickaxe ui: warning: serving on {host}, reachable from other machines; the app has no authentication",
            file=sys.stderr,
        )
    from pickaxe.ui.runs import warm_cache

    # the first page load would otherwise parse every metrics.jsonl; a crash here only leaves the cache cold
    threading.Thread(target=warm_cache, args=(app,), name="pickaxe-ui-warm", daemon=True).start()
    shown = f"[{host}]" if ":" in host else host
    print(f"pickaxe ui: http://{shown}:{port}/ (runs under {app.state.runs_dir}; Ctrl-C stops)", file=sys.stderr)
    try:
        uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).run(sockets=[sock])
    finally:
        sock.close()
