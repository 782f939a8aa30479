"""Signing checkpoints of the answer log and putting them into the rooms.

The thin I/O shell around ``protocol/checkpoint.py``: whenever the log grew,
at most every ``audit.checkpoint_every``, the tree head is signed, kept in
the store and put as the state event ``dev.superpipeline.answer_log.checkpoint``
(state key: the log's origin) in every room the bridge posts in, so every
member's homeserver keeps the history of checkpoints.  The tree's right edge
is kept in memory (the compact range: one hash per set bit of the size), so
a checkpoint costs the new leaves, not the whole log; it is read once, at
start.  A room that refuses the state event (the bridge lacks the power
level there) is told in the log and skipped; the others still get it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Any, Awaitable, Callable, Iterable

from pathlib import Path

from bridge.service.logs import in_a_line
from bridge.service.eventwait import set_within
from bridge.protocol import merkle
from bridge.service.auditing.keys import LogKey, LogKeyError, check_present, check_same, load_or_create
from bridge.service.auditing.witness import keep_witness, read_witness
from bridge.service.storage.dialect import LeaseLost
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

STATE_TYPE = "dev.superpipeline.answer_log.checkpoint"


def origin_for(user_id: str) -> str:
    """The log's default origin: the bridge's server, then its user (no spaces, no '+')."""
    localpart, _, server = user_id[1:].partition(":")
    return f"{server}/askwright-bridge/{localpart}".replace("+", "-").replace(" ", "-")


class LogDamaged(Exception):
    """The log in the store is not the one the bridge signed: a leaf is
    missing, or the leaves under its latest checkpoint hash to another root."""


class CompactRange:
    """The perfect subtrees of the tree's left-to-right edge: append and root in O(log n)."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []

    def append(self, leaf_hash: bytes) -> None:
        height, node = 0, leaf_hash
        while self._stack and self._stack[-1][0] == height:
            node = merkle.node_hash(self._stack.pop()[1], node)
            height += 1
        self._stack.append((height, node))
        self.size += 1

    def root(self) -> bytes:
        if not self._stack:
            return merkle.EMPTY_ROOT
        node = self._stack[-1][1]
        for _h, left in reversed(self._stack[:-1]):
            node = merkle.node_hash(left, node)
        return node


def state_content(note: str, key: LogKey, size: int) -> dict[str, Any]:
    return {"origin": key.origin, "size": size, "checkpoint": note, "key": key.verifier_key}


