"""The agents' contract and waits without a homeserver: the OpenAPI
document's checks read generically from any document, ``after`` as a pure
predicate, and a wait held on the change feed that the folder watcher feeds
when no bridge runs (``askwright-bridge mcp`` on stdio)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from multidict import MultiDict

from bridge.agents.contract import Contract
from bridge.agents.errors import BadRequest, TooManyWaits
from bridge.agents.front import watch_answers
from bridge.agents.http import OPENAPI
from bridge.agents.mcp_server import Subscribers
from bridge.agents.sets import AgentSets
from bridge.agents.waiting import wait_answers
from bridge.answers.arrival import arrived, parse_time
from bridge.answers.document import put_record
from bridge.answers.file import AnswersFile
from bridge.service.answering.pipeline import utc_now

DOCUMENT = {
    "openapi": "3.1.0", "info": {"title": "t", "version": "1"},
    "paths": {
        "/v1/things/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[a-z]+$"}}],
            "put": {"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                    "responses": {"200": {"description": "ok"}}},
            "post": {"parameters": [{"name": "n", "in": "query", "schema": {"type": "integer", "maximum": 5}}],
                     "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Body"}}}},
                     "responses": {"200": {"description": "ok"}}},
        }},
    "components": {"schemas": {"Body": {"type": "object", "additionalProperties": False,
                                        "properties": {"names": {"type": "array", "items": {"type": "string"}}}}}},
}


def refused(call) -> dict:
    with pytest.raises(BadRequest) as caught:
        call()
    return caught.value.findings[0]


def test_the_contract_reads_any_document_and_names_the_field_at_fault():
    contract = Contract(DOCUMENT)
    post = contract.operation("POST", "/v1/things/{id}")
    assert contract.check_parameters(post, {"id": "abc"}, MultiDict(n="3")) == ({"id": "abc"}, {"n": 3})
    bad_id = refused(lambda: contract.check_parameters(post, {"id": "A!"}, MultiDict()))
    assert bad_id["where"] == "id" and "does not match" in bad_id["message"]
    assert refused(lambda: contract.check_parameters(post, {"id": "abc"}, MultiDict(n="6")))["where"] == "query.n"
    assert refused(lambda: contract.check_parameters(post, {"id": "abc"}, MultiDict(n="x")))["message"] == "must be integer"
    assert refused(lambda: contract.check_parameters(post, {"id": "abc"}, MultiDict(m="1"))) == \
        {"where": "query.m", "message": "unknown parameter"}
    assert refused(lambda: contract.check_parameters(post, {"id": "abc"}, MultiDict([("n", "1"), ("n", "2")]))) == \
        {"where": "query.n", "message": "given more than once"}
    # A $ref'd body with additionalProperties false: the unknown key is named.
    assert contract.check_body(post, b'{"names": ["a"]}') == {"names": ["a"]}
    assert refused(lambda: contract.check_body(post, b'{"name": ["a"]}')) == {"where": "body.name",
                                                                            "message": "unknown field"}
    assert refused(lambda: contract.check_body(post, b'{"names": [null]}')) == {
        "where": "body.names.0", "message": "must be string, not null"}
    assert refused(lambda: contract.check_body(post, b'{"names": NaN}'))["message"] == "NaN is not JSON"
    # A number past a double's range: read as infinity, and written back as Infinity, which nothing reads.
    assert "too large" in refused(lambda: contract.check_body(post, b'{"names": [], "x": -1e400}'))["message"]
    assert "half a surrogate pair" in refused(lambda: contract.check_body(post, b'{"names": ["\\ud800"]}'))["message"]
    # (Python reads bytes with "surrogatepass": half a pair encoded, and UTF-16, came through.)
    assert refused(lambda: contract.check_body(post, b'{"names": ["\xed\xa0\x80"]}'))["message"] == "not UTF-8 (byte 12)"
    assert refused(lambda: contract.check_body(post, '{"names": []}'.encode("utf-16")))["message"].startswith("not UTF-8")
    assert contract.check_body(post, b'{"names": ["\\ud83d\\ude00", "\\\\ud800"]}') == {"names": ["\U0001f600", "\\ud800"]}
    # A key twice: Python kept the last ({"status": "closed", "status": "withdrawn"} closed as withdrawn), other readers the first.
    assert refused(lambda: contract.check_body(post, b'{"names": ["a"], "names": ["b"]}')) == {
        "where": "body", "message": "the key 'names' appears twice in one object"}
    # JSON, only nested deeper than the parser goes: said so, not "not JSON".
    assert refused(lambda: contract.check_body(post, b"[" * 5000 + b"]" * 5000)) == {
        "where": "body", "message": "nested too deeply"}
    # JSON too, only an integer of more digits than Python reads: said so, not "not JSON".
    assert refused(lambda: contract.check_body(post, b'{"names": [], "n": ' + b"1" * 5000 + b"}")) == {
        "where": "body", "message": "a number has more than 4300 digits, more than can be read"}
    assert refused(lambda: contract.check_body(post, b'{"names": ['))["message"].startswith("not JSON: ")
    assert contract.check_body(post, b"") is None  # the body is optional here
    # A binary body is the handler's to read: not parsed, not validated as JSON.
    put = contract.operation("PUT", "/v1/things/{id}")
    assert not put.takes_json("application/octet-stream") and put.json_body is None
    assert post.takes_json("application/json") and post.takes_json("text/plain")


def test_the_shipped_document_has_an_operation_for_every_route_and_refuses_the_close_typo():
    contract = Contract(json.loads(OPENAPI.read_bytes()))
    close = contract.operation("POST", "/v1/sets/{id}/close")
    assert refused(lambda: contract.check_body(close, b'{"question": ["memo"]}')) == {
        "where": "body.question", "message": "unknown field"}
    assert refused(lambda: contract.check_body(close, b'{"status": "withdrawn", "reason": null}'))["where"] == \
        "body.reason"
    assert refused(lambda: contract.check_body(close, b'{"status": "withdrawn"}')) == {
        "where": "body.reason", "message": "required"}
    answers = contract.operation("GET", "/v1/sets/{id}/answers")
    assert refused(lambda: contract.check_parameters(answers, {"id": "plan"}, MultiDict(timeout="300.5")))[
        "where"] == "query.timeout"
    assert refused(lambda: contract.check_parameters(answers, {"id": "plan"}, MultiDict(after="2026-05-01")))[
        "where"] == "query.after"


def test_the_shipped_document_lists_every_answer_the_routes_give():
    """A client made from the document met answers it does not describe:
    400 on the checkpoint (an unknown query parameter, as on every route),
    503 not_leading on the writes (docs/agents.md), Retry-After on some
    429s only, and none of the download's conditional and range headers."""
    document = json.loads(OPENAPI.read_bytes())
    operations = {(method.upper(), path): op for path, ops in document["paths"].items()
                  for method, op in ops.items() if isinstance(op, dict) and "responses" in op}
    for (method, path), op in operations.items():
        if path != "/v1/openapi.json":
            assert {"400", "401", "429"} <= set(op["responses"]), (method, path)
            assert "Retry-After" in op["responses"]["429"].get("headers", {}), (method, path)
    for write in [("PUT", "/v1/sets/{id}"), ("POST", "/v1/sets/{id}/close"), ("PUT", "/v1/sets/{id}/media/{name}")]:
        assert "503" in operations[write]["responses"], write
    download = operations[("GET", "/v1/sets/{id}/attachments/{name}")]
    assert {p["name"] for p in download["parameters"] if p["in"] == "header"} == {
        "Range", "If-Range", "If-None-Match", "If-Match"}


