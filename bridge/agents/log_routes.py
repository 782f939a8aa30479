"""The answer log for agents over HTTP (issue 32, docs/audit.md).

``GET /v1/log/checkpoint``, ``/v1/log/inclusion?index=I&size=N`` and
``/v1/log/consistency?from=M&to=N`` give hashes only, to any agent: they
say nothing about what was answered.  ``GET /v1/log/leaves?start=&end=``
gives leaves, and an agent gets only those of its own sets (the others are
left out of the list, as another agent's set looks like none).  Proofs are
made from the store's leaf hashes, pure ``protocol/merkle.py``, over a
tree kept and grown with the log: built anew for each request, a log of a
million leaves cost 1.3 s of the store's thread a proof.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from aiohttp import web

from bridge.agents.errors import AgentError, BadRequest, Unprocessable
from bridge.agents.sets import AgentSets
from bridge.protocol import merkle
from bridge.service.storage.auditlog import leaf_sets
from bridge.service.storage.store import Store

MAX_LEAVES = 1000

log = logging.getLogger(__name__)


class NoLog(AgentError):
    """Nothing to give yet: the log is off, or no checkpoint was signed (404, not a server fault)."""

    status = 404
    code = "no_log"


class LogRoutes:
    def __init__(self, store: Store, sets: AgentSets):
        self.store = store
        self.sets = sets
        self._tree = merkle.Tree()  # the log's leaves read so far (only on the store's thread)
        # The leader's checkpointer signing what the log holds (on the store's
        # thread); None where nothing signs (the log off, no bridge here).
        self.signer: Callable[[], Any] | None = None

    def sign_new_leaves(self) -> None:
        """On the store's thread: a checkpoint over the leaves logged since the
        latest.  The bridge signs on its own only every audit.checkpoint_every;
        an agent asking right after its answer gets one covering it (the rooms
        get it on their schedule)."""
        if self.signer is None:
            return
        try:
            self.signer()
        except Exception as exc:  # noqa: BLE001 - a log damaged, no key, the lease lost, the store refusing:
            # the checkpoints' task says each where it matters; the agent gets the latest kept.
            log.info("no checkpoint signed for an agent (%s); the latest kept is given", exc)

    def _tree_of(self, size: int) -> merkle.Tree:
        """The tree over at least the first ``size`` leaves (proofs take the size they are for)."""
        if self._tree.size < size:
            self._tree.extend([h for _index, h in self.store.audit.hashes_from(self._tree.size)])
        return self._tree

    def _size(self) -> int:
        size = self.store.audit.size()
        if not self.store.audit_enabled and size == 0:
            raise NoLog("the answer log is off on this bridge (audit.enabled)")
        return size

    # Each route is one job on the store's thread (it reads the store): the event loop answers others meanwhile.

    async def checkpoint(self, request: web.Request, agent: str) -> web.Response:
        return web.json_response(await self.store.run(self._checkpoint, request, agent))

    async def inclusion(self, request: web.Request, agent: str) -> web.Response:
        return web.json_response(await self.store.run(self._inclusion, request, agent))

    async def consistency(self, request: web.Request, agent: str) -> web.Response:
        return web.json_response(await self.store.run(self._consistency, request, agent))

    async def leaves(self, request: web.Request, agent: str) -> web.Response:
        # Which sets are the agent's reads every set folder's owner file: in
        # the agent's own turn, never on the store's thread, where answers
        # wait to be made durable (one agent's folders cost everyone there).
        own = await self.sets.apart.run(agent, self.sets.log_starts, agent)
        return web.json_response(await self.store.run(self._leaves, request, own))

    def _checkpoint(self, _request: web.Request, _agent: str) -> dict[str, Any]:
        self._size()
        self.sign_new_leaves()
        latest = self.store.audit.latest_checkpoint()
        if latest is None:
            raise NoLog("no checkpoint signed yet; ask again in a minute")
        return {"ok": True, "origin": self.store.audit_origin(), "size": latest[0],
                "checkpoint": latest[1], "key": self.store.get_meta("audit_key")}

    def _inclusion(self, request: web.Request, _agent: str) -> dict[str, Any]:
        index, size = _int(request, "index"), _int(request, "size")
        now = self._size()
        if not 0 <= index < size <= now:
            raise Unprocessable(f"need 0 <= index < size <= {now} (the tree's size now)")
        tree = self._tree_of(size)
        return {"ok": True, "index": index, "size": size, "leaf_hash": tree.levels[0][index].hex(),
                "root": tree.root(size).hex(), "proof": [p.hex() for p in tree.inclusion_proof(index, size)]}

    def _consistency(self, request: web.Request, _agent: str) -> dict[str, Any]:
        first, second = _int(request, "from"), _int(request, "to")
        now = self._size()
        if not 0 < first <= second <= now:
            raise Unprocessable(f"need 0 < from <= to <= {now} (the tree's size now)")
        tree = self._tree_of(second)
        proof = tree.consistency_proof(first, second)
        return {"ok": True, "from": first, "to": second, "root_from": tree.root(first).hex(),
                "root_to": tree.root(second).hex(), "proof": [p.hex() for p in proof]}

    def _leaves(self, request: web.Request, own: dict[str, int]) -> dict[str, Any]:
        """``own``: the asking agent's sets, where each begins in the log (``log_starts``)."""
        tree = self._size()
        start = _int(request, "start", 0)
        end = _int(request, "end", min(tree, start + MAX_LEAVES))
        if not 0 <= start <= end or end - start > MAX_LEAVES:
            raise Unprocessable(f"need 0 <= start <= end, at most {MAX_LEAVES} leaves a request")
        if start > tree:
            raise Unprocessable(f"need start <= {tree} (the tree's size now)")
        rows = self.store.audit.leaves(start, min(end, tree))
        sets = leaf_sets(rows)
        return {"ok": True, "start": start, "end": min(end, tree), "size": tree, "leaves": [
            {"index": index, "leaf": leaf} for index, leaf in rows
            if sets.get(index) in own and index >= own[sets[index]]]}


def _int(request: web.Request, name: str, default: int | None = None) -> int:
    value: Any = request.query.get(name)
    if value is None:
        if default is None:
            raise BadRequest(f"{name} is required")
        return default
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 100):
        raise BadRequest(f"{name} must be a whole number")
    # A whole number of many digits (the contract takes 100) is past any
    # tree: the bounds refuse it (422, as docs/audit.md says), not a 400.
    return int(value)
