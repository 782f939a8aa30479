"""The ``askwright-bridge`` command line: one sub-command per module in
``bridge.commands``, each with ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys

from bridge import __version__
from bridge.textout import escape_what_cannot_be_written

# What a user reads first in --help (the module docstring is for developers).
DESCRIPTION = """\
Post an agent's askwright questions into a Matrix room, judge what people
answer there, and write what it accepts into the set folder's answers.json."""

EXAMPLES = """\
examples:
  askwright-bridge lint ask/release-review      check a set before it is posted
  askwright-bridge run --config config.yaml     run the bridge
  askwright-bridge wait ask/release-review      block until an answer arrives
  askwright-bridge read ask/release-review      print the answers as JSON

'askwright-bridge COMMAND --help' tells more about each command."""

# Sub-command name -> module under bridge.commands.
COMMANDS = {
    "lint": "lint",
    "read": "read",
    "validate": "validate",
    "run": "run",
    "generate-registration": "registration",
    "status": "status",
    "wait": "wait",
    "mcp": "mcp",
    "store": "store",
    "audit": "audit",
    "verify": "verify",
}


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """The parser with every sub-command, or with ``only`` that one: each
    module imports what its command needs (``lint`` the whole linter,
    ``validate`` the schemas), and ``run`` should not wait for the others'."""
    parser = argparse.ArgumentParser(prog="askwright-bridge", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"askwright-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
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
    argv = sys.argv[1:] if argv is None else argv
    escape_what_cannot_be_written()
    # The first word that is not an option names the sub-command (the only
    # top-level options, --help and --version, take no value).
    named = next((word for word in argv if not word.startswith("-")), None)
    parser, modules = build_parser(named if named in COMMANDS else None)
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
