"""``askwright-bridge mcp -c CONFIG [--agent NAME]``: the MCP server on
stdio, for an agent on the bridge's own machine.

It needs no running bridge to take a set: it writes the set folder under
``sets.root`` as the agent would (the running bridge posts it).  The agent is
one of the config's ``agents`` (the only one when there is one); its sets are
the ones it sees, as over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

EXIT_CONFIG = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mcp",
        help="serve the MCP tools (ask, read, wait, close, list_sets) on stdio",
        description="Serve the Model Context Protocol on stdin/stdout for one agent of the config.",
    )
    parser.add_argument("-c", "--config", required=True, metavar="CONFIG", help="the bridge's config file")
    parser.add_argument("--agent", metavar="NAME", help="which of the config's agents this is "
                                                         "(default: the only one)")
    return parser


def run(args: argparse.Namespace) -> int:
    from bridge.service.config import ConfigError, load_config

    # stdout is the protocol's: every word for people goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="askwright-bridge mcp: %(message)s")
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        print(f"askwright-bridge mcp: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    names = sorted(config.agents)
    agent = args.agent or (names[0] if len(names) == 1 else None)
    if agent is None or agent not in config.agents:
        known = ", ".join(names) or "none"
        print(f"askwright-bridge mcp: name the agent with --agent (configured agents: {known})", file=sys.stderr)
        return EXIT_CONFIG
    asyncio.run(serve_stdio(config, agent))
    return 0


async def serve_stdio(config: Any, agent: str) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    from bridge.agents.front import watch_answers
    from bridge.agents.mcp_server import Subscribers, build_server
    from bridge.agents.sets import AgentSets

    log_store = _log_store(config)
    sets = AgentSets(config.sets.root, log_size=lambda: (store := log_store()) and store.audit.size() or 0,
                     answerers=config.answerers)
    subscribers = Subscribers(sets.owner_of)
    sets.waits.per_agent = config.agent_api.max_waits
    sets.waits.total = config.agent_api.max_waits_total
    sets.media_quota.limit = config.agent_api.media_quota
    server = build_server(sets, config.agents, lambda _ctx: agent, subscribers, media_max=config.agent_api.media_max,
                          allow_private_callbacks=config.agent_api.allow_private_callbacks,
                          log_store=log_store, local=True)
    stop = asyncio.Event()
    async with stdio_server() as (read_stream, write_stream):
        async with anyio.create_task_group() as group:
            # No bridge in this process: the folder watcher is the waits' change feed.
            group.start_soon(watch_answers, config.sets.root, subscribers, stop, sets.changes)
            await server.run(read_stream, write_stream, server.create_initialization_options())
            stop.set()
            group.cancel_scope.cancel()


def _log_store(config: Any) -> Any:
    """The running bridge's store, opened read-only on the first ``verify`` (None while there is none)."""
    kept: list[Any] = []

    def store() -> Any:
        if not kept:
            from bridge.service.storage.store import Store

            try:
                kept.append(Store.read_only(config.store.path, url=config.store.url, password=config.store.password))
            except FileNotFoundError:
                return None
        return kept[0]

    return store
