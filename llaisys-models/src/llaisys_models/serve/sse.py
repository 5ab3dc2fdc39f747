"""Server-sent events, as OpenAI's streams frame them.

    chat, completions   data: {chunk}\\n\\n ... data: [DONE]\\n\\n
    responses           event: {type}\\ndata: {event}\\n\\n ... (no [DONE])

Each JSON is one line (compact, UTF-8 as it is). The response is ``text/event-stream``, uncached and unbuffered by
proxies (nginx's ``X-Accel-Buffering``), so each event leaves as it is made.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


def _json(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data(obj: object) -> str:
    """An unnamed event: ``data: {obj}``."""
    return f"data: {_json(obj)}\n\n"


def event(kind: str, obj: object) -> str:
    """A named event: ``event: kind`` and ``data: {obj}``."""
    return f"event: {kind}\ndata: {_json(obj)}\n\n"


def response(events: AsyncIterator[str]) -> StreamingResponse:
    """The streaming response of ``events`` (Starlette cancels the generator when the client goes away)."""
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)
