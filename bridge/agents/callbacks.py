"""Keeping webhooks out of the bridge's own network (the I/O around
``addresses``): a callback URL is judged when it is configured, when an agent
names it at ``ask``, and at every delivery, where the check is made on the
very address the socket connects to, so a name that resolves one way when
checked and another when connected to (DNS rebinding) cannot get through.

``agent_api.allow_private_callbacks: true`` turns all of it off, for an
operator whose agents' receivers are meant to be on the inside."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bridge.agents.addresses import host_of_url, name_problem, parse, refusal, refusal_of_name
from bridge.agents.errors import CallbackRefused
from bridge.agents.lookups import LookupsApart, lookup, on_behalf_of
from bridge.service.config import Agent, ConfigError


class RefusedAddress(OSError):
    """A webhook's connection refused before it was made: the address is inward."""


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's socket factory: called with the resolved address just before
    connecting to it, whether the URL named an address or a name."""
    family, type_, proto, _canonname, sockaddr = addr_info
    address = parse(str(sockaddr[0]))
    why = "not an IP address" if address is None else refusal(address)
    if why:
        raise RefusedAddress(f"refused to connect to {sockaddr[0]}: {why}")
    return socket.socket(family=family, type=type_, proto=proto)


def connector(allow_private: bool, limit: int) -> aiohttp.TCPConnector:
    """The connector webhooks are POSTed through, ``limit`` connections in
    all (the deliverer's own cap, so its lanes, not the pool, decide who
    waits).  No DNS cache: a name is resolved (and its address checked) for
    every new connection."""
    if allow_private:
        return aiohttp.TCPConnector(use_dns_cache=False, limit=limit, resolver=LookupsApart())
    return aiohttp.TCPConnector(use_dns_cache=False, limit=limit, resolver=LookupsApart(),
                                socket_factory=guarded_socket)


def refused_reason(error: BaseException) -> str | None:
    """The refusal inside an aiohttp connection error, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RefusedAddress):
            return str(current)
        if "refused to connect to" in str(current):  # several addresses, all refused: one joined message
            return str(current)
        current = getattr(current, "os_error", None) or current.__cause__ or current.__context__
    return None


def form_refusal(url: str) -> str | None:
    """Why no connection can ever be made to ``url`` as written, whatever the
    network (every delivery would fail, retried for a day): no host, a port
    of 99999 or none a number, a host no DNS name can be; None otherwise."""
    if host_of_url(url) is None:
        return "names no host"
    try:
        port = urlsplit(url).port
    except ValueError:
        port = 0
    if port == 0:
        return "names no port a connection can be made to (1 to 65535)"
    host = host_of_url(url)
    why = name_problem(host) if host is not None and parse(host) is None else None
    return f"names {host[:80]!r}, which {why}" if why else None


async def url_refusal(url: str) -> str | None:
    """Why the bridge would not POST to ``url`` (a few words); None when it would.
    Every address the host resolves to must be public.  A name that does not
    resolve now is let through: nothing can be connected to through it, and
    every delivery checks the address it connects to."""
    host, why = host_of_url(url), form_refusal(url)
    if why or host is None:  # (no host: ``form_refusal`` said so)
        return why
    why = refusal_of_name(host)
    if why:
        return f"goes to {host}, {why}"
    if parse(host) is not None:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = await lookup(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError, asyncio.TimeoutError):
        return None
    for *_rest, sockaddr in infos:
        address = parse(str(sockaddr[0]))
        why = "not an IP address" if address is None else refusal(address)
        if why:
            return f"its host {host} resolves to {sockaddr[0]}, {why}"
    return None


async def check_callbacks(callbacks: Any, *, allow_private: bool, agent: str = "") -> None:
    """At ``ask`` (HTTP and MCP): CallbackRefused (422) naming each callback
    that goes inward (unless allowed), or whose port is none.  Anything not a list of strings is left to the set
    service, which says what is wrong with its shape.  The names are looked up on ``agent``'s threads."""
    if not isinstance(callbacks, list):
        return
    findings = []
    for i, url in enumerate(callbacks):
        if not isinstance(url, str):
            continue
        if allow_private:
            why = form_refusal(url)
        else:
            with on_behalf_of(agent):
                why = await url_refusal(url)
        if why:
            findings.append({"where": f"callbacks[{i}]", "message": f"the callback {why}"})
    if findings:
        raise CallbackRefused("; ".join(f"{f['where']}: {f['message']}" for f in findings), findings=findings)


async def check_configured(agents: Mapping[str, Agent], *, allow_private: bool) -> None:
    """At start: ConfigError naming the agent whose webhook_url goes inward
    (or, allowed to, goes nowhere).  A name that does not resolve now is let
    through: every delivery checks it."""
    for name, agent in agents.items():
        if not agent.webhook_url:
            continue
        form = form_refusal(agent.webhook_url)
        with on_behalf_of(name):
            why = form or (None if allow_private else await url_refusal(agent.webhook_url))
        if why:
            raise ConfigError(f"agents.{name}.webhook_url: the URL {why}"
                              + ("" if form else " (agent_api.allow_private_callbacks: true allows it)"))

