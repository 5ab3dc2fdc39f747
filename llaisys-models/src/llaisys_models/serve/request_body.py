"""A request's JSON body, read before anything depends on it: ``application/json`` only (415; a page on another
origin cannot send it without CORS), at most ``max_bytes`` (413, by its Content-Length before any of it is read,
else as it arrives), a JSON object (400 ``invalid_json``, ``invalid_type``) with no NaN or Infinity, whose every
string, keys included, is valid Unicode (400 ``invalid_text`` naming the field); then its fields, each read with
the JSON type it must have (``field``: a 400 ``invalid_type`` naming it otherwise).

Why every string is checked at once, before any endpoint reads the body: JSON lets a client write a lone surrogate
(``"\\ud800"``), which Python parses into a ``str`` that cannot be encoded as UTF-8; wherever such a text went (the
tokenizer, a trace file, the ``metadata`` a response echoes, an SSE event) it failed there, late, as a 500 or a
stream cut short after its 200. Raw bytes that are not UTF-8 are read the same way (``surrogateescape`` turns each
into a lone surrogate), so one walk over the parsed body names the field either way, before any work starts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

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
    return parse_json(b"".join(chunks))


def parse_json(raw: bytes) -> dict:
    """``raw`` as a JSON object whose strings are all valid Unicode, else the 400 that says what is wrong."""
    try:
        text, utf8 = _decode(raw)
        body = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
    except RecursionError:
        raise invalid("the request body nests arrays or objects too deeply", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {json_type(body)}", None, "invalid_type")
    if _MAY_HOLD_SURROGATES.search(text):  # else no string in it can hold a lone surrogate
        check_text(body, utf8)
    return body


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body exceeds {max_bytes} bytes", None, "request_too_large")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


# -- its text -------------------------------------------------------------------------------------------------

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # (a str from json.loads holds valid pairs joined)
# in a body's text: an escape \uD800 to \uDFFF (half of a pair, or a lone surrogate), or a surrogate itself (a
# byte that was not UTF-8, or UTF-16's own)
_MAY_HOLD_SURROGATES = re.compile("\\\\u[dD][89a-fA-F]|[\ud800-\udfff]")


def _decode(raw: bytes) -> tuple[str, bool]:
    """The text of ``raw`` (UTF-8, else the UTF-16 or UTF-32 that json.loads would read it as) and whether it was
    valid: a byte that is not UTF-8 becomes a lone surrogate (``surrogateescape``), for check_text to name its field."""
    encoding = json.detect_encoding(raw)
    if not encoding.startswith("utf-8"):
        return raw.decode(encoding, "surrogatepass"), True
    try:
        return raw.decode(encoding), True
    except UnicodeDecodeError:
        return raw.decode(encoding, "surrogateescape"), False


def check_text(body: dict, utf8: bool = True) -> None:
    """A 400 ``invalid_text`` naming a string of ``body`` (a value or a key) that holds a lone surrogate (``utf8``:
    whether the body's bytes were valid UTF-8, else such a string may be a byte that was not).

    The walk runs on the event loop, and a client chooses when it runs (one ``\\ud83d\\ude00`` escape will do), so
    it costs about what json.loads did: an array holding no string, object or array (token ids) is passed over
    by the set of its items' types, and a field's path is spelled only for the string at fault. It keeps its
    own stack, as the body may nest as deeply as json.loads allows."""
    stack: list[tuple[dict | list, _Trail]] = [(body, None)]
    while stack:
        container, trail = stack.pop()
        if isinstance(container, list):
            if _SCALARS.issuperset(map(type, container)):
                continue
            items: Iterable[tuple[str | int, object]] = enumerate(container)
        else:
            items = container.items()
        for key, value in items:
            if isinstance(key, str) and not key.isascii():
                _check_string(key, (trail, key), utf8, key=True)
            if isinstance(value, str):
                if not value.isascii():
                    _check_string(value, (trail, key), utf8)
            elif isinstance(value, (dict, list)):
                stack.append((value, (trail, key)))


_Trail: TypeAlias = "tuple[_Trail, str | int] | None"  # a field's path: (its container's path, its key or index)
_SCALARS = frozenset({int, float, bool, type(None)})


def _path(trail: _Trail) -> str:
    """A field's path as OpenAI's ``param`` writes it: ``messages[1].content``, ``metadata.k``."""
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    path = ""
    for key in reversed(keys):
        path += f"[{key}]" if isinstance(key, int) else (f".{key}" if path else key)
    return path


def _check_string(text: str, trail: _Trail, utf8: bool, key: bool = False) -> None:
    found = _LONE_SURROGATE.search(text)
    if found is None:
        return
    path = _path(trail)
    code = ord(found.group())
    if not utf8 and 0xDC80 <= code <= 0xDCFF:  # a byte surrogateescape kept (or, as well, a \\udcXX escape)
        what = f"the byte 0x{code - 0xDC00:02X}, which is not UTF-8 there (or a lone surrogate \\u{code:04x})"
    else:
        what = f"a lone surrogate \\u{code:04x} (half of a UTF-16 pair without its other half)"
    field_name = f"the key '{path}'" if key else f"'{path}'"
    raise invalid(f"{field_name} is not valid Unicode text: character {found.start()} is {what}", path,
                  "invalid_text")


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
