"""One leaf of the answer log: what was decided, and on what grounds.

Pure.  A leaf is the RFC 8785 canonical JSON (JCS) of the object built here,
so anyone can rebuild its bytes from the same facts and get the same leaf
hash; docs/audit.md defines every field.  The ``rfc8785`` package does the
canonicalisation (numbers, key order and string escapes exactly as the RFC
says) of anything but the values on which ``json`` writes the same bytes
(``canonical``), rather than a hand-rolled ``json.dumps`` that agrees most of
the time.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

LEAF_VERSION = 1

# The fields of an answers.json record that say what the person answered (a
# pick's own): what the leaf's ``answer_sha256`` covers.  Notes, files and
# timecodes added later are their own leaves (outcome ``annotated``), and
# ``label`` / ``updated`` / ``rev`` / ``source`` are the bridge's bookkeeping.
ANSWER_FIELDS = ("qid", "state", "choice", "choices", "order", "text", "subject", "q_rev")
# What an annotation adds to a record.
ANNOTATION_FIELDS = ("note", "attachments", "timecodes")
# What an approval's outcome (``decided``, ``expired``) says of the question:
# the decision itself, so a record can't swap it for another the votes in
# the log would also allow (a veto someone once picked, fewer deciders).
# Not ``votes``: a decider may change their vote after the decision.
OUTCOME_FIELDS = ("qid", "state", "choice", "decided_by", "required", "subject", "q_rev")
_FIELDS_OF = {"annotated": ANNOTATION_FIELDS, "decided": OUTCOME_FIELDS, "expired": OUTCOME_FIELDS}


class LeafError(ValueError):
    """Bytes that are not a leaf of this log."""


def canonical(value: Any) -> bytes:
    """The RFC 8785 bytes of ``value``.  ``rfc8785`` is pure Python (24 us for
    a leaf, twice an answer).  On strings, safe integers, booleans, nulls,
    lists and objects whose keys hold no character from U+E000 up, ``json``
    (in C, 6 us) writes the same bytes: the same escapes (both follow the
    RFC's reference code), no spaces, and keys sorted by code point, which is
    their UTF-16 order below U+E000 (past it, U+10000 and up sort before
    U+E000 in UTF-16).  Anything else, floats and lone surrogates among it,
    goes to ``rfc8785``, which writes it or refuses it as it always did
    (``tests/unit/test_canonical_json.py`` holds the two to the same bytes)."""
    if _json_writes_it(value):
        try:
            return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
        except (UnicodeEncodeError, RecursionError):
            pass  # a lone surrogate, or nested past json's depth: rfc8785's own answer
    return rfc8785.dumps(value)


# The integers JCS can write exactly (ECMAScript numbers), as ``rfc8785`` bounds them.
_SAFE_INTEGER = 2**53 - 1
_WALKED_AT_MOST = 100_000  # values, beyond which ``rfc8785`` decides (no cycle walks forever)


def _json_writes_it(value: Any) -> bool:
    pending, walked = [value], 0
    while pending:
        walked += 1
        if walked > _WALKED_AT_MOST:
            return False
        item = pending.pop()
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -_SAFE_INTEGER <= item <= _SAFE_INTEGER:
                continue
            return False
        if kind is list:
            pending.extend(item)
        elif kind is dict:
            for key in item:
                if type(key) is not str or (key and max(key) >= "\ue000"):
                    return False
            pending.extend(item.values())
        else:
            return False
    return True


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_sha256(content: dict[str, Any]) -> str:
    """The question event's content as posted, hashed over its canonical JSON:
    what anyone reading the event from the room can hash again.  Content JCS
    can't express (an integer past 2^53 that an old posting carried) is hashed
    over its sorted compact JSON instead, so an answer to it is still logged.

    Every answer's leaf hashes its question's content, the same few kilobytes
    each time, and ``rfc8785`` is pure Python (0.1 to 0.3 ms a question, more
    than the rest of the leaf): the hash is kept by the content's plain JSON
    text, which ``json`` writes in C.  Equal text is an equal JSON value, so
    the hash kept is the one ``_content_sha256`` would give again."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=True)
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    except (TypeError, ValueError, RecursionError):
        return _content_sha256(content)  # nothing JSON can write: as before, uncached
    found = _content_hashes.get(key)
    if found is None:
        found = _content_sha256(content)
        if len(_content_hashes) >= _CONTENT_HASHES_KEPT:
            _content_hashes.clear()  # the questions answered now are few: the next ones fill it again
        _content_hashes[key] = found
    return found


# sha256 of a question content's JSON text -> its content_sha256 (plain dict
# operations: safe from the store's thread and the event loop's at once).
_content_hashes: dict[bytes, str] = {}
_CONTENT_HASHES_KEPT = 1024


def _content_sha256(content: dict[str, Any]) -> str:
    try:
        return sha256_hex(canonical(content))
    except Exception:  # noqa: BLE001 - rfc8785's domain errors: the fallback is stated in docs/audit.md
        return sha256_hex(json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def answer_fields(record: dict[str, Any], outcome: str = "accepted") -> dict[str, Any]:
    return {k: record[k] for k in _FIELDS_OF.get(outcome, ANSWER_FIELDS) if k in record}


def answer_sha256(record: dict[str, Any] | None, outcome: str = "accepted") -> str | None:
    return None if record is None else sha256_hex(canonical(answer_fields(record, outcome)))


def build_leaf(*, outcome: str, set_id: str | None, room_id: str, event_id: str, sender: str, ts: int,
               via: str | None = None, question: dict[str, Any] | None = None,
               question_event_id: str | None = None, replaces: str | None = None,
               device: dict[str, Any] | None = None, record: dict[str, Any] | None = None,
               reason: str | None = None) -> dict[str, Any]:
    """The leaf object.  ``question``: the posted question's content (its id,
    rev, subject and hash are taken from it), None when the outcome is about
    no question.  ``device``: {"device_id", "cross_signed"} in encrypted rooms."""
    q = question.get("question") if isinstance(question, dict) else None
    subject = question.get("subject") if isinstance(question, dict) else None
    about = None
    if isinstance(q, dict):
        about = {"id": q.get("id"), "rev": q.get("rev"), "event_id": question_event_id,
                 "content_sha256": content_sha256(question)}
        quorum = posted_quorum(q)
        if quorum is not None:
            about["quorum"] = quorum
    return {
        "v": LEAF_VERSION,
        "outcome": outcome,
        "set": set_id,
        "question": about,
        "subject": subject if isinstance(subject, dict) else None,
        "sender": sender,
        "device": None if device is None else {"device_id": device.get("device_id"),
                                                "cross_signed": bool(device.get("cross_signed"))},
        "room_id": room_id,
        "event_id": event_id,
        "ts": ts,
        "via": via,
        "replaces": replaces,
        "reason": reason,
        "answer_sha256": answer_sha256(record, outcome),
    }


def posted_quorum(question: dict[str, Any]) -> dict[str, Any] | None:
    """A posted question's quorum as its leaves carry it, ``{"required",
    "veto"}``, None without one.  A vote's leaf hashes exactly what one
    person's answer would, and the content it answered is only a hash: this
    is what tells an auditor, from the log alone, that the answer was a vote
    and its question's record a tally (questions.json can be edited).  Only
    an approval's leaves carry it, so every other leaf is as it always was.
    The one reading of a posted quorum: ``RecordedQuestion.quorum``, what the
    bridge counts, is this (its veto as a set), so the two can't drift apart
    (a ``veto`` that is no list is none here; read on its own, a string's
    letters were counted as vetoes).  The leaf keeps the veto's posted order,
    so its bytes are what they always were."""
    value = question.get("quorum")
    required = value.get("required") if isinstance(value, dict) else None
    if not isinstance(required, int) or isinstance(required, bool) or required < 1:
        return None
    veto = value.get("veto") if isinstance(value.get("veto"), list) else []
    return {"required": required, "veto": [v for v in veto if isinstance(v, str)]}


def parse_leaf(data: bytes) -> dict[str, Any]:
    """A leaf's bytes back as its object; LeafError when they are not one
    (not JSON, not canonical, not this version)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LeafError(f"not JSON: {exc}") from None
    except RecursionError:
        raise LeafError("not JSON this parser can read: nested too deep") from None
    if not isinstance(value, dict) or value.get("v") != LEAF_VERSION:
        raise LeafError("not a version 1 leaf")
    try:
        again = canonical(value)
    except Exception as exc:  # noqa: BLE001 - whatever rfc8785 refuses, the leaf is not one
        raise LeafError(f"not canonical JSON: {exc}") from None
    if again != data:
        raise LeafError("not in canonical form (RFC 8785)")
    return value