def entry(qid: str, updated: str | None, state: str = "answered") -> dict:
    return {"qid": qid, "status": "open", "state": state, "stale": False, "updated": updated}


def test_after_counts_only_an_answer_later_than_the_one_seen():
    seen = parse_time("2026-05-01T12:00:00.000Z")
    view = {"answers": [entry("a", "2026-05-01T12:00:00.000Z"), entry("b", None, "unanswered")]}
    assert arrived(view, None, "answered") and not arrived(view, None, "answered", seen)
    assert not arrived(view, "a", "answered", seen)
    view["answers"][1] = entry("b", "2026-05-01T12:00:00.001Z")
    assert arrived(view, None, "answered", seen) and arrived(view, None, "all", seen)
    assert not arrived(view, "a", "answered", seen) and arrived(view, "b", "answered", seen)
    assert parse_time("2026-05-01T14:00:00+02:00") == seen
    assert parse_time("yesterday") is None and parse_time("2026-05-01T12:00:00") is None


def one_question(set_id: str = "plan") -> dict:
    return {"askwright": 1, "id": set_id, "title": "Release plan", "questions": [{
        "id": "branch", "kind": "choice", "title": "Release branch",
        "question": "Which branch should the release be cut from?", "why": "The cut decides which fixes ship.",
        "options": [{"id": "main", "label": "The main branch"}, {"id": "stable", "label": "The stable branch"}],
        "guess": {"option": "main", "why": "It is what the last release did.", "confidence": "high"}}]}


def answer_later(folder: Path, choice: str, seconds: float) -> threading.Thread:
    record = {"qid": "branch", "q_rev": 1, "choice": choice, "label": choice, "source": {"sender": "@a:x"}}

    def write() -> None:
        time.sleep(seconds)
        AnswersFile(folder, "plan").update(lambda doc, at: put_record(doc, record, at), utc_now())

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


