"""The set folder's ``answers.json`` as a versioned document, pure.

No disk and no clock here: ``file`` reads and writes the bytes, and every
function that changes the document is handed ``now`` (ISO 8601 UTC).  Each
change returns a new document and leaves the one it was given untouched, so
a caller can compare before and after.

The document::

    {"askwright": 1, "set": ..., "rev": <writes so far>, "updated": ...,
     "answers": {<qid>: <record>, ...}}

A record holds at most one pick (``choice`` / ``choices`` / ``order`` /
``text``), an optional note, attachments and timecodes, the revision of the
question answered (``q_rev``), how many answers the question has had
(``rev``), when (``updated``) and where it came from (``source``).
"""

from __future__ import annotations

import time

import copy
import json
import posixpath
from typing import Any

from bridge import strictjson

FORMAT_VERSION = 1

ANSWERED = "answered"
UNSURE = "unsure"
NOTE_ONLY = "note_only"
# PROTOCOL 2a: a quorum question with votes and no decision; a question whose deadline passed undecided.
PENDING = "pending"
EXPIRED = "expired"
STATES = (ANSWERED, UNSURE, NOTE_ONLY, PENDING, EXPIRED)

UNSURE_CHOICE = "unsure"
PICK_FIELDS = ("choice", "choices", "order", "text")

# The server's own limits (question-set format, "What comes back").
MAX_TIMECODES = 50
MAX_TIMECODE_TEXT = 500
MAX_ATTACHMENTS = 20
MAX_NOTE_OR_TEXT = 20_000

# Records are written in this order so the file reads the same way every
# time and diffs stay small; unknown keys (a newer minor writer) follow, sorted.
RECORD_KEY_ORDER = (
    "qid",
    "state",
    "choice",
    "label",
    "side",
    "choices",
    "order",
    "text",
    "matched_guess",
    "guess_revealed_before_pick",
    "note",
    "attachments",
    "attachments_by",
    "timecodes",
    "subject",
    "required",
    "decided_by",
    "votes",
    "expired_at",
    "closed_at",
    "q_rev",
    "rev",
    "updated",
    "source",
    "receipt",
)
DOC_KEY_ORDER = ("askwright", "set", "rev", "updated", "answers")


class AnswersError(ValueError):
    """``answers.json`` (or a record meant for it) breaks the format."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UnsupportedVersion(AnswersError):
    """The file was written in a format version this bridge does not know."""


# --- building ---------------------------------------------------------------


def utc_of_ms(ms: int) -> str:
    """``2026-05-28T20:26:40.999Z``: the form of ``updated``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def empty(set_id: str) -> dict[str, Any]:
    """The document of a set nobody has answered yet (never written: rev 0)."""
    return {"askwright": FORMAT_VERSION, "set": set_id, "rev": 0, "updated": None, "answers": {}}


def state_of(record: dict[str, Any]) -> str:
    """``answered``, ``unsure`` or ``note_only``, from the record's pick fields.

    A record with neither a pick nor a note, attachment or timecode says
    nothing and is refused rather than stored as an empty answer.  A
    ``pending`` or ``expired`` record (PROTOCOL 2a) is what its votes and
    the deadline made it, and holds no pick.
    """
    if record.get("state") in (PENDING, EXPIRED) and not any(record.get(f) is not None for f in PICK_FIELDS):
        return record["state"]
    if record.get("choice") == UNSURE_CHOICE:
        return UNSURE
    if any(record.get(field) is not None for field in PICK_FIELDS):
        return ANSWERED
    if (record.get("note") or "").strip() or record.get("attachments") or record.get("timecodes"):
        return NOTE_ONLY
    raise AnswersError(f"answer to {record.get('qid')!r} has no pick, note, attachment or timecode")


def put_record(doc: dict[str, Any], record: dict[str, Any], now: str) -> dict[str, Any]:
    """A new document with ``record`` as the answer to its question.

    The latest accepted answer wins, so an existing record is replaced.  The
    record's ``rev`` continues from the one it replaces unless the caller
    gives it (the pipeline does after a withdrawal, when it alone knows the
    count); ``state`` and ``updated`` are filled in here.
    """
    qid = record.get("qid")
    return put_records(doc, {qid if isinstance(qid, str) else "": record}, now)


