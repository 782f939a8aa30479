"""The agents' HTTP door itself, on a real loopback listener (no homeserver
needed): what it answers from a request's headers, and in what shape."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from bridge.agents.http import AgentApi
from bridge.service.config import parse_config
from helpers.agents import one_question
from helpers.config import GOOD
from helpers.expect import Asked
from helpers.served import served

TOKENS = {"planner": "planner-token-0123456789", "other": "other-token-0123456789"}


def auth(agent: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[agent]}"}


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **limits):
    raw = {**GOOD, "agents": {name: {"token": token} for name, token in TOKENS.items()},
           "agent_api": {"media_max": 3 * 1024 * 1024, "rate_per_minute": 10000, **limits}}
    config = parse_config(raw, base_dir=tmp_path, environ={})
    agent_api = AgentApi(config)
    async with served(agent_api.routes()) as port, aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        yield http, config.sets.root, agent_api


@pytest.fixture
async def api(tmp_path: Path):
    async with serving(tmp_path) as served_api:
        yield served_api


async def test_two_credentials_in_one_request_are_refused_and_authenticate_as_neither(api):
    """Authorization is a singleton field: with two, the first was taken, so
    whoever added the other header (a proxy, a client's default headers
    merged with a call's own) decided which agent the request was."""
    http, root, _ = api
    async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
    twice = [CIMultiDict([("Authorization", f"Bearer {TOKENS[first]}"), ("Authorization", f"Bearer {TOKENS[then]}")])
             for first, then in (("planner", "other"), ("other", "planner"), ("planner", "planner"))]
    folded = [{"Authorization": f"Bearer {TOKENS['planner']}, Bearer {TOKENS['other']}"},
              {"Authorization": f"Bearer {TOKENS['other']},Basic cGxhbm5lcjp4"}]
    for headers in [*twice, *folded]:
        async with http.get("/v1/sets/plan/answers", headers=headers) as response:
            body = await response.json()
            assert response.status == 400 and body["error"] == "bad_request", (headers, body)
            assert "Authorization" in body["message"] and "plan" not in body.get("answers", {}), body
        async with http.put("/v1/sets/theirs", json=one_question("theirs"), headers=headers) as response:
            assert response.status == 400, await response.text()
    assert sorted(p.name for p in root.iterdir()) == ["plan"]  # nothing written under either agent
    # One credential is taken as before.
    async with http.get("/v1/sets/plan/answers", headers=auth("planner")) as response:
        assert response.status == 200, await response.text()


async def test_what_the_headers_already_refuse_is_answered_before_the_body_is_sent(tmp_path):
    """``Expect: 100-continue`` was answered "100 Continue" unless the token
    was wrong or the body over the route's limit: a client then sent its
    megabytes to an unknown route, another agent's set, past its rate or its
    media quota, with a name no media file has, to be refused for what its
    headers had said.  Each is now the route's own refusal, in the same JSON,
    before a byte of the body, saying the connection closes after it."""
    async with serving(tmp_path, media_quota=1024 * 1024) as (http, root, agent_api):
        port = http._base_url.port
        planner = [("Authorization", f"Bearer {TOKENS['planner']}"), ("Content-Type", "application/json")]
        other = [("Authorization", f"Bearer {TOKENS['other']}"), ("Content-Type", "application/json")]
        octets = [("Authorization", f"Bearer {TOKENS['planner']}"), ("Content-Type", "application/octet-stream")]
        async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
            assert response.status == 201, await response.text()
        clip = os.urandom(700 * 1024)
        async with http.put("/v1/sets/plan/media/a.png", data=clip, headers=auth("planner")) as response:
            assert response.status == 201, await response.text()
        big = 5 * 1024 * 1024
        a_set, a_close, a_file = json.dumps(one_question("plan")).encode(), b"{}", os.urandom(600 * 1024)
        refused = [  # (request, what a body that is sent looks like, the refusal)
            ("PUT", "/v1/nothing/here", planner, big, a_set, 404, "not_found"),
            ("PATCH", "/v1/sets/plan", planner, big, a_set, 405, "method_not_allowed"),
            ("PUT", "/v1/sets/plan", other, 4096, a_set, 404, "not_found"),  # another agent's set
            ("POST", "/v1/sets/plan/close", other, 4096, a_close, 404, "not_found"),
            ("POST", "/v1/sets/nothing/close", planner, 4096, a_close, 404, "not_found"),
            ("PUT", "/v1/sets/plan/media/b.png", other[:1], 4096, a_file, 404, "not_found"),
            ("PUT", "/v1/sets/-bad", planner, 4096, a_set, 400, "bad_request"),  # no set id
            ("PUT", "/v1/sets/plan/media/run.exe", octets, 4096, a_file, 400, "bad_request"),
            ("PUT", "/v1/sets/plan/media/b.png", octets, len(a_file), a_file, 413, "quota_exceeded"),
            ("PUT", "/v1/sets/plan", [("Authorization", f"Bearer {TOKENS['other']}"), *planner], 4096, a_set, 400,
             "bad_request"),  # two credentials
        ]
        for method, path, headers, length, sent, status, code in refused:
            async with Asked(port, method, path, headers, length) as asked:
                got, got_headers, body = await asked.answer()
                assert got == status, (method, path, got, body)  # not "100 Continue"
                assert json.loads(body)["error"] == code, (method, path, body)
                assert got_headers.get("Connection") == "close", (method, path, got_headers)
            # The very answer the route gives once the body is in.
            async with http.request(method, path, data=sent, headers=headers) as response:
                after = await response.read()
                assert (response.status, json.loads(after)) == (got, json.loads(body)), (method, path)
        # The agent's big uploads under way fill its places: told before the body, 429 with Retry-After.
        places = [agent_api.bodies.take("planner", big) for _ in range(agent_api.bodies.per_agent)]
        async with Asked(port, "PUT", "/v1/sets/plan", planner, big) as asked:
            got, got_headers, body = await asked.answer()
            assert got == 429 and json.loads(body)["error"] == "too_many_uploads" and "Retry-After" in got_headers
        for give_back in places:
            give_back()


async def test_a_request_past_its_rate_is_refused_before_its_body_and_one_let_in_counts_once(tmp_path):
    """Over the rate, "100 Continue" came all the same and the 429 after the
    upload; a request let in before its body is counted once, not again when
    its body is in."""
    async with serving(tmp_path, rate_per_minute=3) as (http, root, _agent_api):
        port = http._base_url.port
        planner = [("Authorization", f"Bearer {TOKENS['planner']}"), ("Content-Type", "application/json")]
        data = json.dumps(one_question("plan")).encode()
        async with Asked(port, "PUT", "/v1/sets/plan", planner, len(data)) as asked:
            assert (await asked.answer())[0] == 100
            asked.writer.write(data)
            status, _headers, body = await asked.answer()
            assert status == 201, body
        for _ in range(2):  # the rest of the three
            async with http.get("/v1/sets", headers=auth("planner")) as response:
                assert response.status == 200, await response.text()
        async with Asked(port, "PUT", "/v1/sets/plan", planner, len(data)) as asked:
            status, headers, body = await asked.answer()
            assert status == 429 and json.loads(body)["error"] == "rate_limited" and int(headers["Retry-After"]) >= 1
            assert headers.get("Connection") == "close"


async def test_a_route_that_fails_unexpectedly_answers_json_logs_once_and_is_counted(api, monkeypatch, caplog):
    """An exception no route expected was aiohttp's plain-text 500, logged
    under aiohttp's name (so errors_total never counted it): now the API's
    JSON error, saying nothing of what failed, one ERROR line with the
    traceback, counted as every error the bridge logs."""
    import logging

    from bridge.service.operators.metrics import Metrics

    http, _root, agent_api = api
    metrics = Metrics()
    counter = metrics.error_counter()
    logging.getLogger("bridge").addHandler(counter)

    async def broken(*_args, **_kwargs):
        raise RuntimeError("secret-detail: /srv/sets/plan is on fire")

    monkeypatch.setattr(agent_api.sets, "list_sets_apart", broken)
    monkeypatch.setattr(agent_api.sets, "ask_apart", broken)
    try:
        with caplog.at_level(logging.INFO):
            async with http.get("/v1/sets", headers=auth("planner")) as response:
                assert response.status == 500
                assert response.content_type == "application/json", await response.text()
                body = await response.json()
            async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
                assert response.status == 500 and (await response.json())["error"] == "internal_error"
    finally:
        logging.getLogger("bridge").removeHandler(counter)
    assert body["ok"] is False and body["error"] == "internal_error", body
    assert "secret" not in json.dumps(body) and "RuntimeError" not in json.dumps(body), body
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 2, [r.getMessage() for r in failures]  # one a request, none of aiohttp's own
    assert all(r.name == "bridge.agents.http" and r.exc_info and r.exc_info[0] is RuntimeError for r in failures)
    assert metrics.errors.labels(where="http")._value.get() == 2
    # And the document says so: every route that can fail this way lists 500.
    async with http.get("/v1/openapi.json") as response:
        document = json.loads(await response.read())
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if path != "/v1/openapi.json":
                assert operation["responses"]["500"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"}, (method, path)
