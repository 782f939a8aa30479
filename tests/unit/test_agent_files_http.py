"""Files through the agents' HTTP API, served on a real loopback listener
(no homeserver needed): media in with PUT, people's files out with GET, and
every bad request a 4xx that names its field and leaves nothing on disk."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from bridge.agents.http import AgentApi
from bridge.agents.mcp_server import Tools
from bridge.agents.errors import BadRequest, NotFound, NotStored
from bridge.answers import document
from bridge.answers.file import AnswersFile
from bridge.service.config import parse_config
from bridge.wholefile import TEMP_MARK
from helpers.agents import one_question
from helpers.config import GOOD
from helpers.served import served

TOKENS = {"planner": "planner-token-0123456789", "other": "other-token-0123456789"}
NOW = "2026-12-01T10:00:00Z"


def auth(agent: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[agent]}"}


def compare_set(set_id: str, src: str = "take-2.mp4") -> dict:
    return {"askwright": 1, "id": set_id, "title": "Intro", "questions": [{
        "id": "takes", "kind": "compare", "title": "Intro take", "question": "Which take of the intro should ship?",
        "why": "Only one intro fits.", "look_for": ["Whether the voice stays level"],
        "sides": {"left": "t2", "right": "t5", "randomized": True},
        "options": [{"id": "t2", "label": "Take 2"}, {"id": "t5", "label": "Take 5"}],
        "guess": {"option": "t5", "why": "It is shorter.", "confidence": "low"},
        "media": [{"src": src, "label": "Take 2"}]}]}


@pytest.fixture
async def api(tmp_path: Path):
    raw = {**GOOD, "agents": {name: {"token": token} for name, token in TOKENS.items()},
           "agent_api": {"media_max": 3 * 1024 * 1024, "rate_per_minute": 10000}}
    config = parse_config(raw, base_dir=tmp_path, environ={})
    agent_api = AgentApi(config)
    async with served(agent_api.routes()) as port, aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        yield http, config.sets.root, agent_api


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP_MARK in p.name) if folder.exists() else []


def made(root: Path) -> list[str]:
    """What is in the sets' root (nothing when it was never made)."""
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def answered_with(set_dir: Path, set_id: str, files: list[str], by: dict[str, str] | None = None) -> None:
    """A person's answer naming ``files`` (already in attachments/), as the bridge records it;
    ``by``: those of them someone else added."""
    record = {"qid": "takes", "choice": "t2", "label": "Take 2", "note": "", "attachments": files, "timecodes": [],
              "q_rev": 1, "source": {"via": "matrix", "how": "reply", "room_id": "!r", "event_id": "$e",
                                     "sender": "@alice:hs", "ts": 1764500000000}}
    if by:
        record["attachments_by"] = by
    AnswersFile(set_dir, set_id).update(lambda doc, now: document.put_record(doc, record, now), NOW)


async def test_media_uploaded_before_the_set_is_what_the_set_names(api):
    http, root, _ = api
    clip = os.urandom(2 * 1024 * 1024 + 7)
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=clip, headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
        stored = await response.json()
    assert stored == {"ok": True, "set": "intro", "name": "take-2.mp4", "src": "take-2.mp4", "type": "video/mp4",
                      "size": len(clip), "sha256": hashlib.sha256(clip).hexdigest(), "created": True}
    assert (root / "intro" / "take-2.mp4").read_bytes() == clip
    async with http.get("/v1/sets", headers=auth("planner")) as response:
        assert (await response.json())["sets"] == []  # a folder holding media only is no set yet
    async with http.put("/v1/sets/intro", json=compare_set("intro"), headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
    again = os.urandom(1000)
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=again, headers=auth("planner")) as response:
        assert response.status == 200 and (await response.json())["created"] is False
    assert (root / "intro" / "take-2.mp4").read_bytes() == again
    assert leftovers(root / "intro") == []


async def test_a_set_naming_media_not_uploaded_is_refused_until_it_is(api):
    http, _root, _ = api
    async with http.put("/v1/sets/later", json=compare_set("later"), headers=auth("planner")) as response:
        assert response.status == 422
        assert [e["where"] for e in (await response.json())["errors"]] == ["questions[takes].media[0].src"]


