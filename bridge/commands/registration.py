"""``askwright-bridge generate-registration -c CONFIG -o registration.yaml``

Writes the appservice registration the homeserver loads (Synapse:
``app_service_config_files``).  Tokens missing from the config (and from the
environment) are generated and stored back into the config file, so the
bridge and the homeserver agree on them from then on; tokens already present
are used as they are.  Both files are written with mode 0600.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from bridge.service.transport.appservice import user_namespace
from bridge.service.config import Config, ConfigError, load_config
from bridge.wholefile import replace_whole

TOKEN_KEYS = ("as_token", "hs_token")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("generate-registration",
                            help="write the appservice registration file for the homeserver")
    parser.add_argument("-c", "--config", required=True, help="the bridge's YAML config file")
    parser.add_argument("-o", "--output", required=True, help="where to write the registration YAML")


def run(args: argparse.Namespace) -> int:
    config_path = Path(args.config)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"askwright-bridge: {exc}", file=sys.stderr)
        return 2
    missing = {key: new_token() for key in TOKEN_KEYS if not getattr(config.appservice, key)}
    if missing:
        try:
            kept_comments = store_tokens(config_path, missing)
        except (OSError, ValueError) as exc:
            print(f"askwright-bridge: cannot store the new tokens in {config_path}: {exc}", file=sys.stderr)
            return 2
        for key, value in missing.items():
            setattr(config.appservice, key, value)
        print(f"generated {' and '.join(missing)} and stored them in {config_path}", file=sys.stderr)
        if not kept_comments:
            print(f"note: {config_path} was rewritten whole, so any comments in it were lost", file=sys.stderr)
    elif stat.S_IMODE(config_path.stat().st_mode) & 0o077:
        os.chmod(config_path, 0o600)
        print(f"note: made {config_path} private (mode 0600): it holds the tokens", file=sys.stderr)
    if not config.appservice.enabled:
        print("note: appservice.enabled is false in the config; set it to true to run in appservice mode",
              file=sys.stderr)
    try:
        write_private(Path(args.output), yaml.safe_dump(registration(config), sort_keys=False))
    except OSError as exc:
        print(f"askwright-bridge: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}; add it to the homeserver's app_service_config_files and restart it",
          file=sys.stderr)
    return 0


def new_token() -> str:
    return secrets.token_urlsafe(48)


def registration(config: Config) -> dict[str, Any]:
    settings = config.appservice
    extensions: dict[str, Any] = {}
    if config.encryption.enabled:
        # End-to-end encryption (docs/encryption.md): to-device messages
        # (MSC2409, sent to appservices that receive ephemeral events), device
        # lists and one-time-key counts (MSC3202) come in the transactions.
        extensions = {"receive_ephemeral": True, "org.matrix.msc3202": True}
    return {
        **extensions,
        "id": settings.id,
        "url": settings.url,
        "as_token": settings.as_token,
        "hs_token": settings.hs_token,
        "sender_localpart": settings.sender_localpart,
        "rate_limited": False,
        "namespaces": {
            "users": [{"exclusive": True, "regex": regex} for regex in user_namespace(config)],
            "aliases": [],
            "rooms": [],
        },
    }


# -- storing tokens in the config file ------------------------------------------

def store_tokens(path: Path, tokens: dict[str, str]) -> bool:
    """Put ``tokens`` under ``appservice:`` in the config file.  Tries a text
    edit that keeps comments and layout; falls back to rewriting the mapping
    (losing comments) when the edit would not read back as intended.
    Returns whether comments were kept."""
    text = path.read_text(encoding="utf-8")
    original = yaml.safe_load(text)
    if not isinstance(original, dict):
        raise ValueError("the config is not a YAML mapping")
    wanted = _with_tokens(original, tokens)
    edited = _edit_text(text, tokens)
    kept = _loads(edited) == wanted
    write_private(path, edited if kept else yaml.safe_dump(wanted, sort_keys=False))
    return kept


def _with_tokens(raw: dict[str, Any], tokens: dict[str, str]) -> dict[str, Any]:
    result = dict(raw)
    section = result.get("appservice")
    result["appservice"] = {**(section if isinstance(section, dict) else {}), **tokens}
    return result


def _loads(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


_TOP_KEY = re.compile(r"^appservice\s*:\s*(#.*)?$")
_CHILD = re.compile(r"^(?P<indent>[ \t]+)(?P<key>[A-Za-z_][\w-]*)\s*:")


def _edit_text(text: str, tokens: dict[str, str]) -> str:
    """The config text with each token set inside the block-style
    ``appservice:`` section (replacing the key's value where the key is there,
    else appended to the section), or in a new section at the end.  Unusual
    layouts may come out wrong: the caller checks the result reads back right."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _TOP_KEY.match(line.rstrip("\r\n"))), None)
    if start is None:
        tail = "" if not text or text.endswith("\n") else "\n"
        block = "".join(f'  {key}: "{value}"\n' for key, value in tokens.items())
        return f"{text}{tail}appservice:\n{block}"
    # The section runs until the next line that starts at column 0 (comments
    # at column 0 included, so appended keys land above them).
    end = start + 1
    while end < len(lines) and (lines[end].strip() == "" or lines[end][0] in " \t"):
        end += 1
    children = [(i, m) for i in range(start + 1, end) if (m := _CHILD.match(lines[i]))]
    indent = children[0][1]["indent"] if children else "  "
    pending = dict(tokens)
    for i, match in children:
        if match["key"] in pending and match["indent"] == indent:
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = f'{indent}{match["key"]}: "{pending.pop(match["key"])}"{newline}'
    if pending:
        last = max((i for i in range(start, end) if lines[i].strip()), default=start)
        if not lines[last].endswith("\n"):
            lines[last] += "\n"
        lines[last + 1:last + 1] = [f'{indent}{key}: "{value}"\n' for key, value in pending.items()]
    return "".join(lines)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` whole with ``text``, readable by its owner only (a
    symlinked config is replaced where it leads)."""
    replace_whole(path.resolve(), text.encode("utf-8"), mode=0o600)
