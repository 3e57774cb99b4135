"""Reading a request's JSON body the same way in every router: size-capped, an object, the named fields present."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request

__all__ = ["json_body", "read_capped"]


async def read_capped(request: Request, max_bytes: int) -> bytes:
    """The request's body, or a one-line 413 as soon as it is known to be over ``max_bytes``: a ``Content-Length``
    over the cap is refused before any of the body is read, and a body without one (chunked) is counted as its
    pieces arrive and refused at the first piece past the cap, so at most ``max_bytes`` plus one piece is ever held
    in memory."""
    too_big = HTTPException(413, f"the request body is over {max_bytes} bytes")
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise HTTPException(400, "Content-Length must be a number of bytes")
        if int(length) > max_bytes:
            raise too_big
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_big
        parts.append(chunk)
    return b"".join(parts)


async def json_body(request: Request, fields: tuple[str, ...], max_bytes: int) -> dict[str, Any]:
    """The request's JSON object with every one of ``fields`` present; otherwise a one-line 4xx (413 over
    ``max_bytes``, refused while the body streams in, see :func:`read_capped`; 400 not a JSON object, 422 a missing
    field), before anything is read from or written to disk."""
    raw = await read_capped(request, max_bytes)
    try:
        body = json.loads(raw)
    except ValueError:
        raise HTTPException(400, "the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise HTTPException(400, "the request body must be a JSON object")
    missing = [f for f in fields if f not in body]
    if missing:
        raise HTTPException(422, f"missing field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    return body
