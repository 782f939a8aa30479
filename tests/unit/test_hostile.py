"""Hostile input: whatever an agent writes into a set folder and whatever a
person (or a forged event) sends, nothing escapes as an exception, memory
stays bounded, nothing is written outside the set folder, and nothing
anyone wrote is shown back as markup.

Extends the judge's properties (test_judge_properties.py), the hostile set
strings of the renderer (test_render.py) and the media symlink rules
(test_lint_media.py, test_lint_rules.py); it does not repeat them."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import shutil
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.answers import document
from bridge.answers.file import AnswersFile
from bridge.protocol.judge import Accepted, IncomingAnswer, JudgeContext, Refused, check_identity, judge
from bridge.protocol.normalize import ANSWER_TYPE, POLL_RESPONSE_TYPES, Annotation, Candidate, Unreadable, normalize
from bridge.protocol.outcome import annotated_notice, recorded_notice, refused_notice
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.lint import LintResult, lint
from bridge.questionset.load import LoadError
from bridge.questionset.model import QuestionSet
from bridge.questionset.setdir import MAX_QUESTIONS_BYTES, LocalFilesystem, load_set_dir
from bridge.service.answering import attachments
from bridge.service.posting.sets import discover
from bridge.service.transport.matrix import MediaBody
from helpers.sets import all_kinds_set

ROOM, ALICE, BRIDGE = "!room:hs", "@alice:hs", "@bot:hs"
CTX = JudgeContext(allowed=None, members=frozenset({ALICE}), bridge_user=BRIDGE)
HOSTILE = ['<script>alert(1)</script>', '<img src=x onerror=alert(1)>', '"><b>x</b>', "**bold** _it_ [a](javascript:x)",
           "&amp;&lt;", "\u202e\u0000\ufeff", "<a href='https://evil.example'>click</a>", "@room", "```\n<pre>"]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=40,
)


@contextlib.contextmanager
def peak_under(limit_bytes: int) -> Iterator[None]:
    """Fails when the block's allocations ever pass ``limit_bytes`` at once."""
    tracemalloc.start()
    try:
        yield
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit_bytes, f"peak {peak / 1e6:.1f} MB over {limit_bytes / 1e6:.1f} MB"


