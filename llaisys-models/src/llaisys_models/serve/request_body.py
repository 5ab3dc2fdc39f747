"""A request's JSON body, read before anything depends on it: ``application/json`` only (415; a page on another
origin cannot send it without CORS), at most ``max_bytes`` (413, by its Content-Length before any of it is read,
else as it arrives), a JSON object (400 ``invalid_json``, ``invalid_type``) with no NaN or Infinity; then its
fields, each read with the JSON type it must have (``field``: a 400 ``invalid_type`` naming it otherwise)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from .errors import APIError, invalid

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413)


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict:
    """The body of ``request`` as a JSON object (ClientDisconnect if the client hangs up: see app.py)."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise APIError(415, f"the request body must be JSON sent as 'Content-Type: application/json', got "
                            f"{media_type or 'no Content-Type'}", None, "unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
        raise _too_large(max_bytes) if declared.isdigit() else invalid("bad Content-Length header", None)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:
        raise invalid("the request body nests arrays or objects too deeply", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {json_type(body)}", None, "invalid_type")
    return body


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body exceeds {max_bytes} bytes", None, "request_too_large")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# -- its fields ---------------------------------------------------------------------------------------------

def json_type(value: object) -> str:
    """What a JSON value is, in words: "a string", "an array", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    names: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


KINDS: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def field(body: dict, name: str, kind: str, *, required: bool = False, default: Any = None,
          param: str | None = None) -> Any:
    """``body[name]`` if it has the JSON ``kind``; ``default`` when absent or null (unless required)."""
    value = body.get(name)
    param = param or name
    if value is None:
        if required:
            raise invalid(f"missing required parameter '{param}'", param, "missing_required_parameter")
        return default
    if not KINDS[kind](value):
        article = "an" if kind[0] in "aeiou" else "a"
        raise invalid(f"'{param}' must be {article} {kind}, got {json_type(value)}", param, "invalid_type")
    return value