def drop_record(doc: dict[str, Any], qid: str, now: str) -> dict[str, Any]:
    """A new document without the answer to ``qid`` (a withdrawn answer).

    Dropping what is not there changes nothing: the same document comes
    back with the same ``rev``, so the file is not rewritten for nothing.
    """
    return put_records(doc, {qid: None}, now)


def put_records(doc: dict[str, Any], records: dict[str, dict[str, Any] | None], now: str) -> dict[str, Any]:
    """Many changes as one write: each qid gets its record, or loses it for
    ``None``.  ``rev`` rises by one however many records change (a batch of
    answers is one write), and not at all when nothing changes: a record the
    same as the one there but for ``updated`` is no change (a decided
    approval made again at its deadline moved its time, and woke every
    agent waiting for something newer)."""
    _check_now(now)
    prepared: dict[str, dict[str, Any] | None] = {}
    for qid, record in records.items():
        if record is None:
            if qid in doc["answers"]:
                prepared[qid] = None
            continue
        new = _prepared(doc, record, now)
        if not _same_but_its_time(doc["answers"].get(qid), new):
            prepared[qid] = new
    if not prepared:
        return doc
    # Only the answers mapping is rebuilt; untouched records are shared, not
    # copied, so a write costs the same however large the file has grown.
    answers = dict(doc["answers"])
    for qid, record in prepared.items():
        if record is None:
            del answers[qid]
        else:
            answers[qid] = record
    return _bumped({**doc, "answers": answers}, now)


def record_problem(qid: str, record: dict[str, Any]) -> str | None:
    """Why ``record`` can't be written as the answer to ``qid``, or None.

    The same checks a write makes, on the record alone: the writer asks
    this only after a write failed, to tell a record that can never be
    written (set it aside) from a folder that can't be written now (hold
    the set and retry)."""
    try:
        doc = put_records(empty("check"), {qid: record}, "1970-01-01T00:00:00.000Z")
        dumps(doc)
    except (AnswersError, ValueError, TypeError, RecursionError) as exc:
        return str(exc)
    return None
def mirror_records(doc: dict[str, Any], records: dict[str, dict[str, Any] | None], now: str, *,
                   writer: str = "matrix") -> tuple[dict[str, Any], list[str]]:
    """``put_records`` for a writer that rebuilds records from its own log:
    a record another writer put there (its ``source.via`` is not ``writer``)
    is replaced only by a record with a higher ``rev``, and never dropped (a
    withdrawal in the log concerns an answer older than it).  Returns the new
    document and one line per record kept so, for the log."""
    kept: list[str] = []
    changes: dict[str, dict[str, Any] | None] = {}
    for qid, record in records.items():
        present = doc["answers"].get(qid)
        if isinstance(present, dict) and _written_by_other(present, writer):
            theirs, ours = present.get("rev"), (record or {}).get("rev")
            if record is None or not (_is_int(ours) and _is_int(theirs) and ours > theirs):
                kept.append(f"answer to {qid!r}: kept the record written by {_writer(present)} (rev {theirs}); "
                            f"the bridge's {'withdrawal' if record is None else f'rev {ours}'} is older")
                continue
        changes[qid] = record
    return put_records(doc, changes, now), kept


def _written_by_other(record: dict[str, Any], writer: str) -> bool:
    source = record.get("source")
    return not (isinstance(source, dict) and source.get("via") == writer)


def _writer(record: dict[str, Any]) -> str:
    source = record.get("source")
    via = source.get("via") if isinstance(source, dict) else None
    return f"via {via}" if isinstance(via, str) else "another writer"