async def test_bad_uploads_name_their_field_and_leave_nothing(api):
    http, root, _ = api
    async with http.put("/v1/sets/mine/media/a.png", data=b"\x89PNG", headers=auth("planner")) as response:
        assert response.status == 201
    async with http.put("/v1/sets/mine/media/notes.txt", data=b"hi", headers=auth("planner")) as response:
        assert response.status == 400
        body = await response.json()
        assert body["errors"][0]["where"] == "name" and ".txt" in body["message"]
    async with http.put("/v1/sets/mine/media/noextension", data=b"hi", headers=auth("planner")) as response:
        assert response.status == 400 and (await response.json())["errors"][0]["where"] == "name"
    for name in ("..%2Fother.png", ".hidden.png", "a..b.png", "%2E%2E.png"):
        async with http.put(f"/v1/sets/mine/media/{name}", data=b"x", headers=auth("planner")) as response:
            assert response.status in (400, 404), name
    async with http.put("/v1/sets/mine/media/big.mp4", data=b"\0" * (3 * 1024 * 1024 + 1),
                        headers=auth("planner")) as response:
        assert response.status == 413 and "media_max" in (await response.json())["message"]

    async def chunked():  # no Content-Length: counted while it streams
        for _ in range(4):
            yield b"\0" * (1024 * 1024)

    async with http.put("/v1/sets/mine/media/big.mp4", data=chunked(), headers=auth("planner")) as response:
        assert response.status == 413
    async with http.put("/v1/sets/mine/media/empty.png", data=b"", headers=auth("planner")) as response:
        assert response.status == 400
    # Another agent's folder, and a folder a local agent wrote, are not there.
    async with http.put("/v1/sets/mine/media/b.png", data=b"x", headers=auth("other")) as response:
        assert response.status == 404
    (root / "by-hand").mkdir()
    async with http.put("/v1/sets/by-hand/media/b.png", data=b"x", headers=auth("planner")) as response:
        assert response.status == 404
    async with http.put("/v1/sets/mine/media/b.png", data=b"x", headers={"Authorization": "Bearer no"}) as response:
        assert response.status == 401
    assert sorted(p.name for p in (root / "mine").iterdir()) == [".askwright-agent.json", "a.png"]
    assert list((root / "by-hand").iterdir()) == []
    assert not (root / "other.png").exists()


async def a_persons_file(http: aiohttp.ClientSession, root: Path, size: int) -> bytes:
    """The set "intro" asked, and a person's file of ``size`` bytes saved as attachments/takes-1.png."""
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=b"clip", headers=auth("planner")) as response:
        assert response.status == 201
    async with http.put("/v1/sets/intro", json=compare_set("intro"), headers=auth("planner")) as response:
        assert response.status == 201
    shot = os.urandom(size)
    (root / "intro" / "attachments").mkdir()
    (root / "intro" / "attachments" / "takes-1.png").write_bytes(shot)
    return shot


async def test_a_persons_file_downloads_whole_in_ranges_and_with_its_etag(api):
    http, root, _ = api
    shot = await a_persons_file(http, root, 1400 * 1024)
    (root / "intro" / "attachments" / "takes-2.png").write_bytes(b"not named by any answer")
    answered_with(root / "intro", "intro", ["attachments/takes-1.png"])

    async with http.get("/v1/sets/intro/answers", headers=auth("planner")) as response:
        (entry,) = (await response.json())["answers"]
    assert entry["attachments"] == [{"name": "takes-1.png", "type": "image/png", "size": len(shot),
                                     "sha256": hashlib.sha256(shot).hexdigest(),
                                     "url": "/v1/sets/intro/attachments/takes-1.png"}]
    url = entry["attachments"][0]["url"]
    async with http.get(url, headers=auth("planner")) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "image/png"
        assert int(response.headers["Content-Length"]) == len(shot)
        assert await response.read() == shot
        etag = response.headers["ETag"]
    async with http.get(url, headers={**auth("planner"), "Range": "bytes=1000-1999"}) as response:
        assert response.status == 206 and await response.read() == shot[1000:2000]
    async with http.get(url, headers={**auth("planner"), "If-None-Match": etag}) as response:
        assert response.status == 304
    # Only the files answers name, only the agent's own, never through a symlink.
    async with http.get("/v1/sets/intro/attachments/takes-2.png", headers=auth("planner")) as response:
        assert response.status == 404
    async with http.get(url, headers=auth("other")) as response:
        assert response.status == 404
    for name in ("..%2F..%2Fquestions.json", "%2E%2E", ".askwright-agent.json"):
        async with http.get(f"/v1/sets/intro/attachments/{name}", headers=auth("planner")) as response:
            assert response.status in (400, 404), name
    secret = root / "secret.png"
    secret.write_bytes(b"someone else's")
    os.unlink(root / "intro" / "attachments" / "takes-1.png")
    os.symlink(secret, root / "intro" / "attachments" / "takes-1.png")
    async with http.get(url, headers=auth("planner")) as response:
        assert response.status == 404
    async with http.get("/v1/sets/intro/answers", headers=auth("planner")) as response:
        gone = (await response.json())["answers"][0]["attachments"][0]
    assert (gone["name"], gone["size"], gone["url"]) == ("takes-1.png", None, None)


