"""``askwright-bridge store migrate -c CONFIG --to postgresql://…``: the
SQLite store (``store.path``) copied into an empty PostgreSQL database and
verified.  The bridge must be stopped; the command says so if it is not.

Exit 0 when copied and verified, 1 when the copy failed or did not verify,
2 when the config can't be used, the bridge is running, a bridge runs on the
target or the target is not empty.  The password may be in the URL or in ASKWRIGHT_BRIDGE_STORE_PASSWORD.

``askwright-bridge store move-sets -c CONFIG --from OLD_ROOT``: the sets were
moved from OLD_ROOT to the config's ``sets.root`` (a new disk, another mount
path); the store's paths are moved with them (``storage/setpaths.py``).  Exit
0 when moved, 2 when the config can't be used, a bridge runs on the store, or
there is nothing to move.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from bridge.service.config import ConfigError, load_config
from bridge.service.storage.runlock import StoreBusy, hold
from bridge.service.storage.setpaths import MoveRefused, move_sets
from bridge.service.storage.store import Store, StoreVersionError
from bridge.service.storage.storecopy import CopyRefused, copy_store


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("store",
                                   help="manage the bridge's store (migrate it to PostgreSQL, move the sets' paths)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    migrate = actions.add_parser(
        "migrate", help="copy the SQLite store into an empty PostgreSQL database and verify the copy",
        description="Copy the SQLite store at store.path into an empty PostgreSQL database, then verify it "
                    "(rows per table, a checksum of the answer log).  Stop the bridge first.  Then set "
                    "store.url in the config to the same URL.")
    migrate.add_argument("-c", "--config", required=True, help="the bridge's YAML config file")
    migrate.add_argument("--to", required=True, metavar="URL", help="postgresql://user@host:port/database")
    move = actions.add_parser(
        "move-sets", help="the sets moved from another root to sets.root: move the store's paths with them",
        description="The store knows each set by its folder's path.  After moving the sets folder (and setting "
                    "sets.root to the new place), run this with the old root, with every bridge on the store "
                    "stopped: the questions stay posted and keep their answers, none is posted again.")
    move.add_argument("-c", "--config", required=True, help="the bridge's YAML config file")
    move.add_argument("--from", dest="old_root", required=True, metavar="OLD_ROOT",
                      help="the sets root the sets were posted from")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.action == "move-sets":
        return _move_sets(args)
    return _migrate(args)


def _migrate(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        return _say(str(exc), 2)
    if not args.to.startswith(("postgresql://", "postgres://")):
        return _say("--to must be a postgresql:// URL", 2)
    from bridge.service.storage.pgdialect import redact

    target = redact(args.to)
    if config.store.url:
        # The bridge runs on PostgreSQL already: the SQLite file kept beside
        # it is the store as it was at the first move, and copying it would
        # hand back a store without everything written since.
        return _say(f"the store is on PostgreSQL already ({redact(config.store.url)}); store migrate copies the "
                    f"SQLite store at store.path, which is no longer the bridge's (move a PostgreSQL database "
                    f"with pg_dump and pg_restore)", 2)
    if not config.store.path.is_file():
        # Said before the lock is taken: taking it makes the folder and a
        # .lock file, left behind by a mistyped store.path.
        return _say(f"store.path: {config.store.path}: there is no SQLite store to copy", 2)
    try:
        lock = hold(config.store.path)
    except StoreBusy as exc:
        return _say(f"the bridge is running: {exc}; stop it before migrating the store", 2)
    except OSError as exc:  # its folder not writable by this user, a file where a folder should be
        return _say(f"store.path: {config.store.path}: can't be used ({exc.strerror or exc})", 2)
    password = os.environ.get("ASKWRIGHT_BRIDGE_STORE_PASSWORD") or config.store.password
    try:
        report = copy_store(config.store.path, args.to, password)
    except (CopyRefused, StoreVersionError) as exc:
        return _say(str(exc), 2 if "verification" not in str(exc) else 1)
    except sqlite3.Error as exc:
        return _say(f"copying to {target} failed: {exc}", 1)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL's own (psycopg, loaded only for this): run it again
        return _say(f"copying to {target} failed ({type(exc).__name__}: {exc}); nothing of it was kept, "
                    "so the same command can be run again", 1)
    finally:
        lock.close()
    width = max(len(t) for t in report.counts)
    for table, count in report.counts.items():
        print(f"{table:<{width}}  {count} rows")
    for table, count in report.nuls.items():
        print(f"{table}: {count} rows held a NUL character, which PostgreSQL can't store; written with U+FFFD")
    print(f"answer log checksum: {report.log_checksum} (the same on both sides)")
    print(f"copied {config.store.path} to {target} and verified it; now set store.url to that URL "
          "and start the bridge")
    return 0


def _move_sets(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        return _say(str(exc), 2, "move-sets")
    lock = None
    try:
        try:  # (opening it for writing would make an empty store there, which knows no set)
            Store.read_only(config.store.path, url=config.store.url, password=config.store.password).close()
        except FileNotFoundError:
            return _say(f"there is no store at {config.store.where}; is {args.config} the bridge's config?", 2,
                        "move-sets")
        if config.store.url:
            from bridge.service.storage.leader import instances

            running = instances(config.store.url, config.store.password)
            if running:
                return _say(f"instance {running[0]['id']} ({running[0]['role']}) was heard from "
                            f"{running[0]['seen_seconds_ago']} s ago; stop every instance first", 2, "move-sets")
        else:
            lock = hold(config.store.path)
        store = Store(config.store.path, url=config.store.url, password=config.store.password)
    except StoreBusy as exc:
        return _say(f"the bridge is running: {exc}; stop it first", 2, "move-sets")
    except Exception as exc:  # noqa: BLE001 - sqlite3's, psycopg's (PostgreSQL away), a newer store
        if lock is not None:
            lock.close()
        return _say(f"cannot open {config.store.where} ({exc})", 2, "move-sets")
    new_root = str(Path(config.sets.root).resolve())
    old_root = os.path.normpath(os.path.abspath(args.old_root))
    try:
        moved = move_sets(store, old_root, new_root)
    except MoveRefused as exc:
        return _say(str(exc), 2, "move-sets")
    finally:
        store.close()
        if lock is not None:
            lock.close()
    print(f"moved {moved} set folder{'s' if moved != 1 else ''} from {old_root} to {new_root} in the store; "
          "start the bridge")
    return 0


def _say(message: str, code: int, action: str = "migrate") -> int:
    print(f"askwright-bridge store {action}: {' '.join(message.split())}", file=sys.stderr)
    return code