def _prepared(doc: dict[str, Any], record: dict[str, Any], now: str) -> dict[str, Any]:
    new_record = copy.deepcopy(record)
    qid = new_record.get("qid")
    if not isinstance(qid, str) or not qid:
        raise AnswersError("an answer record needs a non-empty string qid")
    state = state_of(new_record)
    if "state" in new_record and new_record["state"] != state:
        raise AnswersError(f"answer to {qid!r} says state {new_record['state']!r} but its fields make it {state!r}")
    new_record["state"] = state
    if "rev" not in new_record:
        previous = doc["answers"].get(qid)
        new_record["rev"] = (previous["rev"] if previous else 0) + 1
    new_record["updated"] = _answered_at(doc["answers"].get(qid), new_record, now)
    if "timecodes" in new_record and isinstance(new_record["timecodes"], list):
        new_record["timecodes"] = [_rounded(tc) for tc in new_record["timecodes"]]
    _check_record(qid, new_record, f"answer to {qid!r}")
    _check_limits(qid, new_record)
    return _ordered_record(new_record)


def _answered_at(present: Any, new: dict[str, Any], now: str) -> str:
    """``now``, unless only the deadline's close (``closed_at``) changed: a
    close is no new answer, and an agent waiting for one newer than the
    answer it saw (``wait --after``) is not woken by it."""
    if isinstance(present, dict) and isinstance(present.get("updated"), str) and \
            _without(present, "updated", "closed_at") == _without(new, "updated", "closed_at"):
        return present["updated"]
    return now


def _without(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in keys}


def _same_but_its_time(present: Any, new: dict[str, Any]) -> bool:
    return isinstance(present, dict) and _without(present, "updated") == _without(new, "updated")


def _bumped(doc: dict[str, Any], now: str) -> dict[str, Any]:
    doc["rev"] = doc["rev"] + 1
    doc["updated"] = now
    return doc


def _rounded(timecode: Any) -> Any:
    # The server keeps timecodes to 0.01 s; an int stays an int.
    if isinstance(timecode, dict) and isinstance(timecode.get("t"), float):
        return {**timecode, "t": round(timecode["t"], 2)}
    return timecode


# --- serialising ------------------------------------------------------------


