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
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bridge.service.config import Config, ConfigError, load_config

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
            print(f"note: {config_path} was rewritten whole; its comments were not kept", file=sys.stderr)
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


def user_namespace(config: Config) -> list[str]:
    """The users the bridge claims: its own user and, reserved for users it may
    act as later, every ``@<id>_...`` user of the server."""
    server = re.escape(config.server_name)
    own = re.escape(config.appservice.sender_localpart)
    return [f"@{own}:{server}", f"@{re.escape(config.appservice.id)}_.*:{server}"]


def registration(config: Config) -> dict[str, Any]:
    settings = config.appservice
    return {
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
    kept = edited is not None and _loads(edited) == wanted
    write_private(path, edited if kept and edited is not None else yaml.safe_dump(wanted, sort_keys=False))
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


def _edit_text(text: str, tokens: dict[str, str]) -> str | None:
    """The config text with each token set inside the block-style
    ``appservice:`` section (replacing an empty key, else appended to the
    section), or a new section at the end.  None when the layout is unusual."""
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
    last_key = start
    indent = "  "
    for i in range(start + 1, end):
        match = _CHILD.match(lines[i])
        if match:
            indent, last_key = match["indent"], i
    pending = dict(tokens)
    for i in range(start + 1, end):
        match = _CHILD.match(lines[i])
        if match and match["key"] in pending and len(match["indent"]) == len(indent):
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = f'{indent}{match["key"]}: "{pending.pop(match["key"])}"{newline}'
    if pending:
        insert_at = last_key + 1
        # Keep a following continuation of the last key (a nested value) with it.
        while insert_at < end and lines[insert_at].strip() and not _CHILD.match(lines[insert_at]) \
                and not lines[insert_at].lstrip().startswith("#"):
            insert_at += 1
        if insert_at > 0 and not lines[insert_at - 1].endswith("\n"):
            lines[insert_at - 1] += "\n"
        lines[insert_at:insert_at] = [f'{indent}{key}: "{value}"\n' for key, value in pending.items()]
    return "".join(lines)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` whole with ``text``, readable by its owner only."""
    path = path.resolve()
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        with _suppress():
            os.unlink(temp)
        raise


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
