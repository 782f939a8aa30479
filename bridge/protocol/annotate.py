"""Notes, files and timecodes added to an answer after it was given.

Pure.  A note the person adds in the question's thread is not a new answer:
it is logged as an *annotation* (a delta: ``note`` / ``attachments`` /
``timecodes``) and folded into the record at projection time, so that
withdrawing a pick falls back to the previous pick with the notes kept, and
withdrawing a note removes just that note.  Every limit of the format is
enforced here, because a record over a limit would be refused on write.
"""

from __future__ import annotations

from typing import Any

from bridge.protocol.notes import MAX_NOTE, MAX_TIMECODES, clip

MAX_ATTACHMENTS = 20
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
        out["note"] = clip(joined, MAX_NOTE)
    files = [f for f in added.get("attachments") or () if isinstance(f, str)]
    if files:
        have = list(out.get("attachments") or ())
        out["attachments"] = (have + [f for f in files if f not in have])[:MAX_ATTACHMENTS]
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


def fold_records(qid: str, rows: list[tuple[str, dict[str, Any]]], accepted_count: int) -> dict[str, Any] | None:
    """The record for ``qid`` from its log rows that still count, oldest first.

    ``rows`` are (outcome, record) with outcome ``accepted`` (a whole record,
    built from the record it replaced) or ``annotated`` (a delta).  The latest
    answer is the base; only annotations after it are folded in, because the
    earlier ones are already part of it.
    """
    start = 0
    base: dict[str, Any] | None = None
    for index, (outcome, record) in enumerate(rows):
        if outcome == "accepted":
            start, base = index + 1, dict(record)
    for outcome, added in rows[start:]:
        if outcome != "annotated":
            continue
        if base is None:
            base = {"qid": qid, "state": NOTE_ONLY, "q_rev": added.get("q_rev", 1), "source": added.get("source", {})}
        base = merge(base, added)
        if base.get("state") == NOTE_ONLY:
            base["q_rev"] = added.get("q_rev", base["q_rev"])
            base["source"] = added.get("source", base["source"])
    if base is None:
        return None
    if base.get("state") == NOTE_ONLY and not (
        (base.get("note") or "").strip() or base.get("attachments") or base.get("timecodes")
    ):
        return None
    # A note is not an answer; a record of notes alone is still the first version.
    base["rev"] = max(accepted_count, 1)
    return base