def dumps(doc: dict[str, Any]) -> bytes:
    """The document as the bytes of ``answers.json``: stable, indented UTF-8.

    Answers are sorted by question id and every record's keys put in one
    order, so the same document always gives the same bytes.
    """
    ordered = {key: doc[key] for key in DOC_KEY_ORDER}
    ordered["answers"] = {qid: _ordered_record(doc["answers"][qid]) for qid in sorted(doc["answers"])}
    extras = {key: doc[key] for key in sorted(doc) if key not in DOC_KEY_ORDER}
    ordered.update(extras)
    # allow_nan=False: NaN/Infinity are not JSON and other readers would choke.
    return (json.dumps(ordered, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


# qid -> (the record object, its line(s) in the file: key and serialised record)
Fragments = dict[str, tuple[dict[str, Any], str]]


def dumps_reusing(doc: dict[str, Any], fragments: Fragments) -> bytes:
    """``dumps(doc)``, byte for byte, reusing the text of records serialised before.

    json only has a C encoder for compact output; indented output runs in
    Python and costs milliseconds per hundred records.  A write changes a few
    records of the document and shares the rest (``put_records``), so each
    record's text is kept in ``fragments`` beside the very object it was made
    from and reused while that object is still the record (documents are
    never changed in place).  ``fragments`` is updated to match ``doc``.
    """
    answers = doc["answers"]
    pieces = []
    for qid in sorted(answers):
        record = answers[qid]
        known = fragments.get(qid)
        if known is None or known[0] is not record:
            known = (record, f"    {_key(qid)}: {_indented(_ordered_record(record), 2)}")
            fragments[qid] = known
        pieces.append(known[1])
    for gone in fragments.keys() - answers.keys():
        del fragments[gone]
    listed = '{\n' + ",\n".join(pieces) + "\n  }" if pieces else "{}"
    fields = [f"  {_key(key)}: {listed if key == 'answers' else _indented(doc[key], 1)}" for key in DOC_KEY_ORDER]
    fields.extend(f"  {_key(key)}: {_indented(doc[key], 1)}" for key in sorted(doc) if key not in DOC_KEY_ORDER)
    return ("{\n" + ",\n".join(fields) + "\n}\n").encode("utf-8")


def _key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def _indented(value: Any, depth: int) -> str:
    # A value serialised on its own, shifted to ``depth``: what json.dumps
    # writes for it inside the whole document (a JSON string never holds a
    # raw newline, so every newline is a line break of the layout).
    text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
    return text.replace("\n", "\n" + "  " * depth) if depth else text


def _ordered_record(record: dict[str, Any]) -> dict[str, Any]:
    known = {key: record[key] for key in RECORD_KEY_ORDER if key in record}
    known.update({key: record[key] for key in sorted(record) if key not in RECORD_KEY_ORDER})
    return known


# --- parsing and validation -------------------------------------------------


def parse(data: bytes) -> dict[str, Any]:
    """The document in ``data``, checked; ``AnswersError`` says what is wrong.

    Unknown keys are kept (a writer of the same major version may add
    fields); an ``askwright`` version above ours is refused, because a newer
    format may mean something we would misread.
    """
    try:
        value = strictjson.load_object(data, "answers.json")
    except strictjson.NotJson as exc:
        raise AnswersError(str(exc)) from None
    check(value)
    return value


def check_changed(doc: dict[str, Any], checked: dict[str, Any]) -> None:
    """``check(doc)`` for a document made from ``checked``, a document already
    checked: records ``doc`` shares with it (the very same objects) are not
    checked again, so checking a write costs what changed, not the file."""
    _check_fields(doc)
    before = checked.get("answers")
    before = before if isinstance(before, dict) else {}
    for qid, record in doc["answers"].items():
        if before.get(qid) is not record:
            _check_record(qid, record, f"answers.json: answers.{qid}")


def check(doc: dict[str, Any]) -> None:
    """Raise ``AnswersError`` unless ``doc`` is a well-formed document."""
    _check_fields(doc)
    for qid, record in doc["answers"].items():
        _check_record(qid, record, f"answers.json: answers.{qid}")


def _check_fields(doc: dict[str, Any]) -> None:
    version = doc.get("askwright")
    if not _is_int(version):
        raise AnswersError("answers.json: askwright must be the integer format version")
    if version > FORMAT_VERSION:
        raise UnsupportedVersion(
            f"answers.json is format version {version}; this bridge reads version {FORMAT_VERSION} only (upgrade it)"
        )
    if version < 1:
        raise AnswersError(f"answers.json: askwright {version} is not a format version")
    if not isinstance(doc.get("set"), str) or not doc["set"]:
        raise AnswersError("answers.json: set must be a non-empty string")
    if not _is_int(doc.get("rev")) or doc["rev"] < 0:
        raise AnswersError("answers.json: rev must be an integer, 0 or more")
    if doc.get("updated") is not None and not isinstance(doc["updated"], str):
        raise AnswersError("answers.json: updated must be a string")
    if not isinstance(doc.get("answers"), dict):
        raise AnswersError("answers.json: answers must be an object keyed by question id")


def _check_record(qid: str, record: Any, where: str) -> None:
    if not isinstance(record, dict):
        raise AnswersError(f"{where} must be an object")
    if record.get("qid") != qid:
        raise AnswersError(f"{where}: qid must be {qid!r}")
    state = record.get("state")
    if state not in STATES:
        raise AnswersError(f"{where}: state must be one of {', '.join(STATES)}")
    picks = [field for field in PICK_FIELDS if record.get(field) is not None]
    if len(picks) > 1:
        raise AnswersError(f"{where}: holds more than one pick ({', '.join(picks)})")
    _check_types(record, where)
    try:
        derived = state_of(record)
    except AnswersError:
        raise AnswersError(f"{where}: has no pick, note, attachment or timecode") from None
    if derived != state:
        raise AnswersError(f"{where}: state {state!r} does not match its fields")
    for field in ("label", "side"):
        if record.get(field) is not None and "choice" not in picks:
            raise AnswersError(f"{where}: {field} belongs with a choice")


# field -> (test, what it must be); None is accepted for the optional fields.
_FIELD_TYPES: dict[str, tuple[Any, str]] = {
    "choice": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "label": (lambda v: isinstance(v, str), "a string"),
    "side": (lambda v: isinstance(v, str), "a string"),
    "choices": (lambda v: _str_list(v) and len(v) > 0, "a non-empty list of strings"),
    "order": (lambda v: _str_list(v) and len(v) > 0, "a non-empty list of strings"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "matched_guess": (lambda v: isinstance(v, bool), "true or false"),
    "guess_revealed_before_pick": (lambda v: isinstance(v, bool), "true or false"),
    "note": (lambda v: isinstance(v, str), "a string"),
    "attachments": (lambda v: _str_list(v) and all(_is_relative(p) for p in v), "a list of paths inside the set folder"),
    "attachments_by": (lambda v: isinstance(v, dict) and all(_is_relative(p) and isinstance(who, str)
                                                             for p, who in v.items()),
                       "an object: a path of attachments -> a user id"),
    "timecodes": (lambda v: isinstance(v, list) and all(_is_timecode(tc) for tc in v), 'a list of {"t": seconds, "text": string}'),
    "source": (lambda v: isinstance(v, dict), "an object"),
    "subject": (lambda v: isinstance(v, dict) and isinstance(v.get("id"), str) and isinstance(v.get("digest"), str),
                'an object {"id": string, "digest": string}'),
    "votes": (lambda v: isinstance(v, list) and all(_is_vote(x) for x in v),
              'a list of {"sender", "choice", "event_id", "at"} strings'),
    "required": (lambda v: _is_int(v) and v >= 1, "an integer, 1 or more"),
    "decided_by": (lambda v: _str_list(v) and len(v) > 0, "a non-empty list of user ids"),
    "expired_at": (lambda v: isinstance(v, str) and v != "", "an RFC 3339 time"),
    "closed_at": (lambda v: isinstance(v, str) and v != "", "an RFC 3339 time"),
}


def _is_vote(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k), str) for k in ("sender", "choice", "event_id", "at"))


def _check_types(record: dict[str, Any], where: str) -> None:
    for field, (test, what) in _FIELD_TYPES.items():
        value = record.get(field)
        if value is not None and not test(value):
            raise AnswersError(f"{where}: {field} must be {what}")
    for field in ("q_rev", "rev"):
        if not _is_int(record.get(field)) or record[field] < 1:
            raise AnswersError(f"{where}: {field} must be an integer, 1 or more")
    if not isinstance(record.get("updated"), str):
        raise AnswersError(f"{where}: updated must be a string")


def _check_limits(qid: str, record: dict[str, Any]) -> None:
    # Checked on write only: refusing to *read* a file another writer made
    # over a limit would hide the person's answers from the agent.
    where = f"answer to {qid!r}"
    if len(record.get("timecodes") or ()) > MAX_TIMECODES:
        raise AnswersError(f"{where}: at most {MAX_TIMECODES} timecodes")
    if any(len(tc.get("text", "")) > MAX_TIMECODE_TEXT for tc in record.get("timecodes") or ()):
        raise AnswersError(f"{where}: a timecode's text is {MAX_TIMECODE_TEXT} characters at most")
    if len(record.get("attachments") or ()) > MAX_ATTACHMENTS:
        raise AnswersError(f"{where}: at most {MAX_ATTACHMENTS} attachments")
    for field in ("note", "text"):
        if len(record.get(field) or "") > MAX_NOTE_OR_TEXT:
            raise AnswersError(f"{where}: {field} is {MAX_NOTE_OR_TEXT} characters at most")


def _check_now(now: str) -> None:
    if not isinstance(now, str) or not now:
        raise AnswersError("now must be an ISO 8601 UTC time string")


def _is_int(value: Any) -> bool:
    # bool is an int subclass in Python, but true is not a revision.
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_relative(path: str) -> bool:
    # read joins these to the set folder; an absolute path or a climb out
    # would point the agent at a file the person never sent.
    if not path or path.startswith(("/", "\\")) or "\\" in path:
        return False
    return ".." not in posixpath.normpath(path).split("/") and posixpath.normpath(path) != "."


def _is_timecode(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    t = value.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        return False  # NaN fails the range test too
    return isinstance(value.get("text", ""), str)
