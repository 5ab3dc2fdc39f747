"""Which ``Host`` a request may name. Bound to a loopback address, the server answers only requests addressed to
a loopback name with its port: a web page on another site, its name rebound to 127.0.0.1 by DNS, gets 421."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers
from starlette.responses import Response

from .errors import error_body

if TYPE_CHECKING:
    from .server import Server

# a Host header: a name or [IPv6 address], then maybe a port
_HOST = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only: localhost, 127.x.x.x, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(listening: str | None, port: int | None, host: str | None) -> bool:
    """Whether a request's ``Host`` header may reach a server listening on (``listening``, ``port``): any, unless
    that is a loopback address, where only a loopback name (localhost, 127.x.x.x, [::1]) with that port."""
    if listening is None or port is None or not is_loopback(listening):
        return True
    match = _HOST.fullmatch(host or "")
    if match is None or int(match["port"] or 80) != port:
        return False
    name = (match["ipv6"] or match["name"]).lower()
    return name in ("localhost", listening.lower()) or is_loopback(name)


class LocalHostsOnly:
    """The ASGI middleware of the check (plain ASGI: a BaseHTTPMiddleware would stand between streams and
    disconnects). ``server``: its address (``host``, ``port``) as it is when each request comes; ``refuse``: the
    response to an error body (``Server.error_response``)."""

    def __init__(self, app: Any, server: Server, refuse: Callable[[int, dict], Response]):
        self.app, self.server, self.refuse = app, server, refuse

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        host = Headers(scope=scope).get("host") if scope["type"] == "http" else None
        if scope["type"] == "http" and not host_allowed(self.server.host, self.server.port, host):
            port = self.server.port
            response = self.refuse(421, error_body(
                421, f"this server answers requests for localhost:{port}, 127.0.0.1:{port} or [::1]:{port} "
                     f"only, not for Host: {host or '(none)'}", None, "invalid_host"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
