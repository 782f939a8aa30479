"""``askwright-bridge run -c CONFIG``: the long-running bridge."""

from __future__ import annotations

import argparse
import logging
import sys

from bridge.service.config import ConfigError, load_config, world_readable
from bridge.service.logs import setup_logging


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
    setup_logging(config.logging.level, args.log_format or config.logging.format)
    if world_readable(args.config):
        logging.getLogger("bridge").warning("%s is readable by other users and holds secrets; chmod 600 it",
                                            args.config)
    from bridge.service.app import run_forever

    return run_forever(config)
