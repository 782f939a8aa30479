"""Notes, files and timecodes added to an answer after it was given.

Pure.  A note the person adds in the question's thread is not a new answer:
it is logged as an *annotation* (a delta: ``note`` / ``attachments`` /
``timecodes``) and folded into the record at projection time, so that
withdrawing a pick falls back to the previous pick with the notes kept, and
withdrawing a note removes just that note.  Every limit of the format is
enforced here, because a record over a limit would be refused on write.
"""

from __future__ import annotations

import re
from typing import Any

from bridge.protocol.graphemes import shorten
from bridge.protocol.notes import MAX_NOTE, MAX_TIMECODES

MAX_ATTACHMENTS = 20
# A record's files sent by anyone but its sender: path -> who sent it.
ATTACHMENTS_BY = "attachments_by"
NOTE_JOINER = "\n\n"
NOTE_ONLY = "note_only"


def delta(*, note: str | None, attachments: list[str], timecodes: list[dict[str, Any]], q_rev: int,
          source: dict[str, Any], now: str) -> dict[str, Any]:
    """What one annotation adds (the log keeps this, not a whole record)."""
    out: dict[str, Any] = {"q_rev": q_rev, "source": dict(source), "updated": now}
    if note:
        out["note"] = note
    if attachments:
        out["attachments"] = list(attachments)
    if timecodes:
        out["timecodes"] = list(timecodes)
    return out


