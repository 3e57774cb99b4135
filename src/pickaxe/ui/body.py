"""Reading a request's JSON body the same way in every router: size-capped, an object, the named fields present."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request

__all__ = ["json_body"]


async def json_body(request: Request, fields: tuple[str, ...], max_bytes: int) -> dict[str, Any]:
    """The request's JSON object with every one of ``fields`` present; otherwise a one-line 4xx (413 over
    ``max_bytes``, 400 not a JSON object, 422 a missing field), before anything is read from or written to disk."""
    raw = await request.body()
    if len(raw) > max_bytes:
        raise HTTPException(413, f"the request body is over {max_bytes} bytes")
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
