"""One revision of one question -> the ``dev.superpipeline.question.v2`` content.

Pure: the caller uploads media, picks the elicitation id and the option
order, and sends the result.  The content carries everything a reader needs
to render the question and to judge an answer (PROTOCOL section 2), and
nothing that would spoil it: in a study set neither ``correct`` nor an
option's ``why`` (nor ``rubric`` / ``model_answer``) ever goes out.

Two Matrix limits shape the result:

* Synapse refuses floats and integers of 2**53 or more anywhere in content,
  so times travel as strings plus integer milliseconds and every value goes
  through ``no_floats`` before it leaves.
* An event must stay under 65,536 bytes.  A one-pager never rides in the
  event (it goes to the question's thread; the event only notes that, and
  carries ``one_pager_ref`` when the caller has one).  When the event is
  still too big the readable parts are shortened (``formatted_body`` first,
  then ``body``); only when the structured fields alone cannot fit is
  ``QuestionEventTooLarge`` raised.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocol.deadline import format_rfc3339, is_rfc3339, parse_when
from bridge.protocol.outcome import shown_title
from bridge.protocol.render import (HTML_FORMAT, POLL_STEP, approval_line_html, esc_links, render_body, render_html,
                                    reopened_lines, settled_lines, why_in_brackets)
from bridge.questionset.builtin import OTHER_ID, OTHER_LABEL, UNSURE_ID, UNSURE_LABEL
from bridge.questionset.model import MediaItem, Option, Question, QuestionSet, ShowIf

SUITE_EVENT_TYPE = "dev.superpipeline.question.v2"
SCHEMA_VERSION = 1
TEXT_MAX = 16000
ELICITATION_ID_MAX = 200

# Matrix caps the whole PDU at 65,536 bytes of canonical JSON.  The envelope
# around our content (ids, auth/prev events, hashes, signatures) is usually
# under 1 KB; 2 KB leaves room for a few extra prev_events.
EVENT_MAX_BYTES = 65_536
ENVELOPE_RESERVE = 2_048
CONTENT_MAX_BYTES = EVENT_MAX_BYTES - ENVELOPE_RESERVE
# In an encrypted room the event is the Megolm ciphertext of {type, content,
# room_id} in base64: about 4/3 of the plaintext, with its own keys beside
# it.  A question of 55 KB fit an event in the clear and was refused
# (M_TOO_LARGE) once encrypted: the question never appeared.
ENCRYPTED_CONTENT_MAX_BYTES = (CONTENT_MAX_BYTES - 512) * 3 // 4 - 512

# Largest integer Synapse accepts in content (canonical JSON's safe range).
_SAFE_INT = 2**53 - 1

# Per-string caps tried, in order, when the readable parts are too large.
_SHRINK_LIMITS: tuple[int | None, ...] = (None, 2000, 500, 120, 40)

# Fields of an upload description that may ride on a media item.
_UPLOAD_INT_FIELDS = ("size", "w", "h", "duration_ms")
_UPLOAD_STR_FIELDS = ("url", "mimetype", "thumbnail_url")

_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_DECIMAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:s|sec|secs|seconds?)?\s*$")


class QuestionEventTooLarge(ValueError):
    """The structured fields alone do not fit in one Matrix event."""


# ---------------------------------------------------------------- public helpers


def new_elicitation_id(set_id: str, qid: str, rev: int, salt: str) -> str:
    """A readable, deterministic id for one posting of one revision.

    Uniqueness comes from ``salt`` (the caller's posting key, e.g. room id
    plus a post counter): the same inputs give the same id, which is what
    makes a retried post after a crash recognisable.
    """
    material = json.dumps([set_id, qid, rev, salt], ensure_ascii=False).encode("utf-8")
    digest = hashlib.sha256(material).hexdigest()[:24]
    readable = f"{_ID_CHARS.sub('_', set_id)[:64]}.{_ID_CHARS.sub('_', qid)[:64]}"
    eid = f"elc_{readable}.r{int(rev)}.{digest}"
    return eid if len(eid) <= ELICITATION_ID_MAX else f"elc_{digest}"


def option_order(question: Question, seed: str, mode: str = "study") -> list[str]:
    """The ids of the question's own options in the order to post them.

    A study question is shuffled unless ``shuffle`` is false; a decide set
    keeps the author's order (``mode="decide"``).  The shuffle sorts by a hash
    of seed and id, so it is stable across Python versions and runs.
    """
    ids = [opt.id for opt in question.options or ()]
    if mode != "study" or question.shuffle is False:
        return ids
    return sorted(ids, key=lambda oid: hashlib.sha256(f"{seed}\x00{oid}".encode()).hexdigest())


def no_floats(value: Any) -> Any:
    """A copy of ``value`` safe for Synapse: every float becomes its decimal
    string (or an int when integral), out-of-range integers become strings.

    Our own code never puts a float in; this is the last guard so that a
    float slipping through an extension field cannot get the event refused.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -_SAFE_INT <= value <= _SAFE_INT else str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): no_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [no_floats(v) for v in value]
    raise TypeError(f"{type(value).__name__} cannot go into event content")


