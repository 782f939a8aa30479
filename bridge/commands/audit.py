"""``askwright-bridge audit export -c CONFIG -o DIR``: the answer log, for anyone to check.

Writes, into DIR: ``leaves.jsonl`` (leaf i on line i+1, each its RFC 8785
bytes), ``checkpoints/<size>.txt`` (every signed checkpoint the store kept,
and, where the log's key can be read, one over the leaves logged since the
latest, which the bridge signs only every ``audit.checkpoint_every``),
``key.txt`` (the log's verifier key) and ``log.json`` (origin, size).  Safe
while the bridge runs: the store is opened read-only.  ``verify`` reads it.
Exit 0; 2 when the config, the store or DIR can't be used.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from bridge.protocol import merkle
from bridge.service.config import ConfigError, load_config
from bridge.service.storage.store import Store, StoreVersionError

EXIT_OK, EXIT_UNUSABLE = 0, 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "audit", help="export the verifiable answer log (leaves, checkpoints, public key)",
        description="audit export -c CONFIG -o DIR: write the answer log's leaves, its signed checkpoints and its "
                    "public key into DIR, for 'askwright-bridge verify'.  Exit 0; 2 when something can't be used.")
    actions = parser.add_subparsers(dest="audit_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write the log into a folder")
    export.add_argument("-c", "--config", required=True, help="the bridge's YAML config file")
    export.add_argument("-o", "--out", required=True, help="the folder to write (created)")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, secrets=False)
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        store = Store.read_only(config.store.path, url=config.store.url, password=config.store.password)
    except FileNotFoundError:
        return _fail(f"{config.store.where}: there is no store yet (the bridge has not run)")
    except (StoreVersionError, sqlite3.Error) as exc:
        return _fail(f"{config.store.where}: the store can't be read ({exc})")
    try:
        return export(store, Path(args.out), config)
    except sqlite3.Error as exc:
        return _fail(f"{config.store.where}: the store can't be read ({exc})")
    except OSError as exc:
        return _fail(f"{args.out}: can't be written ({exc.strerror or exc})")
    finally:
        store.close()


def export(store: Store, out: Path, config: Any) -> int:
    origin = store.audit_origin()
    vkey = store.get_meta("audit_key")
    if vkey is None and origin is not None:
        from bridge.service.auditing.keys import key_file, read_key

        try:
            vkey = read_key(key_file(Path(config.store.path), config.audit.key_file)).verifier_key
        except (OSError, ValueError) as exc:
            return _fail(f"the log's public key is neither in the store nor readable from its key file ({exc})")
    if origin is None or vkey is None:
        return _fail("the store holds no answer log yet (audit.enabled was off, or the bridge never ran with it)")
    size = store.audit.size()
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    hashes: list[bytes] = []
    damage: str | None = None  # why the leaves are not the log the bridge signs on, if they are not
    with open(out / "leaves.jsonl", "w", encoding="utf-8") as handle:
        for start in range(0, size, 5000):
            for index, leaf, stored in store.audit.leaves_and_hashes(start, start + 5000):
                if len(hashes) == size:
                    # ``size`` leaves only: a running bridge logs on meanwhile, and
                    # the export's files, its log.json and its tail say one size.
                    break
                handle.write(leaf + "\n")
                hashes.append(merkle.leaf_hash(leaf.encode()))
                if damage is None and index != len(hashes) - 1:
                    damage = f"leaf {len(hashes) - 1} is missing from the store"
                elif damage is None and hashes[-1].hex() != stored:
                    damage = f"leaf {index}'s text is not what its stored hash says"
    # A running bridge may sign a checkpoint after the leaves were read: one
    # past them is left out, or the export would read as truncated.  Then no
    # tail is signed either: under the same key it could fork that one (a
    # store cut back below its latest checkpoint reads the same way).
    stored_notes = store.audit.all_checkpoints()
    notes = [(point_size, note) for point_size, note in stored_notes if point_size <= size]
    ahead = max((point_size for point_size, _note in stored_notes), default=0)
    if damage is None and ahead > size:
        damage = (f"the bridge signed {ahead} leaves after the {size} exported were read: export again"
                  if store.audit.size() >= ahead else
                  f"the store holds {size} leaves, fewer than the {ahead} its latest checkpoint signed")
    tail = _sign_tail(hashes, notes, origin, vkey, config, damage)
    if tail is not None:
        notes.append((size, tail))
    for point_size, note in notes:
        (out / "checkpoints" / f"{point_size}.txt").write_text(note, encoding="utf-8")
    (out / "key.txt").write_text(vkey + "\n", encoding="utf-8")
    (out / "log.json").write_text(json.dumps({"origin": origin, "size": size, "checkpoints": len(notes)},
                                             indent=2) + "\n", encoding="utf-8")
    print(f"exported {size} leaves and {len(notes)} checkpoints of {origin} to {out}")
    return EXIT_OK


def _sign_tail(hashes: list[bytes], notes: list[tuple[int, str]], origin: str, vkey: str, config: Any,
               damage: str | None) -> str | None:
    """A checkpoint over the leaves logged since the bridge's latest (it signs
    at most every audit.checkpoint_every): an answer given a moment ago is
    covered, and checks out.  Needs the log's key; without it, says so.
    Never over leaves the bridge would refuse to sign on (``damage``: one
    missing, a text its stored hash does not match): the same key would
    sign another tree than the bridge's."""
    from bridge.protocol.log_tail import TailRefused, sign_tail
    from bridge.service.auditing.keys import LogKeyError, key_file, read_key
    from bridge.service.auditing.witness import read_witness, witness_file

    latest = max(notes, default=(0, None))
    if len(hashes) <= latest[0] and (latest[1] is not None or hashes):
        return None
    # An empty log with no checkpoint: the empty tree's is signed, so records
    # from before the log check out against a log that holds nothing.
    unsigned = (f"the {len(hashes) - latest[0]} leaves logged since the latest checkpoint (size {latest[0]})"
                if hashes else "the empty log")
    if damage is not None:
        return _note(f"{unsigned} are not signed: {damage}")
    path = key_file(Path(config.store.path), config.audit.key_file)
    try:
        key = read_key(path)
        kept = read_witness(witness_file(path))  # the bridge's latest, should the store's be gone
    except (OSError, LogKeyError) as exc:
        return _note(f"{unsigned} are not signed yet, and the log's key can't be read here "
                     f"({getattr(exc, 'strerror', None) or exc}): 'verify' names the records under them until the "
                     "bridge signs them (audit.checkpoint_every); export again then")
    if key.verifier_key != vkey:
        return _note(f"{unsigned} are not signed: the key file holds another key than the log's")
    try:
        tail = sign_tail(hashes, latest[1], origin, key.private, kept)
    except TailRefused as exc:
        return _note(f"{unsigned} are not signed: {exc}")
    if tail is not None:
        _witness(witness_file(path), tail, len(hashes), kept, origin, key)
    return tail


def _witness(path: Path, tail: str, size: int, kept: str | None, origin: str, key: Any) -> None:
    """The tail kept beside the key, as the bridge keeps its own latest
    (``witness.py``): the key signed this tree, so a store restored from a
    backup older than it must not be signed on as another tree of that size."""
    from bridge.protocol.log_tail import signed_by
    from bridge.service.auditing.witness import keep_witness

    if kept is not None and signed_by(kept, origin, key.public).size >= size:
        return
    try:
        keep_witness(path, tail)
    except OSError as exc:
        _note(f"the checkpoint signed could not be kept in {path} ({exc.strerror or exc}); the bridge keeps its own "
              "there when it signs next")


def _note(message: str) -> None:
    print(f"askwright-bridge audit: note: {message}", file=sys.stderr)
    return None


def _fail(message: str) -> int:
    print(f"askwright-bridge audit: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_UNUSABLE
