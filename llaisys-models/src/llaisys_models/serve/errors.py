"""Rejected requests as OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``.

The ``openai`` client maps the status code to its exception class (400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, ...) and reads ``message`` from this body.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
               421: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


class APIError(Exception):
    """A request the server refuses, with the HTTP status and the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": printable(message), "type": kind, "param": None if param is None else printable(param),
                      "code": code}}


def printable(text: str) -> str:
    """``text`` with what cannot be UTF-8 (lone surrogates, as in a JSON string's ``"\\ud800"``) written as
    backslash escapes: a message that echoes the client's input (or a ``param`` naming a key it sent) must still encode
    as a JSON body."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """A 400 for a parameter the request got wrong."""
    return APIError(400, message, param, code)


class PathScrubber:
    """Takes the server's file system out of messages for its clients.

    Messages from the loader, the tokenizer or an exception may name files ("the tokenizer from
    /srv/models/x"). Every path that starts in one of the server's own folders (the model's files, the
    tokenizer's, the llaisys packages', Python's installation, the home folder) becomes the model's name
    for the model's own files and ``<server path>`` for the rest; the server's log keeps the original.
    """

    def __init__(self, model_paths: Iterable[str | os.PathLike[str] | None], model_name: str) -> None:
        import sys
        from pathlib import Path

        import llaisys
        import llaisys_models

        labels: dict[str, str] = {}
        others: list[str | os.PathLike[str] | None] = [sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                       Path(llaisys.__file__).parent,
                                                       Path(llaisys_models.__file__).parent, Path.home()]
        for paths, label in ((others, "<server path>"), (model_paths, model_name)):
            for path in paths:
                if path and str(path).startswith("/") and len(Path(path).parts) > 1:
                    labels[str(path).rstrip("/")] = label
                    labels[str(Path(path).resolve())] = label
        self._labels = labels
        roots = "|".join(re.escape(root) for root in sorted(labels, key=len, reverse=True))
        # a root, then the rest of the path up to a quote, a space or closing punctuation
        self._pattern = re.compile(rf"({roots})(?![^/\s'\"`,;:)\]}}])[^\s'\"`,;)\]}}]*")

    def __call__(self, message: str) -> str:
        return self._pattern.sub(lambda m: self._labels[m.group(1)], message)