async def test_upload_media_over_mcp_takes_base64_and_refuses_what_http_refuses(api):
    import base64

    _http, root, agent_api = api
    tools = Tools(agent_api.sets, agent_api.config.agents)
    clip = os.urandom(100_000)
    stored = await tools.call("planner", "upload_media", {"set_id": "intro", "name": "take-2.mp4",
                                                          "data": base64.b64encode(clip).decode()})
    assert (stored["src"], stored["size"], stored["sha256"]) == ("take-2.mp4", len(clip), hashlib.sha256(clip).hexdigest())
    assert (root / "intro" / "take-2.mp4").read_bytes() == clip
    # Wrapped in lines, as MIME and the base64 command write it: the same bytes.
    await tools.call("planner", "upload_media", {"set_id": "intro", "name": "take-2.mp4",
                                                 "data": base64.encodebytes(clip[::-1]).decode()})
    assert (root / "intro" / "take-2.mp4").read_bytes() == clip[::-1]
    with pytest.raises(BadRequest, match="name"):
        await tools.call("planner", "upload_media", {"set_id": "intro", "name": "x.exe", "data": "AAAA"})
    with pytest.raises(BadRequest, match="data"):
        await tools.call("planner", "upload_media", {"set_id": "intro", "name": "x.png", "data": "not base64!"})
    with pytest.raises(NotFound):
        await tools.call("other", "upload_media", {"set_id": "intro", "name": "x.png", "data": "AAAA"})
    assert sorted(p.name for p in (root / "intro").iterdir()) == [".askwright-agent.json", "take-2.mp4"]
    asked = await tools.call("planner", "ask", {"set": compare_set("intro")})
    assert asked["created"] is True
    assert json.loads((root / "intro" / "questions.json").read_text())["questions"][0]["media"][0]["src"] == "take-2.mp4"


async def test_a_name_or_set_id_with_a_newline_at_its_end_is_refused_and_makes_nothing(api):
    """Python's $ matches before a final newline: a name with one at its end
    passed every check written ^...$ and became a file, and such a set id a
    folder no set can live in."""
    http, root, agent_api = api
    for url, where in (("/v1/sets/intro/media/take.png%0A", "name"), ("/v1/sets/intro%0A/media/take.png", "id"),
                       ("/v1/sets/intro/media/shots/take.png", "name")):
        async with http.put(URL(url, encoded=True), data=b"\x89PNG", headers=auth("planner")) as response:
            assert response.status == 400, (url, response.status, await response.text())
            assert (await response.json())["errors"][0]["where"] == where, url
    tools = Tools(agent_api.sets, agent_api.config.agents)
    with pytest.raises(BadRequest, match="name"):
        await tools.call("planner", "upload_media", {"set_id": "intro", "name": "take.png\n", "data": "AAAA"})
    with pytest.raises(BadRequest, match="set_id"):
        await tools.call("planner", "upload_media", {"set_id": "intro\n", "name": "take.png", "data": "AAAA"})
    assert made(root) == []


async def test_an_upload_refused_in_a_set_it_would_have_made_takes_no_set_id(api):
    """A refused upload to a new set id leaves no folder: the id is not the agent's for good."""
    http, root, agent_api = api

    async def over_the_limit():
        for _ in range(4):
            yield b"\0" * (1024 * 1024)

    for body in (b"", over_the_limit()):
        async with http.put("/v1/sets/intro/media/take.png", data=body, headers=auth("planner")) as response:
            assert response.status in (400, 413)
        assert made(root) == []
    with pytest.raises(BadRequest):
        await Tools(agent_api.sets, agent_api.config.agents).call(
            "planner", "upload_media", {"set_id": "intro", "name": "take.png", "data": ""})
    assert made(root) == []
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=b"clip", headers=auth("other")) as response:
        assert response.status == 201  # the id is free for whoever asks next
    # A claim that already holds a file is kept when a second upload fails.
    async with http.put("/v1/sets/intro/media/take-5.mp4", data=b"", headers=auth("other")) as response:
        assert response.status == 400
    assert sorted(p.name for p in (root / "intro").iterdir()) == [".askwright-agent.json", "take-2.mp4"]


