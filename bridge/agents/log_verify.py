"""The MCP ``verify`` tool: one of the agent's sets checked against the answer log.

The same check as ``askwright-bridge verify`` (``protocol/audit_verify.py``):
the set's answers.json against the store's leaves, under the checkpoints the
store kept and any the agent saved and passes in (signed notes), with the
log's public key.  The agent who wants to trust nothing the bridge says
runs ``verify`` itself on an export; this tool is the quick look.
"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path
from typing import Any, Callable

from bridge.agents.errors import AgentError, BadRequest
from bridge.agents.sets import AgentSets
from bridge.protocol import audit_verify, checkpoint as cp
from bridge.questionset.load import LoadError, parse_json
from bridge.questionset.setdir import QUESTIONS_FILE
from bridge.service.storage.store import Store


class NoLog(AgentError):
    status = 404
    code = "no_log"


# Leaves read a slice per job on the store's thread: a batch of answers waits
# for one slice at most, however long the log.
LEAVES_PER_JOB = 5000


async def verify_tool(sets: AgentSets, store_of: Callable[[], Store | None], agent: str, set_id: str,
                      saved: list[str], sign: Callable[[], None] | None = None) -> dict[str, Any]:
    """The check, off the event loop: a long log (every agent's leaves are
    read and hashed) costs the asking agent time, never the rooms, /health
    or the other agents.  One at a time: each holds the whole log (its
    leaves, parsed, and its tree), and three at once over 400,000 leaves
    took the bridge from 120 MB to 4 GB.  ``sign``: the leader's signing of
    the leaves logged since the latest checkpoint (an answer given a moment
    ago is covered, not named as outside the log)."""
    async with _one_at_a_time():
        return await _verify(sets, store_of, agent, set_id, saved, sign)


_TURN: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]" = weakref.WeakKeyDictionary()


def _one_at_a_time() -> asyncio.Lock:
    """The running loop's turn (a lock is bound to the loop it first waited on)."""
    return _TURN.setdefault(asyncio.get_running_loop(), asyncio.Lock())


async def _verify(sets: AgentSets, store_of: Callable[[], Store | None], agent: str, set_id: str,
                  saved: list[str], sign: Callable[[], None] | None) -> dict[str, Any]:
    set_dir = sets.set_dir(agent, set_id)
    store = store_of()
    if store is None:
        raise NoLog("the bridge has no answer log yet")
    for _try in range(2):
        logged = await store.run(store.audit.size)  # before answers.json is read: see below
        doc, twice = await asyncio.to_thread(_answers_of, set_dir, set_id)
        questions = await asyncio.to_thread(_questions_of, set_dir)
        if sign is not None:
            await store.run(sign)
        vkey = await store.run(store.get_meta, "audit_key")
        if vkey is None:
            raise NoLog("no checkpoint signed yet; ask again in a minute")
        origin, public = cp.parse_verifier_key(vkey)
        # The checkpoints before the leaves: an answer logged and signed
        # between two reads then only adds a leaf past them, where read the
        # other way it added a checkpoint past the leaves read (a truncation).
        notes = [note for _size, note in await store.run(store.audit.all_checkpoints)] + list(saved)
        size = await store.run(store.audit.size)
        leaves: list[bytes] = []
        for start in range(0, size, LEAVES_PER_JOB):
            leaves += [leaf.encode() for _i, leaf in await store.run(store.audit.leaves, start,
                                                                     start + LEAVES_PER_JOB)]
        verdict = await asyncio.to_thread(audit_verify.verify_set, doc, leaves, notes, origin, public, questions)
        # An answer logged while this read replaces a record of the
        # answers.json read a moment before it was written again: checked
        # once more, with the file as it is now.
        if verdict.holds or twice or await store.run(store.audit.size) == logged:
            break
    verdict.problems[:0] = twice
    return {"ok": True, "set": set_id, "holds": verdict.holds, "problems": verdict.problems,
            "records": verdict.checked_records, "leaves": verdict.leaves, "checkpoint_size": verdict.checkpoint_size,
            "before_the_log": verdict.before_the_log, "key": vkey}


def _questions_of(set_dir: Path) -> Any:
    """The set's questions.json, as ``verify`` reads it: which questions need
    a quorum (a pending approval's record rewritten as a plain answer held
    here, though the command named it).  None when it can't be read."""
    try:
        return parse_json((set_dir / QUESTIONS_FILE).read_bytes())
    except (OSError, ValueError, RecursionError, LoadError):
        return None


def _answers_of(set_dir: Path, set_id: str) -> tuple[Any, list[str]]:
    """The set's answers.json, and what it names twice (``read_answers``)."""
    try:
        return audit_verify.read_answers((set_dir / "answers.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"set": set_id, "answers": {}}, []
    except (OSError, ValueError, RecursionError) as exc:
        raise BadRequest(f"answers.json of {set_id} can't be read ({exc})") from None