async def test_without_a_bridge_the_folder_watcher_feeds_the_waits_and_the_caps_hold(tmp_path):
    sets = AgentSets(tmp_path)
    sets.waits.per_agent = 3
    sets.ask("a", "plan", one_question())
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_answers(tmp_path, Subscribers(sets.owner_of), stop, sets.changes))
    try:
        await asyncio.sleep(0.5)  # the watcher is up
        held = [asyncio.ensure_future(wait_answers(sets, "a", "plan", timeout=30)) for _ in range(3)]
        await asyncio.sleep(0.3)
        with pytest.raises(TooManyWaits) as caught:
            await wait_answers(sets, "a", "plan", timeout=30)
        assert caught.value.headers["Retry-After"] == "5"
        answer_later(tmp_path / "plan", "stable", 0.2)
        results = await asyncio.wait_for(asyncio.gather(*held), 20)
        assert [(done, view["answers"][0]["choice"]) for view, done, _why in results] == [(True, "stable")] * 3
        seen = results[0][0]["answers"][0]["updated"]
        # after: the answer seen does not end the next wait; the next answer does.
        view, done, why = await wait_answers(sets, "a", "plan", timeout=0.5, after=seen)
        assert not done and why is None
        answer_later(tmp_path / "plan", "main", 0.3)
        view, done, _why = await asyncio.wait_for(wait_answers(sets, "a", "plan", timeout=30, after=seen), 20)
        assert done and view["answers"][0]["choice"] == "main"
        assert sets.changes.subscribers() == 0 and not sets.waits.held
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_wait_for_what_can_get_no_answer_ends_at_once_and_says_why(tmp_path):
    """A question closed (by another agent, a moderator, a deadline's
    decision) or removed held a wait for it until its timeout, and the agent
    waited again, for ever; ``askwright-bridge wait`` exits 2 there."""
    sets = AgentSets(tmp_path)
    document = one_question()
    branch = document["questions"][0]
    document["questions"] += [{**branch, "id": "q2", "title": "Hotfix branch",
                               "question": "Which branch should the hotfix be cut from?"},
                              {**branch, "id": "q3", "title": "Docs branch",
                               "question": "Which branch should the docs be cut from?"}]
    sets.ask("a", "plan", document)
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_answers(tmp_path, Subscribers(sets.owner_of), stop, sets.changes))
    try:
        await asyncio.sleep(0.5)  # the watcher is up
        qid = branch["id"]
        waiting = asyncio.ensure_future(wait_answers(sets, "a", "plan", question=qid, timeout=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        sets.close("a", "plan", [qid], "closed", None)
        began = time.monotonic()
        view, done, why = await asyncio.wait_for(waiting, 20)
        assert time.monotonic() - began < 5 and not done
        assert why == f"question {qid!r} is closed: it can get no answer now"
        # Asked again: at once, not after its minute.
        began = time.monotonic()
        assert (await wait_answers(sets, "a", "plan", question=qid, timeout=60))[1:] == (False, why)
        # Removed from the set while waited for, never answered: no record of it in the view at all.
        waiting = asyncio.ensure_future(wait_answers(sets, "a", "plan", question="q3", timeout=60))
        await asyncio.sleep(0.3)
        sets.ask("a", "plan", {**document, "questions": [{**branch, "status": "closed"}, document["questions"][1]]})
        assert (await asyncio.wait_for(waiting, 20))[1:] == (False, "question 'q3' is removed: it can get no answer now")
        # Any open question: q2 still is, so that wait waits; withdrawn too, it ends.
        assert (await wait_answers(sets, "a", "plan", timeout=0.2))[1:] == (False, None)
        sets.close("a", "plan", ["q2"], "withdrawn", "not needed")
        assert (await wait_answers(sets, "a", "plan", timeout=60))[1:] == \
            (False, "no question of the set is open: none can get an answer now")
        assert time.monotonic() - began < 5
        assert sets.changes.subscribers() == 0 and not sets.waits.held
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)


def test_a_refusal_says_the_limit_and_the_reason_however_long_the_value():
    """jsonschema quotes the value before its reason ("[...] is too long"), and
    a refusal's words are cut at 200 characters: six callbacks were refused
    with a clipped list and no reason."""
    contract = Contract(json.loads(OPENAPI.read_text()))
    put = contract.operation("PUT", "/v1/sets/{id}")
    callbacks = [f"https://agents.example.org/hooks/{'x' * 40}/{n}" for n in range(6)]
    body = {"set": {"askwright": 1, "id": "s", "title": "t", "questions": []}, "callbacks": callbacks}
    finding = refused(lambda: contract.check_body(put, json.dumps(body).encode()))
    assert finding == {"where": "body.callbacks", "message": "at most 5 items, not 6"}
    bad_id = refused(lambda: contract.check_parameters(put, {"id": "Bad Id" * 20}, MultiDict()))
    assert bad_id["message"].startswith("the string does not match"), bad_id


@pytest.mark.parametrize("how", ["rm -r", "renamed away", "taken over by another agent"])
async def test_a_wait_on_a_set_removed_meanwhile_ends_at_once_not_at_its_timeout(tmp_path, how):
    """``askwright-bridge wait`` exits 2 when the set is removed while it
    waits; a wait over HTTP or MCP held the agent (and one of its waits)
    until the timeout, then said the set was not found."""
    import shutil

    from bridge.agents.errors import NotFound

    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question())
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_answers(tmp_path, Subscribers(sets.owner_of), stop, sets.changes))
    try:
        await asyncio.sleep(0.5)  # the watcher is up
        waiting = asyncio.ensure_future(wait_answers(sets, "a", "plan", timeout=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        began = time.monotonic()
        if how == "rm -r":
            shutil.rmtree(tmp_path / "plan")
        elif how == "renamed away":
            (tmp_path / "plan").rename(tmp_path / ".plan-old")
        else:  # (the wait re-checked every second until its timeout: 60 s here, up to 300)
            shutil.rmtree(tmp_path / "plan")
            sets.ask("b", "plan", one_question())
        with pytest.raises(NotFound, match="removed while waiting"):
            await asyncio.wait_for(waiting, 20)
        assert time.monotonic() - began < 5
        assert sets.changes.subscribers() == 0 and not sets.waits.held
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_subscriber_whose_notice_never_goes_holds_up_no_other_nor_the_watcher(tmp_path):
    """The watcher told each subscriber in turn, awaiting each send: one MCP
    connection whose send never returned (a client that stopped reading)
    stopped every notice after it, for every set, for good."""
    sets = AgentSets(tmp_path)
    for set_id in ("plan", "ship"):
        sets.ask("a", set_id, one_question(set_id))

    class Stuck:
        async def send_resource_updated(self, uri: str) -> None:
            await asyncio.Event().wait()  # never returns

    class Reading:
        def __init__(self) -> None:
            self.told: list[str] = []
            self.news = asyncio.Event()

        async def send_resource_updated(self, uri: str) -> None:
            self.told.append(uri)
            self.news.set()

    subscribers, stuck, reading = Subscribers(sets.owner_of), Stuck(), Reading()
    for set_id in ("plan", "ship"):
        uri = f"askwright://sets/{set_id}/answers"
        subscribers.add(uri, stuck, "a")  # first in line
        subscribers.add(uri, reading, "a")
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch_answers(tmp_path, subscribers, stop, sets.changes))
    try:
        await asyncio.sleep(0.5)  # the watcher is up
        record = {"qid": "branch", "q_rev": 1, "choice": "main", "label": "main", "source": {"sender": "@a:x"}}
        for set_id in ("plan", "ship"):
            reading.news.clear()
            AnswersFile(tmp_path / set_id, set_id).update(lambda doc, at: put_record(doc, record, at), utc_now())
            began = time.monotonic()
            await asyncio.wait_for(reading.news.wait(), 5)
            assert time.monotonic() - began < 1.0  # the watcher notices within its 100 ms debounce
            assert reading.told[-1] == f"askwright://sets/{set_id}/answers"
        # Told of a change without waiting on anyone's send.
        await asyncio.wait_for(subscribers.changed("plan"), 1)
    finally:
        stop.set()
        if not (await asyncio.wait({watcher}, timeout=5))[0]:
            watcher.cancel()  # (held by the stuck send)
        await asyncio.gather(watcher, return_exceptions=True)
        subscribers.forget(stuck)  # its connection closes: the stuck send with it


async def test_a_change_folded_into_a_notice_that_never_went_is_told_by_another(monkeypatch):
    """A change that came while a notice to a slow connection was on its way
    was left to that notice; when it timed out, the change was told to nobody."""
    from bridge.agents import mcp_server

    monkeypatch.setattr(mcp_server, "NOTICE_SECONDS", 0.2)

    class SlowThenReading:
        def __init__(self) -> None:
            self.calls, self.told = 0, asyncio.Event()

        async def send_resource_updated(self, uri: str) -> None:
            self.calls += 1
            if self.calls == 1:
                await asyncio.Event().wait()  # the first notice never goes out
            self.told.set()

    subscribers, session = Subscribers(lambda _set_id: "a"), SlowThenReading()
    subscribers.add("askwright://sets/plan/answers", session, "a")
    await subscribers.changed("plan")
    await asyncio.sleep(0.05)
    await subscribers.changed("plan")  # folded into the first, still on its way
    await asyncio.wait_for(session.told.wait(), 2)
    assert session.calls == 2