async def test_a_folder_claimed_for_media_that_a_local_agent_writes_its_set_into_is_not_the_uploaders(api):
    """A media upload claims a set id before the set's first PUT; a local
    agent then wrote its own questions.json into that folder, and the
    uploading token read that set's answers, listed it, and could close it,
    while the folder's rightful writer's set answered like anyone's."""
    http, root, agent_api = api
    async with http.put("/v1/sets/release/media/take-2.mp4", data=b"clip", headers=auth("other")) as response:
        assert response.status == 201
    local = {**compare_set("release"), "questions": [{**compare_set("release")["questions"][0], "media": []}]}
    (root / "release" / "questions.json").write_text(json.dumps(local))
    for url in ("/v1/sets/release/answers", "/v1/sets/release/answers?all=1"):
        async with http.get(url, headers=auth("other")) as response:
            assert response.status == 404, (url, await response.text())
    async with http.get("/v1/sets", headers=auth("other")) as response:
        assert [s["set"] for s in (await response.json())["sets"]] == []
    async with http.post("/v1/sets/release/close", json={}, headers=auth("other")) as response:
        assert response.status == 404
    async with http.put("/v1/sets/release", json=compare_set("release"), headers=auth("other")) as response:
        assert response.status == 404  # the local agent's set is not taken over either
    assert json.loads((root / "release" / "questions.json").read_text()) == local
    # The claim's own set, put by its agent, is the agent's as before.
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=b"clip", headers=auth("other")) as response:
        assert response.status == 201
    async with http.put("/v1/sets/intro", json=compare_set("intro"), headers=auth("other")) as response:
        assert response.status in (200, 201), await response.text()
    async with http.get("/v1/sets/intro/answers", headers=auth("other")) as response:
        assert response.status == 200


async def test_a_range_of_another_unit_or_of_several_or_a_stale_if_range_gets_the_whole_file(api, caplog):
    # Each of these logged an error with a traceback (the file answered twice)
    # and closed the connection the client kept alive.
    caplog.set_level("ERROR")
    http, root, _ = api
    shot = await a_persons_file(http, root, 60_000)
    answered_with(root / "intro", "intro", ["attachments/takes-1.png"])
    url = "/v1/sets/intro/attachments/takes-1.png"
    async with http.get(url, headers=auth("planner")) as response:
        etag, modified = response.headers["ETag"], response.headers["Last-Modified"]
    later = format_datetime(parsedate_to_datetime(modified) + timedelta(hours=1), usegmt=True)
    for headers in ({"Range": "bytes=0-1,5-6"}, {"Range": "items=0-5"},
                    {"Range": "bytes=0-9", "If-Range": '"an-older-version"'},
                    {"Range": "bytes=0-9", "If-Range": f"W/{etag}"},
                    # A date must be the Last-Modified exactly, and what is neither a tag nor a date matches nothing.
                    {"Range": "bytes=0-9", "If-Range": later}, {"Range": "bytes=0-9", "If-Range": "garbage"}):
        async with http.get(url, headers={**auth("planner"), **headers}) as response:
            assert (response.status, await response.read()) == (200, shot), headers
    for if_range in (etag, modified):
        async with http.get(url, headers={**auth("planner"), "Range": "bytes=0-9", "If-Range": if_range}) as response:
            assert (response.status, await response.read()) == (206, shot[:10]), if_range
    async with http.head(url, headers={**auth("planner"), "Range": "items=0-5"}) as response:
        assert response.status == 200 and int(response.headers["Content-Length"]) == len(shot)
    for unsatisfiable in ("bytes=70000-", "bytes=-0"):  # past the end; the last no bytes
        async with http.get(url, headers={**auth("planner"), "Range": unsatisfiable}) as response:
            assert response.status == 416 and response.headers["Content-Range"] == f"bytes */{len(shot)}"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_a_request_no_route_takes_is_answered_in_json(api):
    http, _root, _ = api
    async with http.delete("/v1/sets/intro", headers=auth("planner")) as response:
        assert response.status == 405 and response.headers["Allow"] == "PUT"
        assert (await response.json())["error"] == "method_not_allowed"
    async with http.get("/v1/nothing/here", headers=auth("planner")) as response:
        assert response.status == 404 and (await response.json())["error"] == "not_found"


