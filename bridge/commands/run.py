"""``askwright-bridge run -c CONFIG``: the long-running bridge."""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys

from bridge.service.storage import runlock
from bridge.service.config import ConfigError, load_config, world_readable
from bridge.service.logs import setup_logging
from bridge.service.storage.store import Store, StoreVersionError


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("run", help="run the bridge (bot mode, or appservice mode when enabled)")
    parser.add_argument("-c", "--config", required=True, help="the YAML config file")
    parser.add_argument("--log-format", choices=["text", "json"], default=None,
                        help="log lines as plain text or JSON (default: logging.format in the config)")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"askwright-bridge: {exc}", file=sys.stderr)
        return 2
    try:
        # One bridge per SQLite store, and none while ``store migrate`` copies
        # it; instances on PostgreSQL elect a leader in the database instead.
        lock = None if config.store.url else runlock.hold(config.store.path)
    except runlock.StoreBusy as exc:
        print(f"askwright-bridge: store.path: {exc}; is another bridge running?", file=sys.stderr)
        return 2
    try:
        # Migrates the store forward now, or refuses one from a newer bridge
        # before anything touches the network.
        Store(config.store.path, url=config.store.url, password=config.store.password).close()
    except StoreVersionError as exc:
        return _store_refused(exc)
    except (sqlite3.Error, OSError) as exc:
        key = "store.url" if config.store.url else "store.path"
        print(f"askwright-bridge: {key}: cannot open {config.store.where} ({exc})", file=sys.stderr)
        return 2
    setup_logging(config.logging.level, args.log_format or config.logging.format)
    if world_readable(args.config):
        logging.getLogger("bridge").warning("%s is readable by other users and holds secrets; chmod 600 it",
                                            args.config)
    from bridge.service.app import run_forever

    try:
        return run_forever(config)
    except StoreVersionError as exc:  # the store was replaced under a starting bridge
        return _store_refused(exc)
    finally:
        if lock is not None:
            lock.close()


def _store_refused(exc: StoreVersionError) -> int:
    print(f"askwright-bridge: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2
