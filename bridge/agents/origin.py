"""Which ``Host`` and ``Origin`` /mcp answers: the transport's guard against
DNS rebinding, as pure functions over the request's two headers.

A rebinding page makes a browser send the attacker's own name, in ``Host``
and in ``Origin``, to the bridge's address.  So a name is what is checked:
the bridge's public name (``agent_api.public_url``), the name its listener
is configured on, or ``localhost``.  An IP address is taken as it is, since
no DNS answer can put one in a header.  A request without ``Origin`` comes
from a client that is not a browser (the SDKs, curl) and is not refused for
that."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAME = "localhost"
# Listening on every address names no host a request could be checked against.
_WILDCARDS = {"", "0.0.0.0", "::"}


def hostname(authority: str) -> str | None:
    """The host of ``name[:port]`` or ``[v6]:port``, lower-cased; None when it is not one."""
    try:
        parts = urlsplit("//" + authority.strip())
        name = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        return None
    if not name or parts.path or parts.query or parts.fragment or parts.username is not None:
        return None
    return name


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def served_names(public_url: str | None, listen: str) -> frozenset[str]:
    """The names the bridge answers /mcp for (besides any IP address)."""
    names = {LOOPBACK_NAME}
    if public_url:
        public = urlsplit(public_url).hostname
        if public:
            names.add(public)
    listening = hostname(listen)
    if listening and listening not in _WILDCARDS and not _is_address(listening):
        names.add(listening)
    return frozenset(names)


def _served(name: str, names: frozenset[str]) -> bool:
    return name.rstrip(".") in names or _is_address(name)


def refusal(host: str | None, origin: str | None, names: frozenset[str]) -> tuple[int, str] | None:
    """(status, why) for a request this listener must not serve, None for one it may.

    A foreign ``Origin`` is 403 (what the transport's specification asks);
    a ``Host`` the bridge is not is 421, "misdirected"."""
    if origin is not None:
        parts = urlsplit(origin.strip())
        try:
            name = parts.hostname if parts.scheme in ("http", "https") else None
            parts.port  # noqa: B018
        except ValueError:
            name = None
        if not name or not _served(name, names):
            return 403, f"requests from the origin {origin[:200]!r} are not served here"
    name = hostname(host) if host is not None else None
    if not name or not _served(name, names):
        return 421, f"this bridge is not {str(host)[:200]!r}: set agent_api.public_url to the name agents use"
    return None
