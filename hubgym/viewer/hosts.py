"""Which Host a request to `hubgym view` may name: the address it serves, never a name someone else chose.

    names = served_names("127.0.0.1")                # {"127.0.0.1", "localhost", "::1"}: loopback, any port
    app = HostCheck(app, names)                      # any other Host (or none) is a 400 page, before any route runs

DNS rebinding: a page on evil.example, once its name resolves to 127.0.0.1, makes the browser send requests to the
local viewer, and read the answers as evil.example's own (the same origin). Every such request names evil.example
in its Host header, so refusing every Host but the names of the address the viewer serves closes that path: the
loopback names when it listens on loopback; that address, the machine's own names and loopback when it listens on
a wildcard (0.0.0.0, ::) or another address; plus any name the user allows (`--allow-host`, for a proxy or tunnel).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any, Awaitable, Callable

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::", ""})

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def served_names(host: str, allowed: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a request to a server listening on `host` may carry (lower case, IPv6 without brackets)."""
    names = set(LOOPBACK) | {host_name(name) for name in allowed}
    host = host_name(host)
    if host not in LOOPBACK:
        names.add(host)
    if host in WILDCARD:
        names |= _machine_names()
    return frozenset(names - {""})


def _machine_names() -> set[str]:
    """This machine's name, its fully qualified name, and the addresses they resolve to (a server listening on every
    interface is reached by these)."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            names |= {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:  # a name that resolves to nothing here
            continue
    return {host_name(name) for name in names}


def host_name(header: str) -> str:
    """The name part of a Host header (or of an address): 'Example.org:8765' -> 'example.org', '[::1]:80' ->
    '::1', '::1' -> '::1' (a bare IPv6 address has more than one colon)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.index("]")] if "]" in header else header
    return header.split(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """ASGI middleware: an HTTP request whose Host names none of `names` gets a plain 400 answer (the page is
    never built, so nothing of the stored data is in it)."""

    def __init__(self, app: ASGIApp, names: Iterable[str]):
        self.app, self.names = app, frozenset(names)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"host", b"").decode("latin-1")
        if host_name(raw) in self.names:
            await self.app(scope, receive, send)
            return
        # the answer names no allowed name: a page of another site that reached it may read it
        body = (f"400 Bad Request: the Host {raw[:100]!r} is not an address this viewer serves (a page of another "
                f"site reaching it under its own name is refused). Open it by the address it listens on, or start "
                f"`hubgym view --allow-host NAME`.\n").encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