async def test_a_files_hash_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    from bridge.agents import attachment_files

    hashed: list[str] = []
    real = attachment_files._hash_file

    def counting(path):
        hashed.append(str(path))
        return real(path)

    monkeypatch.setattr(attachment_files, "_hash_file", counting)
    digests = attachment_files.Digests()
    shot = tmp_path / "takes-1.png"
    shot.write_bytes(os.urandom(3 * 1024 * 1024))
    first = await digests.describe(shot)
    for _ in range(5):  # an agent reading again and again, as a wait loop does
        assert await digests.describe(shot) == first
    assert len(hashed) == 1
    shot.write_bytes(b"another file")
    os.utime(shot, ns=(1, 1))
    again = await digests.describe(shot)
    assert again == attachment_files.Described(12, hashlib.sha256(b"another file").hexdigest())
    assert len(hashed) == 2


def test_media_max_is_100_mb_unless_configured(tmp_path):
    from bridge.agents.media_files import DEFAULT_MEDIA_MAX
    from bridge.service.config import ConfigError

    assert parse_config(GOOD, base_dir=tmp_path, environ={}).agent_api.media_max == DEFAULT_MEDIA_MAX == 100 * 1024 * 1024
    with pytest.raises(ConfigError, match="agent_api.media_max"):
        parse_config({**GOOD, "agent_api": {"media_max": 0}}, base_dir=tmp_path, environ={})


async def test_the_put_envelope_of_a_set_is_checked_as_its_parts_say(api):
    """``{"set": ..., "callbacks": [...]}``: callbacks null was taken as none,
    and callbacks without a set was read as a bare questions.json (a 422
    about its id) instead of naming what is missing."""
    http, root, _ = api
    for body, field in (({"set": compare_set("intro"), "callbacks": None}, "body.callbacks"),
                        ({"callbacks": []}, "body.set"),
                        ({"set": [compare_set("intro")]}, "body.set"),
                        ({"set": compare_set("intro"), "callbacks": [7]}, "body.callbacks.0"),
                        ({"set": compare_set("intro"), "hooks": []}, "body.hooks")):
        async with http.put("/v1/sets/intro", json=body, headers=auth("planner")) as response:
            assert response.status == 400, await response.text()
            error = await response.json()
            assert error["message"].startswith(field + ":"), error
            assert [f["where"] for f in error["errors"]] == [field], error
    assert made(root) == []


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "in the envelope"])
async def test_a_number_past_a_double_is_refused_not_written_as_infinity(api, wrapped):
    """``1e400`` in a set: 201, and questions.json written with ``Infinity``,
    which no reader takes: the set was never posted, nor listed, nor read."""
    http, root, _ = api
    text = json.dumps(compare_set("intro"))[:-1] + ', "x_big": 1e400}'
    body = f'{{"set": {text}}}' if wrapped else text
    async with http.put("/v1/sets/intro", data=body.encode(), headers={**auth("planner"),
                                                                        "Content-Type": "application/json"}) as response:
        assert response.status == 400, await response.text()
        assert "too large" in (await response.json())["message"]
    assert made(root) == []