def merge(record: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """``record`` with one annotation folded in, within the format's limits."""
    out = dict(record)
    note = added.get("note")
    if isinstance(note, str) and note.strip():
        earlier = out.get("note")
        joined = earlier + NOTE_JOINER + note if isinstance(earlier, str) and earlier else note
        out["note"] = shorten(joined, MAX_NOTE)
    files = [f for f in added.get("attachments") or () if isinstance(f, str)]
    if files:
        have = list(out.get("attachments") or ())
        out["attachments"] = (have + [f for f in files if f not in have])[:MAX_ATTACHMENTS]
        by = added.get(ATTACHMENTS_BY)
        if isinstance(by, dict):
            kept = {f: who for f, who in by.items() if f in out["attachments"] and isinstance(who, str)}
            if kept:
                out[ATTACHMENTS_BY] = {**(out.get(ATTACHMENTS_BY) or {}), **kept}
    codes = [c for c in added.get("timecodes") or () if isinstance(c, dict)]
    if codes:
        out["timecodes"] = (list(out.get("timecodes") or ()) + codes)[:MAX_TIMECODES]
    return out


def room_left(record: dict[str, Any] | None) -> dict[str, int]:
    """How much more a record can take: the caller refuses an annotation that would not fit."""
    record = record or {}
    return {
        "note": MAX_NOTE - len(record.get("note") or "") - (len(NOTE_JOINER) if record.get("note") else 0),
        "attachments": MAX_ATTACHMENTS - len(record.get("attachments") or ()),
        "timecodes": MAX_TIMECODES - len(record.get("timecodes") or ()),
    }


Position = tuple[int, int]  # (origin_server_ts, arrival): the room's order


def fold_records(qid: str, picks: list[tuple[dict[str, Any], bool, str | None, Position]],
                 notes: list[tuple[dict[str, Any], Position]], accepted_count: int) -> dict[str, Any] | None:
    """The record for ``qid`` from what still stands in its log, in the room's order.

    ``picks``: the accepted answers still standing, latest in the room first,
    each (record, whole, carry_note, position); only the first (the standing
    pick) and, when it has no note of its own, those back to the first one
    with a note are needed.  ``notes``: every annotation still standing
    (a delta: note / attachments / timecodes), in the room's order.

    The record is the standing pick with the notes, files and timecodes of
    every standing annotation folded in, before or after it: a withdrawn
    annotation is simply not there.  A note by anyone but the record's
    sender starts with theirs ("@bo:hs: ..."), and their files are listed
    with it in ``attachments_by``.  A pick without words keeps
    the note of the pick before it (its ``carry_note``: none when that note
    was an option's input).  A ``whole`` pick is a record from before this rule,
    with the annotations before it already folded in: only later ones are
    added to it.
    """
    base: dict[str, Any] | None = None
    added = [delta for delta, _position in notes]
    if picks:
        standing, whole, _carry, position = picks[0]
        base = dict(standing)
        if whole:
            added = [delta for delta, at in notes if at > position]
        else:
            base.pop("attachments", None)
            base.pop(ATTACHMENTS_BY, None)
            base.pop("timecodes", None)
            if not base.get("note"):
                base.pop("note", None)
                kept = _kept_note((standing.get("source") or {}).get("sender"), picks[1:])
                if kept:
                    base["note"] = kept
    # Whose record it is: the standing pick's sender, or, notes alone, the
    # last one's (the record's source).  Another person's note says whose
    # it is, so their words never read as the picker's.
    owner = sender_of(base) if base is not None else (sender_of(added[-1]) if added else None)
    for delta in added:
        if base is None:
            base = {"qid": qid, "state": NOTE_ONLY, "q_rev": delta.get("q_rev", 1), "source": delta.get("source", {})}
        base = merge(base, attributed(delta, owner))
        if base.get("state") == NOTE_ONLY:
            base["q_rev"] = delta.get("q_rev", base["q_rev"])
            base["source"] = delta.get("source", base["source"])
    if base is None:
        return None
    if base.get("state") == NOTE_ONLY and not (
        (base.get("note") or "").strip() or base.get("attachments") or base.get("timecodes")
    ):
        return None
    # A note is not an answer; a record of notes alone is still the first version.
    base["rev"] = max(accepted_count, 1)
    return base


def sender_of(record: dict[str, Any]) -> str | None:
    """Whose a record (or an addition) is: its source's sender."""
    source = record.get("source")
    return source.get("sender") if isinstance(source, dict) else None


def attributed(delta: dict[str, Any], owner: str | None) -> dict[str, Any]:
    """``delta`` saying whose it is when its sender is not ``owner``: its
    note prefixed with them, its files named under them in ``attachments_by``
    (a file in the record reads as the picker's otherwise)."""
    sender = sender_of(delta)
    if not sender:
        return delta
    out = dict(delta)
    note = delta.get("note")
    if isinstance(note, str) and note.strip():
        # One paragraph a note: notes are joined by a blank line, so one
        # inside a note began what read as a note of its own, the picker's
        # or, led by "@carol:hs: ", Carol's.  A note that starts as if
        # someone's is named too, the owner's own.
        note = _BLANK_LINES.sub("\n", note.strip())
        out["note"] = f"{sender}{_NAMED}{note}" if sender != owner or _LOOKS_NAMED.match(note) else note
    if sender == owner:
        return out
    files = [f for f in delta.get("attachments") or () if isinstance(f, str)]
    if files:
        out[ATTACHMENTS_BY] = {f: sender for f in files}
    return out


def note_room_needed(note: str, sender: str, owner: str | None, owner_additions: int) -> int:
    """The room in a record's note that ``note`` by ``sender`` needs, however
    the record's owner changes later (a pick taken back, another's pick):
    every note may come to start with its writer's name, so this one counts
    with its own, and the ``owner_additions`` notes of the record's sender
    now, ``owner`` (nameless while theirs stands), with theirs."""
    reserve = owner_additions * (len(owner) + len(_NAMED)) if owner else 0
    return len(sender) + len(_NAMED) + len(note) + reserve


_NAMED = ": "  # between a note's writer and their words
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_LOOKS_NAMED = re.compile(r"@\S+:\S+: ")  # a user id and the separator, as a named note starts


def _kept_note(sender: str | None, earlier: list[tuple[dict[str, Any], bool, str | None, Position]]) -> str | None:
    # A new pick without words keeps the person's earlier note: it is their
    # data, and a changed mind about the pick rarely retracts the remark.
    # Only their own: another person's pick in between is passed over, and
    # its note is never carried onto this one.
    for record, whole, carry, _position in earlier:
        if (record.get("source") or {}).get("sender") != sender:
            continue
        if whole:
            return None  # a record from before: its note may hold annotations counted on their own
        if record.get("note"):
            return carry
        return None  # the person's earlier answer had no note
    return None
