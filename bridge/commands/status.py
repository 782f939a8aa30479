"""``askwright-bridge status -c CONFIG [--json]``: how every set stands.

For each set under ``sets.root``: questions posted (from the store),
questions open now, answers (a pick), unsure, notes only, pending (open,
nothing recorded yet, or votes short of a quorum), expired (the deadline
passed undecided) and stale (answering an older revision); then what is held back (sets whose
folder can't be written, events set aside, notices dropped).  A set whose
questions.json has a rev lower than one the bridge posted says so under its
row (lint's "rev went back" warning).  Safe while
the bridge runs: the store is opened read-only and never migrated.  When
the bridge serves /health (metrics or agents on, or appservice mode), its
background tasks are listed too: each one's state and restarts, and the
last error of one that failed (asked of the running bridge, 2 s at most).

Exit 0 (a set that can't be read is a row saying why), 2 when the config
can't be used or the store is from a newer bridge.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import urllib.error
import urllib.request
from typing import Any

from bridge.service.config import ConfigError, load_config
from bridge.service.storage.heldback import format_held, held_back, nothing_held
from bridge.service.operators.setstatus import collect, format_table
from bridge.service.storage.store import Store, StoreVersionError
from bridge.service.supervisor import format_tasks

EXIT_OK = 0
EXIT_CONFIG = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status",
        help="how every set stands: posted, answered, unsure, pending, expired, stale",
        description="For each set under sets.root: questions posted (from the bridge's store), open now, answered "
                    "(a pick), unsure, notes (a note or files, no pick), pending (open and nothing recorded, or votes short of a quorum), expired (its deadline passed undecided) and "
                    "stale (an answer to an older revision).  Exit 0; 2 when the config can't be used.",
    )
    parser.add_argument("-c", "--config", required=True, help="the bridge's YAML config file")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print JSON instead of a table")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        posted, revs, held = _from_store(config.store)
    except StoreVersionError as exc:
        return _fail(str(exc))
    except sqlite3.Error as exc:
        return _fail(f"{config.store.where}: the store can't be read ({exc})")
    rows = collect(config.sets.root, posted, revs)
    running, unread = _instances(config.store)
    tasks = _tasks(config)
    if args.as_json:
        out = {"ok": True, "sets_root": str(config.sets.root), "sets": [row.as_dict() for row in rows],
               "held_back": held}
        if running is not None or unread:
            out["instances"] = running
        if unread:
            out["instances_unread"] = unread
        if health_url(config) is not None:
            # ``bridge_answered`` false: not running, or not answering (frozen); then no task is known.
            out["tasks"] = tasks or {}
            out["bridge_answered"] = tasks is not None
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(format_table(rows) + format_held(held) + _format_instances(running, unread)
                         + _format_tasks(tasks))
    return EXIT_OK


def _from_store(section: Any) -> tuple[dict[str, int], dict[str, dict[str, int]], dict[str, Any]]:
    """Questions posted per set, the highest rev posted per question, and what is held back."""
    try:
        store = Store.read_only(section.path, url=section.url, password=section.password)
    except FileNotFoundError:
        # The bridge has not run yet, or the store key names another store
        # than the one it uses: said on stderr, as every set shows nothing posted.
        key = "store.url" if section.url else "store.path"
        sys.stderr.write(f"askwright-bridge status: no store at {section.where} yet: nothing is counted as "
                         f"posted (the bridge has not run with this config, or {key} names another store)\n")
        return {}, {}, nothing_held()
    try:
        return store.posted_question_counts(), store.highest_posted_revs(), held_back(store)
    finally:
        store.close()


def _instances(section: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The instances sharing a PostgreSQL store (one leader, standbys); None
    on SQLite; and why they could not be read (the sets still are shown)."""
    if not section.url:
        return None, None
    import psycopg

    from bridge.service.storage.leader import instances

    try:
        return instances(section.url, section.password), None
    except psycopg.Error as exc:  # the database gone since the store was read, a role not granted the table
        return None, " ".join(str(exc).split())[:300]


def _format_instances(running: list[dict[str, Any]] | None, unread: str | None = None) -> str:
    if unread:
        return f"instances: can't be read ({unread})\n"
    if running is None:
        return ""
    if not running:
        return "instances: none running\n"
    return "".join(f"instance {row['id']}: {row['role']}" + (f" (epoch {row['epoch']})" if row["role"] == "leader"
                                                              else "") + "\n" for row in running)


def health_url(config: Any) -> str | None:
    """Where the running bridge answers /health; None when it serves none."""
    if config.appservice.enabled:
        listen = config.appservice.listen
    elif config.metrics.enabled or config.agents:
        listen = config.metrics.listen
    else:
        return None
    host, _, port = listen.rpartition(":")
    host = host or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):  # listening everywhere: this machine is one of them
        host = "127.0.0.1"
    return f"http://{host}:{port}/health"


def _tasks(config: Any) -> dict[str, Any] | None:
    """The running bridge's background tasks (its /health), None when it did
    not answer (not running, say); ``{}`` when it serves no /health (see
    ``health_url``: then nothing is asked)."""
    url = health_url(config)
    if url is None:
        return {}
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the bridge's own listener, never a proxy
        with opener.open(url, timeout=2) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503 before it is ready, or as a standby: the body still says
        try:
            body = json.loads(exc.read())
        except ValueError:
            return None
    except (OSError, ValueError):
        return None
    tasks = body.get("tasks") if isinstance(body, dict) else None
    return tasks if isinstance(tasks, dict) else None


def _format_tasks(tasks: dict[str, Any] | None) -> str:
    if tasks is None:
        return "tasks: the bridge did not answer at /health (not running?)\n"
    return format_tasks(tasks) if tasks else ""


def _fail(message: str) -> int:
    print(f"askwright-bridge status: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_CONFIG