async def test_a_set_that_cannot_be_read_is_named_without_where_the_bridge_keeps_it(api):
    # The 404's message carried the sets root's absolute path.
    http, root, _ = api
    from helpers.agents import one_question

    async with http.put("/v1/sets/intro", json=one_question("intro"), headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
    (root / "intro" / "questions.json").write_text("{")
    async with http.get("/v1/sets/intro/answers", headers=auth("planner")) as response:
        assert response.status == 404
        message = (await response.json())["message"]
    assert "intro/questions.json" in message and str(root) not in message, message


async def test_a_malformed_request_never_puts_its_token_in_the_log(api, caplog):
    # A token read from a file with its newline, or a client ending lines in
    # LF: aiohttp refuses the request and quotes the offending header line,
    # which the bridge logged as it was.
    import asyncio
    import logging

    from bridge.service.operators.health import quiet_client_faults

    quiet_client_faults()
    http, _root, _ = api
    host, port = http._base_url.host, http._base_url.port
    caplog.set_level(logging.INFO, logger="aiohttp.server")
    for raw in (f"GET /v1/sets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['planner']}\n\r\n",
                f"GET /v1/sets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['planner']}\x00\r\n\r\n"):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(raw.encode())
        await writer.drain()
        assert (await reader.read(1024)).split(b" ")[1] == b"400"
        writer.close()
    await asyncio.sleep(0.1)
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "400" in said and TOKENS["planner"] not in said and "planner-token" not in said
    # The scheme is case-insensitive (RFC 7235): a lowercase one names the agent too.
    async with http.get("/v1/sets", headers={"Authorization": f"bearer {TOKENS['planner']}"}) as response:
        assert response.status == 200


async def test_a_file_of_a_question_whose_id_has_dots_in_a_row_is_served(api):
    # A question id may be v1..2 (lint allows it), and its files are named
    # after it: the API listed them with size, sha256 and url null, as if gone,
    # and refused to serve them.
    http, root, _ = api
    shot = await a_persons_file(http, root, 2048)
    os.rename(root / "intro" / "attachments" / "takes-1.png", root / "intro" / "attachments" / "v1..2-1.png")
    answered_with(root / "intro", "intro", ["attachments/v1..2-1.png"])
    async with http.get("/v1/sets/intro/answers", headers=auth("planner")) as response:
        (listed,) = (await response.json())["answers"][0]["attachments"]
    assert (listed["size"], listed["url"]) == (len(shot), "/v1/sets/intro/attachments/v1..2-1.png")
    async with http.get(listed["url"], headers=auth("planner")) as response:
        assert response.status == 200 and await response.read() == shot


async def test_a_file_someone_else_added_names_them_in_read_and_over_http(api):
    http, root, _ = api
    await a_persons_file(http, root, 2000)
    (root / "intro" / "attachments" / "takes-2.png").write_bytes(b"Bo's screenshot")
    answered_with(root / "intro", "intro", ["attachments/takes-1.png", "attachments/takes-2.png"],
                  by={"attachments/takes-2.png": "@bo:hs"})
    async with http.get("/v1/sets/intro/answers", headers=auth("planner")) as response:
        (entry,) = (await response.json())["answers"]
    assert [f.get("sent_by") for f in entry["attachments"]] == [None, "@bo:hs"]
    assert "attachments_by" not in entry  # no path of the bridge's disk over HTTP
    from bridge.answers.read import read_view
    set_dir = root / "intro"
    doc = json.loads((set_dir / "answers.json").read_text())
    view = read_view(doc, None, str(set_dir.resolve()), include_all=False)
    assert view["answers"][0]["attachments_by"] == {str(set_dir.resolve() / "attachments" / "takes-2.png"): "@bo:hs"}


async def test_one_agent_trickling_many_big_bodies_holds_only_its_share_of_memory(api):
    """Thirty PUTs of a 16 MB set, each sent to its last bytes and then
    trickled, were all read into memory at once (390 MB held, and the rate
    budget allowed hundreds).  Past four big bodies at once an agent is told
    to come back (429, Retry-After); another agent is served meanwhile."""
    http, _root, agent_api = api
    port = http._base_url.port
    size = 16 * 1024 * 1024
    held: list[asyncio.StreamWriter] = []

    async def start_upload() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"PUT /v1/sets/big{len(held)} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Authorization: Bearer {TOKENS['planner']}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {size}\r\n\r\n".encode() + b" " * (1024 * 1024))
        await writer.drain()
        held.append(writer)
        return reader, writer

    try:
        for _ in range(4):
            await start_upload()
        await asyncio.sleep(0.3)
        reader, _writer = await start_upload()
        head = (await asyncio.wait_for(reader.read(4096), 10)).decode()
        assert head.startswith("HTTP/1.1 429") and "Retry-After: 5" in head and "too_many_uploads" in head, head
        async with http.put("/v1/sets/other-set", json=one_question("other-set"), headers=auth("other")) as response:
            assert response.status == 201, await response.text()
    finally:
        for writer in held:
            writer.close()
    await asyncio.sleep(0.3)
    assert agent_api.bodies.reading == {}  # every place given back when the uploads went away