def content_size(content: Mapping[str, Any]) -> int:
    """Bytes of ``content`` as Synapse measures it (canonical JSON, UTF-8)."""
    return len(json.dumps(content, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8"))


# ---------------------------------------------------------------- the event


def build_question_event(
    qset: QuestionSet,
    question: Question,
    *,
    elicitation_id: str,
    media: Mapping[str, Mapping[str, Any]] | None = None,
    subject: Mapping[str, str] | None = None,
    one_pager_ref: str | None = None,
    order: Sequence[str] | None = None,
    text_max: int = TEXT_MAX,
    poll: bool = False,
    posted_ms: int | None = None,
    reactions: bool = True,
    max_bytes: int = CONTENT_MAX_BYTES,
) -> dict[str, Any]:
    """The question.v2 content for one posting of ``question``, at most
    ``max_bytes`` of it (``ENCRYPTED_CONTENT_MAX_BYTES`` in an encrypted room).

    ``media`` maps a media item's ``src`` (a figure, which has none, by
    ``"figure:<index>"``) to its upload description ``{url: "mxc://...",
    mimetype, size, w, h, duration_ms, thumbnail_url}``.  ``order`` lists the
    question's own option ids in the order to show them (see
    ``option_order``); the built-ins always come last.  ``poll`` only changes
    the instructions (the caller posts the poll).  ``posted_ms`` is when the
    revision was first posted: a duration in ``expires`` / ``escalate.after``
    counts from it, and the deadline line names the date when it falls on another day.
    """
    if not 1 <= len(elicitation_id) <= ELICITATION_ID_MAX:
        raise ValueError(f"elicitation_id must be 1..{ELICITATION_ID_MAX} characters")
    if not 1 <= text_max <= TEXT_MAX:
        raise ValueError(f"text_max must be 1..{TEXT_MAX}")
    structured: dict[str, Any] = {
        "msgtype": "m.text",
        "body": "",
        "schema_version": SCHEMA_VERSION,
        "suite_event_type": SUITE_EVENT_TYPE,
        "elicitation_id": elicitation_id,
        "set": {"id": qset.id, "title": qset.title, "mode": qset.mode},
        "question": _question_fields(qset, question, media or {}, order, text_max, one_pager_ref),
    }
    structured["question"].update(approval_fields(qset, question, posted_ms))
    # The question asks its answerers by name, so it mentions them on purpose
    # (they are notified, as an approval request should); anyone else it names
    # (an escalation's people, before their time) is not pinged: with
    # ``m.mentions`` present the homeserver's legacy rule matching user ids
    # in the body no longer applies.
    answerers = structured["question"].get("answerers") or []
    structured["m.mentions"] = {"user_ids": list(answerers)} if answerers else {}
    bound = subject if subject is not None else (question.subject.model_dump(include={"id", "digest"}) if question.subject else None)
    if bound is not None:
        structured["subject"] = _subject(bound)
    structured = no_floats(structured)
    return _with_readable_parts(structured, poll=poll, reactions=reactions, max_bytes=max_bytes,
                                background=bool(question.one_pager) or bool(one_pager_ref),
                                now_ms=posted_ms)


def approval_fields(qset: QuestionSet, question: Question, posted_ms: int | None) -> dict[str, Any]:
    """``expires``, ``answerers``, ``quorum``, ``escalate`` as the event carries
    them (PROTOCOL 2a): times absolute (RFC 3339, UTC), so every reader of the
    room judges against the same instant.  A duration needs ``posted_ms``."""
    out: dict[str, Any] = {}
    base = posted_ms if posted_ms is not None else 0
    expires = question.expires_for(qset)
    if expires is not None:
        if posted_ms is None and not is_rfc3339(expires):
            raise ValueError("a duration in expires needs the posting time")
        out["expires"] = format_rfc3339(parse_when(expires, base))
    if question.answerers:
        out["answerers"] = list(dict.fromkeys(question.answerers))
    if question.quorum is not None:
        out["quorum"] = {"required": question.quorum.required, "veto": list(question.quorum.veto)}
    if question.escalate is not None:
        after = question.escalate.after
        if posted_ms is None and not is_rfc3339(after):
            raise ValueError("a duration in escalate.after needs the posting time")
        out["escalate"] = {"after": format_rfc3339(parse_when(after, base)), "to": list(dict.fromkeys(question.escalate.to))}
    return out


def _subject(bound: Mapping[str, Any]) -> dict[str, str]:
    # An answer must echo the binding exactly, so a binding the schema would
    # refuse is an error here rather than a question nobody can answer.
    out: dict[str, str] = {}
    for name in ("id", "digest"):
        value = bound.get(name)
        if not isinstance(value, str) or not 1 <= len(value) <= 512:
            raise ValueError(f"subject.{name} must be a string of 1..512 characters")
        out[name] = value
    return out


def _question_fields(
    qset: QuestionSet,
    question: Question,
    media: Mapping[str, Mapping[str, Any]],
    order: Sequence[str] | None,
    text_max: int,
    one_pager_ref: str | None,
) -> dict[str, Any]:
    study = qset.mode == "study"
    out: dict[str, Any] = {
        "id": question.id,
        "rev": question.rev,
        "kind": question.kind,
        "title": question.title,
        "question": question.question,
    }
    for name in ("why", "hint"):
        if getattr(question, name):
            out[name] = getattr(question, name)
    if question.look_for:
        out["look_for"] = list(question.look_for)
    # In a quiz the guess is not part of the format and could hint at the answer.
    if question.guess is not None and not study:
        out["guess"] = question.guess.model_dump(include={"option", "options", "order", "text", "why", "confidence"}, exclude_none=True)
    if question.sides:
        out["sides"] = dict(question.sides)
    if question.show_if is not None:
        out["show_if"] = _show_if(qset, question.show_if)
    media_items = _media_items(question.media or [], media)
    if media_items:
        out["media"] = media_items
    out["options"] = _options(question, order)
    out["text_max"] = text_max
    if one_pager_ref:
        out["one_pager_ref"] = one_pager_ref
    if study:
        out.update(_study_fields(question))
    return out


def _show_if(qset: QuestionSet, show_if: ShowIf) -> dict[str, Any]:
    """``show_if`` plus the earlier question's ``title`` and the ``labels`` of
    its options, in ``option``'s order.

    The message names what the person saw, not ids; the event carries the
    words because the renderer reads the event alone.  Readers that do not
    know the two extra keys ignore them.
    """
    out: dict[str, Any] = {"question": show_if.question, "option": list(show_if.option)}
    target = qset.question(show_if.question)
    if target is not None:
        out["title"] = target.title
        out["labels"] = [opt.label if (opt := target.option(oid)) is not None else oid for oid in show_if.option]
    return out


def _study_fields(question: Question) -> dict[str, Any]:
    """What a quiz shows beside the question; never ``rubric``/``model_answer``."""
    out: dict[str, Any] = {}
    if question.topic:
        out["topic"] = question.topic
    if question.points is not None:
        points = question.points
        out["points"] = int(points) if float(points).is_integer() else repr(float(points))
    if question.bonus is not None:
        out["bonus"] = question.bonus
    return out


def _options(question: Question, order: Sequence[str] | None) -> list[dict[str, Any]]:
    own = list(question.options or []) if question.kind != "text" else []
    if order is not None:
        own = _reordered(own, order)
    if question.kind == "compare" and question.sides:
        own = _sides_first(own, question)
    out = [_option(opt) for opt in own]
    out.append({"id": UNSURE_ID, "label": UNSURE_LABEL})
    if question.kind != "text":
        out.append({"id": OTHER_ID, "label": OTHER_LABEL, "input": "required"})
    return out


def _reordered(options: list[Option], order: Sequence[str]) -> list[Option]:
    by_id = {opt.id: opt for opt in options}
    if sorted(order) != sorted(by_id) or len(order) != len(options):
        raise ValueError("order must list every option id of the question exactly once")
    return [by_id[oid] for oid in order]


def _sides_first(options: list[Option], question: Question) -> list[Option]:
    """The options shown in the clip first, in the order the sides are seen
    (left, then right, then any other side named), then the rest as given.

    The message, the poll and the reply numbers all follow the event's
    order, so "1. Right 2. Left" would have been read everywhere.
    """
    side_of = question.side_map
    rank = {"left": 0, "right": 1}
    names = [name for name in (question.sides or {}) if name != "randomized"]

    def place(opt: Option) -> tuple[int, int]:
        side = side_of.get(opt.id)
        if side is None:
            return (1, 0)
        return (0, rank.get(side, 2 + names.index(side)))

    # ``sorted`` is stable: the options outside the clip keep their order.
    return sorted(options, key=place)


def _option(opt: Option) -> dict[str, Any]:
    # Only id, label and consequence: ``correct`` and ``why`` would give a
    # quiz away, and unknown extras are not ours to publish.
    out: dict[str, Any] = {"id": opt.id, "label": opt.label}
    if opt.consequence:
        out["consequence"] = opt.consequence
    return out


def _media_items(items: Sequence[MediaItem], uploads: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Media that have been uploaded, in the set's order.

    An item without an upload is left out rather than listed without a URL:
    a reader can do nothing with it, and the schema can then promise every
    listed item is fetchable.  The caller decides whether a missing upload
    should hold the question back.
    """
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        key = item.src if item.src is not None else f"figure:{index}"
        upload = uploads.get(key)
        if not upload or not isinstance(upload.get("url"), str) or not str(upload["url"]).startswith("mxc://"):
            continue
        out.append(_media_item(item, upload))
    return out


def _media_item(item: MediaItem, upload: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: str(upload[k]) for k in _UPLOAD_STR_FIELDS if upload.get(k) is not None}
    out.setdefault("mimetype", "application/octet-stream")
    kind = item.type or out["mimetype"].split("/", 1)[0]
    if kind in ("video", "audio", "image"):
        out["type"] = kind
    if item.src:
        out["name"] = item.src.replace("\\", "/").rsplit("/", 1)[-1]
    for name in ("label", "alt", "caption"):
        if getattr(item, name):
            out[name] = getattr(item, name)
    for name in _UPLOAD_INT_FIELDS:
        number = _whole(upload.get(name))
        if number is not None:
            out[name] = number
    out.update(_start(item.start))
    if isinstance(upload.get("file"), Mapping):
        # An encrypted room: ``url`` holds ciphertext, and the key, IV and hash
        # to read it ride here (the question event is encrypted too).
        out["file"] = dict(upload["file"])
    return out


def _whole(value: Any) -> int | None:
    """A non-negative int from an upload description's number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    number = round(value)
    return number if 0 <= number <= _SAFE_INT else None


def _start(start: int | float | str | None) -> dict[str, Any]:
    """``start`` as written (a string) plus ``start_ms`` when it is a plain time."""
    if start is None or isinstance(start, bool):
        return {}
    if isinstance(start, (int, float)):
        if not math.isfinite(start) or start < 0:
            return {}
        return {"start": repr(start) if isinstance(start, float) else str(start), "start_ms": round(start * 1000)}
    text = start.strip()
    if not text:
        return {}
    match = _DECIMAL.match(text)
    return {"start": text, **({"start_ms": round(float(match.group(1)) * 1000)} if match else {})}


# ---------------------------------------------------------------- size guard


def _with_readable_parts(structured: dict[str, Any], *, poll: bool, background: bool,
                         now_ms: int | None = None, reactions: bool = True,
                         max_bytes: int = CONTENT_MAX_BYTES) -> dict[str, Any]:
    """Add body/formatted_body, shortening them until the event fits."""
    floor = dict(structured, body=render_body(structured, limit=_SHRINK_LIMITS[-1], poll=poll, bare=True,
                                              now_ms=now_ms, reactions=reactions))
    if content_size(floor) > max_bytes:
        raise QuestionEventTooLarge(
            f"question {structured['question']['id']!r}: its structured fields with the shortest "
            f"readable body take {content_size(floor)} bytes, over the {max_bytes} an event "
            f"{'in an encrypted room ' if max_bytes < CONTENT_MAX_BYTES else ''}may carry; shorten its question "
            "text, options, look_for or why"
        )
    for body_limit, html_limit in _attempts():
        body = render_body(structured, limit=body_limit, poll=poll, background=background, now_ms=now_ms,
                           reactions=reactions)
        candidate = dict(structured, body=body)
        if html_limit != "drop":
            html = render_html(structured, limit=html_limit, poll=poll, background=background, now_ms=now_ms,
                               reactions=reactions)
            candidate.update(format=HTML_FORMAT, formatted_body=html)
        if content_size(candidate) <= max_bytes:
            return candidate
    return floor


def _attempts() -> list[tuple[int | None, int | None | str]]:
    """(body limit, HTML limit or "drop"), from the full message down.

    The HTML is the nicer copy but not the one every client depends on, so it
    is shortened first, then the body, then the HTML goes.
    """
    attempts: list[tuple[int | None, int | None | str]] = [(None, limit) for limit in _SHRINK_LIMITS]
    attempts += [(limit, _SHRINK_LIMITS[-1]) for limit in _SHRINK_LIMITS[1:]]
    attempts += [(limit, "drop") for limit in _SHRINK_LIMITS[1:]]
    return attempts


SHOWN_CLOSED_KEY = "dev.superpipeline.question.shown_closed"
# The question's own fields (PROTOCOL §2), which its edits carry too.
STRUCTURED_KEYS = ("schema_version", "suite_event_type", "elicitation_id", "set", "question")
CLOSED_LINE = "Closed: no longer accepting answers"


def closed_replacement(question_event_id: str, content: Mapping[str, Any], why: str,
                       at_ms: int | None = None) -> dict[str, Any]:
    """An ``m.replace`` of a question's message once it is closed, withdrawn,
    superseded or replaced: the same message with its "To answer" line
    turned into "Closed: no longer accepting answers (why)".  The original
    stays in the event's history; only what clients show changes.  The
    structured question is not repeated (it is the original's), so readers
    of the room's events still find the question as it was asked.

    ``at_ms``: when it closed (for an expiry, its deadline).  The approval
    lines say what became of them (``settled_lines``): the deadline says it
    passed or the question closed before it (and loses the "in 2 hours" a
    message posted before said), and the escalation line goes unless it
    happened by then."""
    line = f"{CLOSED_LINE} ({why_in_brackets(why)})." if why and why != "closed" else f"{CLOSED_LINE}."
    q = content.get("question") if isinstance(content.get("question"), Mapping) else {}
    body, html = _with_lines(content, settled_lines(q, at_ms, str(content.get("body", ""))))
    lines = body.split("\n")
    at = max((i for i, text in enumerate(lines) if text.startswith("To answer: ")), default=None)
    new_body = "\n".join(lines[:at] + [line]) if at is not None else f"{body}\n\n{line}"
    new: dict[str, Any] = {"msgtype": content.get("msgtype", "m.text"), "body": new_body}
    if isinstance(html, str):
        start = html.rfind("<p><em>To answer:</em>")
        kept = html[:start].rstrip("\n") if start >= 0 else html
        new.update(format=HTML_FORMAT, formatted_body=f"{kept}\n<p><strong>{esc_links(line)}</strong></p>")
    shown = {"question_event_id": question_event_id, "why": why}
    return _replacement(question_event_id, content, new, line, {SHOWN_CLOSED_KEY: shown})


def reopened_replacement(question_event_id: str, content: Mapping[str, Any], line: str,
                         at_ms: int | None = None) -> dict[str, Any]:
    """An ``m.replace`` that shows a question closed as decided open again
    (its decision undone): the message as first posted, ``line`` after it.

    ``at_ms``: when it opened again.  The approval lines say what stands then
    (``reopened_lines``): the deadline as a time (a message posted before
    said the time left from its posting), and the escalation as done once
    its time came."""
    said = f"{line[:1].upper()}{line[1:]}."
    q = content.get("question") if isinstance(content.get("question"), Mapping) else {}
    shown = str(content.get("body", ""))
    body, html = _with_lines(content, reopened_lines(q, at_ms, shown) if at_ms is not None else [])
    # Its poll stays ended (it decided nothing): the message no longer offers it.
    body, html = _without_poll_step(body, html)
    new: dict[str, Any] = {"msgtype": content.get("msgtype", "m.text"), "body": f"{body}\n\n{said}"}
    if isinstance(html, str):
        new.update(format=HTML_FORMAT, formatted_body=f"{html}\n<p><strong>{esc_links(said)}</strong></p>")
    return _replacement(question_event_id, content, new, line)


def _without_poll_step(body: str, html: Any) -> tuple[str, Any]:
    """The message's body and HTML with "vote in the poll" taken out of its
    "To answer" line: the one helper for a message whose poll is no more."""
    body = body.replace(f"To answer: {POLL_STEP}; ", "To answer: ")
    if isinstance(html, str):
        html = html.replace(f"<em>To answer:</em> {POLL_STEP}; ", "<em>To answer:</em> ")
    return body, html


POLL_REFUSED_LINE = "this room does not allow its poll"


def without_poll(content: Mapping[str, Any]) -> dict[str, Any]:
    """The question's content as it stands once its room refused its poll:
    the same message, its "To answer" line no longer sending people to a
    poll that was never posted."""
    body, html = _without_poll_step(str(content.get("body", "")), content.get("formatted_body"))
    shown = dict(content, body=body)
    if isinstance(html, str):
        shown["formatted_body"] = html
    return shown


def poll_refused_replacement(question_event_id: str, content: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``m.replace`` that shows ``without_poll(content)`` in the room;
    None when the message offered no poll (nothing to take back)."""
    shown = without_poll(content)
    if shown["body"] == content.get("body") and shown.get("formatted_body") == content.get("formatted_body"):
        return None
    new: dict[str, Any] = {"msgtype": content.get("msgtype", "m.text"), "body": shown["body"]}
    if isinstance(shown.get("formatted_body"), str):
        new.update(format=HTML_FORMAT, formatted_body=shown["formatted_body"])
    return _replacement(question_event_id, content, new, POLL_REFUSED_LINE)


def _replacement(question_event_id: str, content: Mapping[str, Any], new: dict[str, Any], line: str,
                 marks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The edit of a question's message to ``new``; ``line`` says what
    changed; ``marks``: fields of the edit itself (``shown_closed``)."""
    # Mentions (the Matrix rules for edits): the message's own stay with the
    # message as replaced; the edit itself mentions nobody, so closing a
    # question pings none of the people it names again.
    new["m.mentions"] = dict(content["m.mentions"]) if isinstance(content.get("m.mentions"), Mapping) else {}
    q = content.get("question") if isinstance(content.get("question"), Mapping) else {}
    edit = {
        "msgtype": new["msgtype"],
        # The fallback for clients without edits: short, the whole message is in m.new_content.
        "body": f"* {shown_title(q.get('title', ''))}: {line}",
        "m.new_content": new,
        "m.relates_to": {"rel_type": "m.replace", "event_id": question_event_id},
        "m.mentions": {},
        **(marks or {}),
    }
    # A client applying the edit (matrix-js-sdk's getContent, Element) shows
    # m.new_content in place of the original: the question's own fields (and
    # the marks) go with it, so what it holds is still the question, when
    # all of it fits in an event (a question near the limit keeps them in
    # the original only).
    structured = {**{key: content[key] for key in STRUCTURED_KEYS if key in content}, **(marks or {})}
    # (Judged as the edit of an encrypted room's question is: the fields are
    # a nicety the original carries anyway, the edit itself must go out.)
    if structured and content_size({**edit, "m.new_content": {**new, **structured}}) <= ENCRYPTED_CONTENT_MAX_BYTES:
        new.update(structured)
    return edit


def _with_lines(content: Mapping[str, Any], swaps: Sequence[tuple[str, str | None]]) -> tuple[str, Any]:
    """The message's body and HTML with each approval line ``old`` turned
    into ``new`` (None: dropped), in both, so the two say the same."""
    body = str(content.get("body", ""))
    html = content.get("formatted_body")
    q = content.get("question") if isinstance(content.get("question"), Mapping) else {}
    for old, new in swaps:
        body = _swap_line(body, old, new)
        if isinstance(html, str):
            html = _swap_html_line(html, approval_line_html(old, q), None if new is None else approval_line_html(new, q))
    return body, html


def _swap_line(body: str, old: str, new: str | None) -> str:
    lines = body.split("\n")
    return "\n".join(x for text in lines for x in ([text] if text != old else [] if new is None else [new]))


def _swap_html_line(html: str, old: str, new: str | None) -> str:
    """The approval lines are ``<em>line</em>`` in one paragraph, ``<br>``-separated."""
    tag = f"<em>{old}</em>"
    if new is not None:
        return html.replace(tag, f"<em>{new}</em>")
    for form in (f"<p>{tag}</p>\n", f"<p>{tag}</p>", f"<br>\n{tag}", f"{tag}<br>\n", tag):
        if form in html:
            return html.replace(form, "", 1)
    return html