class Checkpointer:
    def __init__(self, store: Store, key: "LogKey | LogPlan", every_seconds: float,
                 put_state: Callable[[str, str, str, dict[str, Any]], Awaitable[Any]] | None = None,
                 rooms: Callable[[], Iterable[str]] = lambda: (), witness: Path | None = None):
        self.store = store
        self._key = key
        self.every = every_seconds
        self.put_state = put_state
        self.rooms = rooms
        self.tree = CompactRange()
        self._published: dict[str, int] = {}  # room -> size last put there
        self._refused: set[str] = set()
        self._broken: LogDamaged | None = None  # what was found wrong with the log: nothing is signed over it
        self._said_broken = False
        self.witness = witness  # where the latest checkpoint is kept beside the key (``witness.py``)
        self._witnessed = 0  # the size it holds
        self._said_unkept = False

    @property
    def key(self) -> LogKey:
        if not isinstance(self._key, LogKey):
            key = self._key.key(self.store)
            signed_with = self.store.get_meta("audit_key")
            if signed_with is not None and signed_with != key.verifier_key:
                raise LogKeyError(f"the answer log's key file holds another key than the one that signed this "
                                  f"log's checkpoints ({signed_with}); restore that key's file")
            if signed_with is None:
                with self.store.transaction():  # the public key, for exports and agents (never the private one)
                    self.store.set_meta("audit_key", key.verifier_key)
            self._key = key
        return self._key

    def _catch_up(self) -> None:
        """The new leaves into the tree.  The log is only signed on as the
        bridge left it: every index in turn, and (read at start) the leaves
        under the latest checkpoint, the store's and the one kept beside the
        key, hashing to the roots they signed.  A log edited in the store is
        never covered by a new signature."""
        if self._broken is not None:
            raise self._broken  # found at start: the store is not mended under a running bridge
        try:
            signed = self._signed_at_start() if self.tree.size == 0 else {}
            for index, data in self.store.audit.hashes_from(self.tree.size):
                if index != self.tree.size:
                    raise LogDamaged(f"leaf {self.tree.size} is missing from the store (the next one is leaf "
                                     f"{index})")
                self.tree.append(data)
                root, where = signed.get(self.tree.size, (None, ""))
                if root is not None and root != self.tree.root():
                    raise LogDamaged(f"the store's first {self.tree.size} leaves are not those {where} signed")
            most = max(signed, default=0)
            if self.tree.size < most:
                raise LogDamaged(f"the store holds {self.tree.size} leaves, fewer than the {most} "
                                 f"{signed[most][1]} signed")
        except LogDamaged as exc:
            self._broken = exc
            raise

    def _signed_at_start(self) -> dict[int, tuple[bytes, str]]:
        """size -> (root, what signed it) of the checkpoints the leaves must
        make: the store's latest, and the one kept beside the key (the store's
        checkpoints deleted, or the store restored from an older backup)."""
        from bridge.protocol.log_tail import TailRefused, signed_by

        stored = self.store.audit.latest_checkpoint()
        kept = read_witness(self.witness)
        signed: dict[int, tuple[bytes, str]] = {}
        for note, where in ((stored[1] if stored else None, "its latest checkpoint"),
                            (kept, f"the checkpoint kept in {self.witness}")):
            if note is None:
                continue
            try:
                checkpoint = signed_by(note, self.key.origin, self.key.public)
            except TailRefused as exc:
                raise LogDamaged(f"{where}: {exc}") from None
            signed.setdefault(checkpoint.size, (checkpoint.root, where))
            if note is kept:
                self._witnessed = checkpoint.size
        return signed

    def sign_if_grown(self, now_ms: int | None = None) -> tuple[int, str] | None:
        """A new checkpoint when the log grew since the last one (kept in the store); the latest otherwise."""
        self._catch_up()
        latest = self.store.audit.latest_checkpoint()
        if latest is None or latest[0] < self.tree.size:
            latest = self._sign(now_ms) if self.tree.size else None
        if latest is not None:
            self._keep_beside_key(*latest)
        return latest

    def _sign(self, now_ms: int | None) -> tuple[int, str]:
        from bridge.protocol import checkpoint as cp  # cryptography: loaded when first signing

        note = cp.sign_checkpoint(cp.Checkpoint(self.key.origin, self.tree.size, self.tree.root()), self.key.private)
        with self.store.transaction():
            self.store.audit.keep_checkpoint(self.tree.size, note, now_ms or int(time.time() * 1000))
        return self.tree.size, note

    def _keep_beside_key(self, size: int, note: str) -> None:
        if self.witness is None or size <= self._witnessed:
            return
        try:
            keep_witness(self.witness, note)
        except OSError as exc:
            if not self._said_unkept:
                self._said_unkept = True
                log.warning("the answer log's latest checkpoint could not be kept in %s (%s); the store still "
                            "has it, and it is tried again at each checkpoint", self.witness, exc.strerror or exc)
            return
        self._witnessed = size

    async def publish(self, latest: tuple[int, str] | None) -> None:
        if latest is None or self.put_state is None:
            return
        size, note = latest
        for room in list(self.rooms()):
            if self._published.get(room, -1) >= size:
                continue
            try:
                await self.put_state(room, STATE_TYPE, self.key.origin, state_content(note, self.key, size))
            except Exception as exc:  # noqa: BLE001 - one room refusing stops neither the others nor the bridge
                if room not in self._refused:
                    log.warning("the answer log's checkpoint could not be put in %s (%s); the room does not "
                                "hold it until it can be", room, exc)
                    self._refused.add(room)
                continue
            self._refused.discard(room)
            self._published[room] = size

    async def once(self) -> None:
        # Reading the log's new hashes and keeping the checkpoint: a job on the store's thread.
        await self.publish(await self.store.run(self.sign_if_grown))

    async def run(self, stop: asyncio.Event, after: asyncio.Event | None = None) -> None:
        if after is not None:  # the answers waiting at start come first
            waiting = asyncio.ensure_future(after.wait())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            stopping.cancel()
        while not stop.is_set():
            await self._once_said()
            await set_within(stop, self.every)
        await self._once_said()  # what the last minute added is signed before the bridge goes

    async def _once_said(self) -> None:
        try:
            await self.once()
        except LogDamaged as exc:
            if not self._said_broken:
                self._said_broken = True
                log.error("the answer log in the store is not the one this bridge signed: %s. No checkpoint is "
                          "signed over it; answers are still taken and logged. 'askwright-bridge audit export' "
                          "and 'askwright-bridge verify --log' show what changed", exc)
        except LeaseLost:
            # Stepping down (another instance leads now): the new leader signs
            # from here, as after any failover; nothing to alert anyone about.
            log.info("no checkpoint taken: this instance no longer leads the store")
        except sqlite3.OperationalError as exc:
            # The store unreachable, slow or locked (both backends raise this):
            # said in a line, as every other part says it; nothing is lost.
            log.warning("the answer log's checkpoint could not be taken (the store: %s); tried again in %ss",
                        in_a_line(exc), self.every)
        except Exception:  # noqa: BLE001 - the log is in the store; a checkpoint missed is taken next time
            log.exception("the answer log's checkpoint could not be taken; tried again in %ss", self.every)



class LogPlan:
    """Where the log's key is, decided at start before the first batch adds
    leaves: a missing key is made then (the log is empty), an existing one
    is read when the first checkpoint is signed, after the first sync."""

    def __init__(self, path: Path, origin: str, may_create: bool, key: LogKey | None = None):
        self.path, self.origin, self.may_create, self._made = path, origin, may_create, key

    def key(self, store: Store) -> LogKey:
        if self._made is not None:
            return self._made
        return load_or_create(self.path, self.origin, 0 if self.may_create else store.audit.size())


def open_log(store: Store, *, user_id: str, store_path: Any, key_file: str | None) -> LogPlan:
    """The log's origin (kept in the store from the first start on) and its
    key's file; LogKeyError when the file is missing for a log that has leaves."""
    from bridge.service.auditing.keys import key_file as default_key_file

    origin = store.audit_origin()
    if origin is None:
        origin = origin_for(user_id)
        with store.transaction():
            store.set_meta("audit_origin", origin)
    path = default_key_file(Path(store_path), key_file)
    leaves = store.audit.size()
    check_present(path, leaves)
    check_same(path, store.get_meta("audit_key"))
    if not path.exists():
        # Made now, before the first leaf: a bridge killed before its first
        # checkpoint must find its key on the next start.  (Only a first start
        # loads cryptography this early; otherwise the key is read at the first signing.)
        key = load_or_create(path, origin, leaves)
        with store.transaction():
            # Known to the store from now on: a standby started before the first
            # checkpoint is held to the same key at its start, not at the failover.
            store.set_meta("audit_key", key.verifier_key)
        return LogPlan(path, origin, may_create=False, key=key)
    return LogPlan(path, origin, may_create=False)