async def test_slow_media_uploads_count_against_the_big_body_caps_and_give_their_place_back(api):
    """A media PUT streams to disk, so it was never counted: one agent held
    thirty slow 100 MB uploads at once, a connection and a file each.  Past
    four at once it is told to come back (429 too_many_uploads,
    Retry-After), claims no set id, and another agent is served; each place
    comes back when its upload ends, stored, refused or cut off."""
    http, root, agent_api = api
    port = http._base_url.port
    held: list[asyncio.StreamWriter] = []

    async def start_upload(set_id: str) -> asyncio.StreamReader:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"PUT /v1/sets/{set_id}/media/clip.mp4 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Authorization: Bearer {TOKENS['planner']}\r\nContent-Type: application/octet-stream\r\n"
                     f"Content-Length: {2 * 1024 * 1024}\r\n\r\n".encode() + b"x" * 1000)
        await writer.drain()
        held.append(writer)
        return reader

    try:
        for n in range(4):
            await start_upload(f"slow{n}")
        await asyncio.sleep(0.3)
        head = (await asyncio.wait_for((await start_upload("one-more")).read(4096), 10)).decode()
        assert head.startswith("HTTP/1.1 429") and "Retry-After: 5" in head and "too_many_uploads" in head, head
        assert "one-more" not in made(root)
        async with http.put("/v1/sets/other-set/media/a.png", data=b"p" * 100_000, headers=auth("other")) as response:
            assert response.status == 201, await response.text()
    finally:
        for writer in held:
            writer.close()
    await asyncio.sleep(0.3)
    assert agent_api.bodies.reading == {}  # the cut-off uploads gave theirs back
    big = b"m" * 100_000
    for _ in range(5):  # stored, then refused (too large, found only as it streams): neither keeps its place
        async with http.put("/v1/sets/slow0/media/done.png", data=big, headers=auth("planner")) as response:
            assert response.status in (200, 201), await response.text()

        async def too_much():
            yield b"m" * (3 * 1024 * 1024 + 1)
        async with http.put("/v1/sets/slow0/media/over.png", data=too_much(), headers=auth("planner")) as response:
            assert response.status == 413, await response.text()
    assert agent_api.bodies.reading == {}


async def test_a_client_asking_before_it_sends_a_body_is_refused_before_it_sends_it(api):
    """Expect: 100-continue with a body past the limit or a wrong token got
    "100 Continue" and then the refusal: curl had sent 2.7 MB for nothing."""
    http, _root, _agent_api = api
    port = http._base_url.port

    async def first_answer(path: str, token: str, length: int, expect: str = "100-continue") -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
                     f"Expect: {expect}\r\n\r\n".encode())
        await writer.drain()
        try:
            return (await asyncio.wait_for(reader.read(4096), 10)).decode()
        finally:
            writer.close()

    assert (await first_answer("/v1/sets/plan", TOKENS["planner"], 17 * 1024 * 1024)).startswith("HTTP/1.1 413")
    assert (await first_answer("/v1/sets/plan", "wrong-token-0123456789", 100)).startswith("HTTP/1.1 401")
    assert (await first_answer("/v1/sets/plan/media/take.png", TOKENS["planner"],
                               4 * 1024 * 1024)).startswith("HTTP/1.1 413")  # media_max is 3 MB here
    assert (await first_answer("/v1/sets/plan", TOKENS["planner"], 100)).startswith("HTTP/1.1 100 Continue")
    # An expectation the API does not meet: 417 in its own shape (aiohttp's was plain text).
    refused = await first_answer("/v1/sets/plan", TOKENS["planner"], 100, expect="something-else")
    assert refused.startswith("HTTP/1.1 417") and '"error": "expectation_failed"' in refused, refused


async def test_a_path_no_route_takes_is_a_404_beside_the_appservices_catch_all(tmp_path):
    """In appservice mode the transaction server's catch-all ("*" on every
    path) shares the listener: every unknown /v1 path was a 405 with "Allow: *",
    and a known one's Allow named "*" beside its methods."""
    from aiohttp import web

    config = parse_config({**GOOD, "agents": {name: {"token": token} for name, token in TOKENS.items()}},
                          base_dir=tmp_path, environ={})
    routes = AgentApi(config).routes()

    async def unrecognised(_request: web.Request) -> web.Response:
        return web.json_response({"errcode": "M_UNRECOGNIZED"}, status=404)

    routes.route("*", "/{tail:.*}")(unrecognised)
    async with served(routes) as port, aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        async with http.get("/v1/nothing/here", headers=auth("planner")) as response:
            assert response.status == 404 and (await response.json())["error"] == "not_found"
        async with http.delete("/v1/sets/intro", headers=auth("planner")) as response:
            assert response.status == 405 and response.headers["Allow"] == "PUT"