def deep(depth: int, leaf: Any = "x") -> Any:
    """A list nested ``depth`` times, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- the set loader and lint

SET_DIR = Path(tempfile.mkdtemp(prefix="hostile-set-"))
# Made at import (hypothesis tests take no fixtures): removed at exit, not left in /tmp per run.
atexit.register(shutil.rmtree, SET_DIR, ignore_errors=True)


def _all_paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_all_paths(item, path + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_all_paths(item, path + (index,)))
    return found


VALID = all_kinds_set("hostile")
VALID_PATHS = _all_paths(VALID)[1:]


@st.composite
def mutated_sets(draw: st.DrawFn) -> dict[str, Any]:
    """The all-kinds set with a few values anywhere in it replaced, dropped or made hostile."""
    raw = json.loads(json.dumps(VALID))
    for path in draw(st.lists(st.sampled_from(VALID_PATHS), min_size=1, max_size=5)):
        parent: Any = raw
        try:
            for key in path[:-1]:
                parent = parent[key]
            choice = draw(st.sampled_from(["replace", "drop", "hostile", "huge"]))
            if choice == "drop" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif choice == "hostile":
                parent[path[-1]] = draw(st.sampled_from(HOSTILE))
            elif choice == "huge":
                parent[path[-1]] = "x" * 100_000
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed the path
    return raw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=mutated_sets() | st.dictionaries(st.text(max_size=10), json_values, max_size=6))
def test_lint_judges_any_set_without_raising(raw: dict[str, Any]) -> None:
    with peak_under(60_000_000):
        result = lint(raw, LocalFilesystem(str(SET_DIR)))
    assert isinstance(result, LintResult)
    for finding in result.errors + result.warnings:
        assert isinstance(finding.where, str) and isinstance(finding.message, str)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode)
       | st.builds(lambda a, b: a + b, st.binary(min_size=1, max_size=20).map(lambda b: b"\xff\xfe" + b),
                   st.text(max_size=50).map(str.encode)))
def test_any_bytes_as_questions_json_load_or_are_refused_with_a_reason(data: bytes) -> None:
    (SET_DIR / "questions.json").write_bytes(data)
    try:
        result = load_set_dir(SET_DIR, probe=False)
    except LoadError as exc:
        assert exc.message
    else:
        assert isinstance(result, LintResult)


def test_invalid_utf8_deep_nesting_and_huge_numbers_are_refused_with_a_reason(tmp_path: Path) -> None:
    cases = {
        b'{"askwright": 1, "id": "\xff\xfe"}': "not UTF-8",
        ("[" * 200_000 + "]" * 200_000).encode(): "nested too deeply",
        b'{"askwright": ' + b"9" * 100_000 + b"}": "not usable JSON",
        b"\xef\xbb\xbf{}": "",  # a byte-order mark: refused or read, but never a traceback
    }
    for data, words in cases.items():
        (tmp_path / "questions.json").write_bytes(data)
        with contextlib.suppress(LoadError) as _:
            load_set_dir(tmp_path, probe=False)
            assert not words, f"{data[:20]!r} was accepted"
            continue
        with pytest.raises(LoadError, match=words or "."):
            load_set_dir(tmp_path, probe=False)


def test_a_10_mb_questions_json_is_read_in_bounded_memory_and_time(tmp_path: Path) -> None:
    big = json.loads(json.dumps(VALID))
    template = big["questions"][0]
    big["questions"] = [{**template, "id": f"q{n}", "why": f"{n} " + "w" * 20_000} for n in range(500)]
    data = json.dumps(big).encode()
    assert len(data) > 10_000_000
    (tmp_path / "questions.json").write_bytes(data)
    started = time.monotonic()
    with peak_under(30 * len(data)):
        result = load_set_dir(tmp_path, probe=False)
    assert time.monotonic() - started < 30
    assert result.model is not None and len(result.model.questions) == 500


def test_a_questions_json_past_the_cap_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    with open(tmp_path / "questions.json", "wb") as handle:
        handle.truncate(MAX_QUESTIONS_BYTES * 4)  # sparse: costs no disk
    with peak_under(3 * MAX_QUESTIONS_BYTES), pytest.raises(LoadError, match="larger than"):
        load_set_dir(tmp_path, probe=False)


# ---------------------------------------------------------------- the normaliser and the judge

def _recorded() -> dict[str, RecordedQuestion]:
    qset = QuestionSet.model_validate(VALID)
    return {q.id: RecordedQuestion(event_id=f"$q_{q.id}", room_id=ROOM, set_id=qset.id,
                                   content=build_question_event(qset, q, elicitation_id=f"elc_{q.id}", poll=True))
            for q in qset.questions}


QUESTIONS = _recorded()
EVENT_IDS = [q.event_id for q in QUESTIONS.values()] + ["$poll_branch", "$unknown", "", "$answer"]


class AnythingLookup:
    """An adversarial past: every id is some question, poll, earlier answer or saved file."""

    def __init__(self, pick: int, questions: list[RecordedQuestion] | None = None):
        self.questions = questions or list(QUESTIONS.values())
        self.pick = pick

    def _any(self, key: Any) -> RecordedQuestion:
        # crc32, not hash(): the same past on every run (str hashes change per process).
        return self.questions[(zlib.crc32(str(key).encode()) + self.pick) % len(self.questions)]

    def question_by_event(self, event_id: str) -> RecordedQuestion | None:
        return self._any(event_id)

    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None:
        return self._any(elicitation_id)

    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None:
        return self._any(poll_event_id) if self.pick % 2 else None

    def answer_reference(self, event_id: str) -> str | None:
        return self._any(event_id).event_id

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        return (self._any(event_id).event_id, ["reply", "poll", "reaction", "answer_event", "note"][self.pick % 5])

    def has_answered(self, question: RecordedQuestion, sender: str) -> bool:
        return bool(self.pick % 3)

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        return [None, ("attachments/a-1.png", None), (None, "attachment_too_large")][self.pick % 3]


relates = st.one_of(
    json_values,
    st.fixed_dictionaries({"m.in_reply_to": st.fixed_dictionaries({"event_id": st.sampled_from(EVENT_IDS) | json_values})}),
    st.fixed_dictionaries({"rel_type": st.sampled_from(["m.thread", "m.reference", "m.replace", "m.annotation", "x"]),
                           "event_id": st.sampled_from(EVENT_IDS) | json_values,
                           "key": st.sampled_from(["1️⃣", "🔟", "👍", "", "x"]) | json_values}),
)
contents = st.fixed_dictionaries(
    {},
    optional={
        "msgtype": st.sampled_from(["m.text", "m.image", "m.file", "m.notice", "m.emote", "m.video"]) | json_values,
        "body": st.sampled_from(["1", "2, 3", "other: why not", "unsure", "> quoted\n\nmain", "00:01.5 here"])
        | st.sampled_from(HOSTILE) | json_values,
        "suite_event_type": st.just(ANSWER_TYPE) | json_values,
        "elicitation_id": st.sampled_from([f"elc_{q}" for q in QUESTIONS]) | json_values,
        "option_id": st.sampled_from(["main", "stable", "unsure", "other", "t2"]) | json_values,
        "text": json_values,
        "m.relates_to": relates,
        "m.new_content": json_values | st.fixed_dictionaries({"body": json_values, "msgtype": json_values}),
        "org.matrix.msc3381.poll.response": json_values | st.fixed_dictionaries({"answers": json_values}),
        "m.selections": json_values,
        "url": json_values, "info": json_values, "subject": json_values, "note": json_values,
    },
)
events = st.fixed_dictionaries(
    {"type": st.sampled_from(["m.room.message", "m.reaction", "m.room.redaction", *POLL_RESPONSE_TYPES, ANSWER_TYPE,
                              "m.room.member"]) | json_values,
     "content": contents | json_values},
    optional={"event_id": st.sampled_from(["$e", "$answer"]) | json_values, "room_id": st.just(ROOM) | json_values,
              "sender": st.just(ALICE) | json_values, "origin_server_ts": st.integers() | json_values,
              "redacts": st.sampled_from(EVENT_IDS) | json_values, "state_key": json_values,
              "unsigned": json_values},
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=events, pick=st.integers(0, 29))
def test_the_normaliser_and_the_judge_take_any_event_without_raising(event: dict[str, Any], pick: int) -> None:
    found = normalize(event, AnythingLookup(pick))
    if isinstance(found, Candidate):
        assert isinstance(judge(found.question, found.answer, CTX), (Accepted, Refused))
    elif isinstance(found, Annotation):
        answer = IncomingAnswer(found.event_id, found.room_id, found.sender, found.ts, via=found.via, content={
            "m.relates_to": {"event_id": found.question.event_id}, "elicitation_id": found.question.elicitation_id})
        check_identity(found.question, answer, CTX)
    elif isinstance(found, Unreadable):
        assert found.reason and found.message


@settings(max_examples=200, deadline=None)
@given(question=json_values, answer=json_values)
def test_the_judge_takes_a_corrupt_recorded_question_without_raising(question: Any, answer: Any) -> None:
    recorded = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="s",
                                content={"question": question, "elicitation_id": "elc"})
    verdict = judge(recorded, IncomingAnswer("$a", ROOM, ALICE, 1, content=answer), CTX)
    assert isinstance(verdict, Refused)


def test_oversized_and_deeply_nested_events_are_refused_in_bounded_memory() -> None:
    name = QUESTIONS["name"]
    base = {"msgtype": "m.text", "suite_event_type": ANSWER_TYPE, "elicitation_id": name.elicitation_id,
            "m.relates_to": {"rel_type": "m.reference", "event_id": name.event_id}}
    cases = [
        {**base, "body": "x", "text": "y" * 5_000_000},  # far past the homeserver's 64 KB event limit
        {**base, "body": "x" * 5_000_000, "note": "z" * 5_000_000},
        {**base, "body": "x", "text": deep(50_000)},
        {**base, "body": "x", "subject": deep(50_000, {"id": "a"})},
        {"msgtype": "m.text", "body": "1", "m.relates_to": deep(50_000)},
    ]
    # A plain reply carrying junk it does not need: read as the reply it is.
    harmless = {"msgtype": "m.text", "body": "1", "m.relates_to": {"m.in_reply_to": {"event_id": name.event_id}},
                "m.new_content": deep(50_000), "extra": "e" * 5_000_000}
    for content in [*cases, harmless]:
        event = {"type": "m.room.message", "event_id": "$big", "room_id": ROOM, "sender": ALICE,
                 "origin_server_ts": 1, "content": content}
        started = time.monotonic()
        with peak_under(60_000_000):
            found = normalize(event, AnythingLookup(1, [name]))  # every id is the name question
            if isinstance(found, Candidate):
                verdict = judge(found.question, found.answer, CTX)
                assert isinstance(verdict, Refused if content is not harmless else Accepted), verdict
        assert time.monotonic() - started < 10


@pytest.mark.usefixtures("store_backend")
async def test_a_deeply_nested_transaction_body_is_refused_not_a_server_error(tmp_path: Path) -> None:
    from bridge.service.transport.appservice import TransactionServer
    from bridge.service.config import parse_config
    from bridge.service.storage.store import Store

    config = parse_config({
        "homeserver": {"url": "http://127.0.0.1:8008"}, "bot": {"user_id": "@askbot:hs"}, "sets": {"root": "sets"},
        "rooms": {"default": ROOM}, "store": {"path": "bridge.sqlite"},
        "appservice": {"enabled": True, "as_token": "as-secret", "hs_token": "hs-secret", "listen": "127.0.0.1:0"},
    }, base_dir=tmp_path, environ={})
    store = Store(tmp_path / "bridge.sqlite")
    server = TransactionServer(config, store, pipeline=None)  # type: ignore[arg-type]
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    try:
        body = '{"events": ' + "[" * 100_000 + "]" * 100_000 + "}"
        response = await client.put("/_matrix/app/v1/transactions/deep", data=body,
                                    headers={"Authorization": "Bearer hs-secret", "Content-Type": "application/json"})
        assert response.status == 400
        assert (await response.json())["errcode"] == "M_NOT_JSON"
    finally:
        await client.close()
        store.close()


# ---------------------------------------------------------------- what is shown back in the room

@pytest.mark.parametrize("hostile", HOSTILE)
def test_every_answer_shown_back_in_a_notice_is_escaped(hostile: str) -> None:
    records = [
        {"qid": "q", "state": "answered", "choice": "a", "label": hostile, "note": hostile, "rev": 2, "q_rev": 1},
        {"qid": "q", "state": "answered", "choices": [hostile, "b"], "rev": 1},
        {"qid": "q", "state": "answered", "order": [hostile, "b"], "rev": 1},
        {"qid": "q", "state": "answered", "text": hostile * 3, "rev": 1},
        {"qid": "q", "state": "note_only", "note": hostile, "rev": 1},
    ]
    notices = [recorded_notice(answer_event_id="$a", question_event_id="$q", record=record, title=hostile, via="reply",
                               extra=hostile) for record in records]
    notices.append(refused_notice(answer_event_id="$a", question_event_id="$q", qid="q", layer="recorded",
                                  reason="option_not_offered", message=f"“{hostile}” is not an option", via="reply"))
    notices.append(annotated_notice(answer_event_id="$a", question_event_id="$q", added={"note": hostile},
                                    title=hostile, qid="q", q_rev=1, record_rev=1))
    for content in notices:
        # The only markup is the bridge's own <code> around a link-like run
        # (so Element does not linkify it) and <br>; nothing of the answer's is a tag.
        assert _without_code(content["formatted_body"]).count("<") == 0
        assert ">" not in _without_code(content["formatted_body"])
        assert content["m.mentions"] == {}  # "@room" in an answer pings nobody
    refused = judge(QUESTIONS["branch"], IncomingAnswer("$a", ROOM, ALICE, 1, content={
        "msgtype": "m.text", "body": hostile, "suite_event_type": ANSWER_TYPE, "option_id": hostile,
        "elicitation_id": QUESTIONS["branch"].elicitation_id,
        "m.relates_to": {"rel_type": "m.reference", "event_id": "$q_branch"}}), CTX)
    assert isinstance(refused, Refused)
    shown = refused_notice(answer_event_id="$a", question_event_id="$q", qid="branch", layer=refused.layer,
                           reason=refused.reason, message=refused.message, via="answer_event")
    assert "<" not in _without_code(shown["formatted_body"])


def _without_code(html: str) -> str:
    # ... and <br> for a line break the person typed.
    return html.replace("<code>", "").replace("</code>", "").replace("<br>", "")


# ---------------------------------------------------------------- the folder: symlinks and names

def test_a_symlinked_set_folder_or_questions_json_leading_outside_is_not_a_set(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (root / "real" / "questions.json").write_text(json.dumps(VALID))
    (outside / "questions.json").write_text(json.dumps(VALID))
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "sneaky").mkdir()
    (root / "sneaky" / "questions.json").symlink_to(outside / "questions.json")
    assert discover(root) == [root / "real"]


def test_answers_json_symlinked_outside_is_replaced_never_written_through(tmp_path: Path) -> None:
    set_dir, outside = tmp_path / "set", tmp_path / "elsewhere.json"
    set_dir.mkdir()
    outside.write_text("precious")
    (set_dir / "answers.json").symlink_to(outside)
    with contextlib.suppress(document.AnswersError):
        AnswersFile(set_dir, "s").update(lambda doc, now: document.put_record(doc, {"qid": "q", "text": "t"}, now),
                                         "2026-11-30T12:00:00.000Z")
    assert outside.read_text() == "precious"


def test_a_symlinked_attachments_folder_is_refused(tmp_path: Path) -> None:
    set_dir, outside = tmp_path / "set", tmp_path / "outside"
    set_dir.mkdir()
    outside.mkdir()
    (set_dir / "attachments").symlink_to(outside, target_is_directory=True)
    # Refused for this file alone (the person is told), never raised into the batch.
    assert asyncio.run(_save(set_dir, {"url": "mxc://hs/abc", "body": "a.png"}, "q")) == \
        (None, "attachment_not_saved")
    assert list(outside.iterdir()) == []


async def _save(set_dir: Path, content: dict[str, Any], qid: str) -> tuple[str | None, str | None]:
    @contextlib.asynccontextmanager
    async def download(_url: str, _stall: float, _first: float | None = None):
        async def chunks():
            yield b"\x89PNG fake"

        yield MediaBody(9, chunks())

    return await attachments._fetch(content, str(set_dir), qid, 1, download)


@pytest.mark.parametrize("name", ["../../../etc/cron.d/evil", "/etc/passwd", "..", "a/../../b.png", "x.png\0.sh",
                                  "%2e%2e%2fescape.png", "C:\\evil\\x.exe", ".hidden", "a." + "p" * 300,
                                  "photo.PNG/../../x", "\u202egnp.exe"])
@pytest.mark.parametrize("qid", ["q", "../../up", "/abs", "..", ".dot"])
def test_attachment_names_never_lead_outside_the_set_folder(tmp_path: Path, name: str, qid: str) -> None:
    set_dir = tmp_path / "set"
    set_dir.mkdir()
    path, problem = asyncio.run(_save(set_dir, {"url": "mxc://hs/abc", "body": name, "filename": name,
                                                "info": {"mimetype": "image/png"}}, qid))
    assert problem is None and path is not None
    saved = (set_dir / path).resolve()
    assert saved.parent == (set_dir / "attachments").resolve() and saved.is_file()
    assert not saved.name.startswith(".")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [saved]


@pytest.mark.parametrize("msgtype", [["m.text"], {"a": 1}, ["m.image"]], ids=["a list", "an object", "a list of a file's"])
@pytest.mark.parametrize("kind", ["m.room.message", "org.example.custom"])
def test_a_msgtype_that_is_no_string_is_one_event_refused_not_a_batch_failed(tmp_path: Path, msgtype: Any,
                                                                           kind: str) -> None:
    """A room member's custom event (Synapse checks msgtype only on its own
    users' m.room.message) whose msgtype is a list: the files' look at the
    batch looked it up in a set, a TypeError outside any one event's guard,
    so the transaction failed with a 500 on every try and nothing after it
    ever came (a sync batch likewise)."""
    from bridge.service.answering.downloads import Downloads
    from helpers.timeline import ROOM, Room, answer

    room = Room(tmp_path)

    @contextlib.asynccontextmanager
    async def no_download(*_args: Any) -> Any:
        raise AssertionError("nothing to download")
        yield

    downloads = Downloads(room.store, no_download, lambda *_: True, None, 1024, judge_later=None)
    room.pipeline.downloads = downloads
    odd = {"type": kind, "event_id": "$odd", "room_id": ROOM, "sender": "@alice:hs",
           "origin_server_ts": 1500, "content": {"msgtype": msgtype, "body": "x", "url": "mxc://hs/x",
                                                 "m.relates_to": {"rel_type": "m.thread", "event_id": "$q"}}}
    batch = asyncio.run(downloads.prefetch([odd, answer("$a", "@alice:hs", 2000, "main")]))
    room.deliver(batch)
    assert room.record()["choice"] == "main"
