"""Tenants: who may use the server, and whose cached prompts a request may share.

With API keys (``--api-key``, ``--api-key-file``, ``$LLAISYS_API_KEY``), every endpoint but ``/health`` and the page
needs ``Authorization: Bearer <key>`` (else 401), and each key is a tenant, known by the SHA-256 of the key alone:
whoever holds ``Tenants`` (a server, or a Ray cluster's deployments) keeps no key, and a tenant's name (the digest
in hex) is no secret. Without keys there is one tenant, ''. A request's cache scope is its tenant, plus its
``cache_salt`` if it sends one: requests share cached prompt prefixes (the engine's prefix cache) only within one
scope, so no tenant can learn from timing or cached_tokens what another sent.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable

from fastapi import Request

from llaisys import LlaisysValueError

from ..text.tokenizer import check_text
from . import access_log
from .errors import APIError, invalid
from .request_body import field

MAX_CACHE_SALT = 256  # characters of ``cache_salt``, as vLLM


class Tenants:
    """The API keys' tenants, known by the SHA-256 digest of each key."""

    def __init__(self, digests: Iterable[bytes] = ()):
        self._names = {bytes(digest): bytes(digest).hex() for digest in digests}

    @classmethod
    def of_keys(cls, api_keys: Iterable[str]) -> Tenants:
        """The tenants of these keys (each checked: ``check_api_key``)."""
        api_keys = tuple(api_keys)
        for key in api_keys:
            check_api_key(key)
        return cls(hashlib.sha256(key.encode()).digest() for key in api_keys)

    @property
    def digests(self) -> tuple[bytes, ...]:
        return tuple(self._names)

    def of(self, authorization: str) -> str | None:
        """The tenant of an ``Authorization`` header: the SHA-256 (hex) of its key; '' when no key is needed;
        None when the key is missing or unknown."""
        if not self._names:
            return ""
        scheme, _, key = authorization.partition(" ")
        # the header came as latin-1: its bytes are the key's UTF-8
        digest = hashlib.sha256(key.strip().encode("latin-1", "replace")).digest()
        found = None
        for known, name in self._names.items():  # every key compared, in constant time
            if hmac.compare_digest(digest, known):
                found = name
        return found if scheme.lower() == "bearer" else None


def check_api_key(key: str, source: str = "an API key") -> None:
    """A LlaisysValueError unless ``key`` can be sent as 'Authorization: Bearer <key>' (``source`` names
    where it came from). An empty key above all: it would turn authentication off."""
    if not isinstance(key, str) or not key:
        raise LlaisysValueError(f"{source} is empty (an unset variable?): it would let anyone in; give a key, or "
                                f"no key option at all to serve without one")
    if key != key.strip() or not key.isprintable():
        raise LlaisysValueError(f"{source} begins or ends with spaces or holds control characters: a client "
                                f"cannot send it")


def key_required(tenants: Tenants) -> Callable[[Request], None]:
    """The dependency of the routes that need a key (one of ``tenants``'): the request's tenant
    (``request.state.tenant``, and its access-log line's), or a 401."""
    def require_key(request: Request) -> None:
        tenant = tenants.of(request.headers.get("authorization", ""))
        if tenant is None:
            raise APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'", None,
                           "invalid_api_key")
        request.state.tenant = access_log.entry(request.scope).tenant = tenant
    return require_key


def cache_salt(body: dict) -> str | None:
    """``cache_salt``: a text that keeps this request's cached prompt prefix apart from requests without it."""
    salt = field(body, "cache_salt", "string")
    if salt is None:
        return None
    if not 0 < len(salt) <= MAX_CACHE_SALT:
        raise invalid(f"'cache_salt' must be a non-empty string of at most {MAX_CACHE_SALT} characters, got "
                      f"{len(salt)} characters", "cache_salt")
    try:
        check_text(salt, "'cache_salt'")
    except LlaisysValueError as e:  # a lone surrogate
        raise invalid(str(e), "cache_salt", "invalid_text") from None
    return salt


def cache_scope(tenant: str, salt: str | None) -> str:
    """The prefix cache's scope of a request: its tenant (a hex digest, or '' with no key), then ':' and
    its ``cache_salt`` if it has one (a hex digest holds no ':', so no two pairs give one scope)."""
    return tenant if salt is None else f"{tenant}:{salt}"


def request_scope(request: Request, body: dict) -> str:
    """The cache scope of a request that passed ``key_required``, with its body's ``cache_salt``."""
    return cache_scope(request.state.tenant, cache_salt(body))