async def test_a_full_disk_is_a_507_in_the_apis_shape_for_a_set_and_a_first_upload(api, monkeypatch):
    """ENOSPC while a set (or the folder a first upload claims) was written
    escaped as aiohttp's plain-text 500; the document declares 507 not_stored."""
    import errno

    from bridge.agents import sets as sets_module
    from bridge.wholefile import replace_whole as real

    def full(path, data, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    http, root, agent_api = api
    monkeypatch.setattr(sets_module, "replace_whole", full)
    async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
        assert response.status == 507, await response.text()
        assert (await response.json())["error"] == "not_stored"
    async with http.put("/v1/sets/fresh/media/shot.png", data=b"\x89PNG" + bytes(100),
                        headers=auth("planner")) as response:
        assert response.status == 507, await response.text()
        assert (await response.json())["error"] == "not_stored"
    monkeypatch.setattr(sets_module, "replace_whole", real)
    assert made(root) == []  # nothing left behind
    # Closing rewrites questions.json: on a full disk a 507 not_stored too
    # (it was a bare 500 and a traceback; over MCP an internal_error), the set
    # as it was, and the document says so.
    async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
    before = (root / "plan" / "questions.json").read_bytes()
    monkeypatch.setattr(sets_module, "replace_whole", full)
    async with http.post("/v1/sets/plan/close", json={}, headers=auth("planner")) as response:
        assert response.status == 507, await response.text()
        assert (await response.json())["error"] == "not_stored"
    with pytest.raises(NotStored):
        await Tools(agent_api.sets, agent_api.config.agents).call("planner", "close", {"set_id": "plan"})
    assert (root / "plan" / "questions.json").read_bytes() == before
    close_responses = json.loads(await (await http.get("/v1/openapi.json")).read())[
        "paths"]["/v1/sets/{id}/close"]["post"]["responses"]
    assert "507" in close_responses


async def test_an_upload_whose_commit_is_cancelled_or_fails_after_the_rename_leaves_nothing(api, monkeypatch):
    """The commit runs on a thread a cancel waits for: the rename went
    through, then the cancel (the client gone, a timeout) was raised, and the
    file sat under its name, its folder claimed, after an upload that
    failed; a failed fsync of the folder after the rename answered 507
    "nothing was left" over a file left in place."""
    import base64
    import errno
    import threading
    import time

    from bridge import wholefile

    http, root, agent_api = api
    renamed, real_sync = threading.Event(), wholefile.sync_dir

    def slow_sync(folder: Path) -> None:
        if Path(folder) == root / "intro":
            renamed.set()  # (after the rename, before the folder's fsync)
            time.sleep(0.3)
        real_sync(folder)

    monkeypatch.setattr(wholefile, "sync_dir", slow_sync)
    uploading = asyncio.ensure_future(Tools(agent_api.sets, agent_api.config.agents).call(
        "planner", "upload_media", {"set_id": "intro", "name": "take-2.mp4",
                                    "data": base64.b64encode(os.urandom(200_000)).decode()}))
    assert await asyncio.to_thread(renamed.wait, 10)
    uploading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await uploading
    assert made(root) == []  # no file, and the set id it claimed is free again

    def failing_sync(folder: Path) -> None:
        if Path(folder) == root / "fresh":
            raise OSError(errno.EIO, "Input/output error")
        real_sync(folder)

    monkeypatch.setattr(wholefile, "sync_dir", failing_sync)
    async with http.put("/v1/sets/fresh/media/shot.png", data=b"\x89PNG" + bytes(100),
                        headers=auth("planner")) as response:
        assert response.status == 507 and (await response.json())["error"] == "not_stored"
    assert made(root) == []
    monkeypatch.setattr(wholefile, "sync_dir", real_sync)
    async with http.put("/v1/sets/intro/media/take-2.mp4", data=b"clip", headers=auth("other")) as response:
        assert response.status == 201  # the id is free for whoever asks next
