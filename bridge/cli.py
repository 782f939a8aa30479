"""The ``askwright-bridge`` command line: one sub-command per module in
``bridge.commands``, each with ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys

from bridge import __version__

# Sub-command name -> module under bridge.commands.
COMMANDS = {
    "lint": "lint",
    "read": "read",
    "validate": "validate",
    "run": "run",
    "generate-registration": "registration",
    "status": "status",
    "wait": "wait",
    "store": "store",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="askwright-bridge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"askwright-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"bridge.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"bridge.commands.{module_name}":
                continue  # not built yet
            raise
        module.add_parser(sub)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
