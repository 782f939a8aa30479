"""The verifiable answer log against a real Synapse (issue 32): receipts in
answers.json, checkpoints held by the room, and ``verify`` catching tampering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import time

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.protocol import checkpoint as cp, merkle
from helpers.agents import agents_config, auth, free_port, wait_listener
from helpers.harness import answer_content, store_rows
from helpers.waiting import until
from helpers.sets import ALL_KINDS_PICKS, all_kinds_set

pytestmark = pytest.mark.integration

STATE = "dev.superpipeline.answer_log.checkpoint"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=120)


async def room_checkpoint(bridge, size: int, timeout: float = 30) -> dict:
    """The checkpoint state event the room holds, once it signs at least ``size`` leaves."""
    deadline = time.monotonic() + timeout
    origin = None
    while time.monotonic() < deadline:
        bridge.check_alive()
        origin = origin or _meta(bridge, "audit_origin")
        if origin:
            response = await bridge.alice.client.room_get_state_event(bridge.room_id, STATE, origin)
            content = getattr(response, "content", None)
            if isinstance(content, dict) and content.get("size", 0) >= size:
                return content
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of {size} leaves in the room\n{bridge.log_text()[-3000:]}")


def _meta(bridge, key: str) -> str | None:
    try:
        db = sqlite3.connect(f"file:{bridge.store_path}?mode=ro", uri=True, timeout=10)
        row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        db.close()
        return row[0] if row else None
    except sqlite3.Error:
        return None


async def test_answers_carry_receipts_the_room_holds_checkpoints_and_verify_catches_tampering(bridge, tmp_path):
    port = free_port()
    bridge.extra_config = {**agents_config(port), "audit": {"checkpoint_every": "1s"}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    picks = list(ALL_KINDS_PICKS.items())
    for qid, fields in picks[:3]:
        await bridge.alice.send(bridge.room_id, answer_content(questions[(qid, 1)], **fields))
    for qid, _fields in picks[:3]:
        await bridge.wait_answer("kinds", qid)
    first = await room_checkpoint(bridge, 3)
    for qid, fields in picks[3:]:
        await bridge.alice.send(bridge.room_id, answer_content(questions[(qid, 1)], **fields))
    for qid, _fields in picks[3:]:
        await bridge.wait_answer("kinds", qid)
    answers = bridge.answers("kinds")["answers"]
    last_index = max(record["receipt"]["index"] for record in answers.values())
    latest = await room_checkpoint(bridge, last_index + 1)
    assert latest["size"] > first["size"]

    # An agent checks a receipt over HTTP against the checkpoint the room holds.
    base = f"http://127.0.0.1:{port}"
    await wait_listener(bridge, base)
    origin, public = cp.parse_verifier_key(latest["key"])
    point = cp.open_checkpoint(latest["checkpoint"], public, origin)
    receipt = answers["branch"]["receipt"]
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.get(f"{base}/v1/log/inclusion", params={"index": str(receipt["index"]),
                                                                 "size": str(point.size)}) as response:
            assert response.status == 200
            proof = await response.json()
        merkle.verify_inclusion(receipt["index"], point.size, bytes.fromhex(receipt["leaf"]),
                                [bytes.fromhex(h) for h in proof["proof"]], point.root)
        async with http.get(f"{base}/v1/log/consistency", params={"from": str(first["size"]),
                                                                   "to": str(point.size)}) as response:
            body = await response.json()
        merkle.verify_consistency(first["size"], point.size, cp.open_checkpoint(first["checkpoint"], public,
                                  origin).root, point.root, [bytes.fromhex(h) for h in body["proof"]])
        async with http.get(f"{base}/v1/log/inclusion", params={"index": "999", "size": "1000"}) as response:
            assert response.status == 422  # well formed, past the tree
        async with http.get(f"{base}/v1/log/inclusion", params={"index": "1", "size": "9" * 16}) as response:
            assert response.status == 422  # past any tree (was refused as no whole number, 400)
        async with http.get(f"{base}/v1/log/leaves") as response:
            leaves_seen = await response.json()
        assert leaves_seen["size"] >= point.size and leaves_seen["leaves"] == []  # not this agent's set
    assert bridge.stop() == 0

    # One leaf per logged outcome, dense, none twice.
    db = sqlite3.connect(bridge.store_path)
    indexes = [row[0] for row in db.execute("SELECT idx FROM audit_leaf ORDER BY idx")]
    seqs = [row[0] for row in db.execute("SELECT seq FROM audit_leaf WHERE seq IS NOT NULL")]
    logged = db.execute("SELECT COUNT(*) FROM answer_log").fetchone()[0]
    db.close()
    assert indexes == list(range(len(indexes)))
    assert len(seqs) == len(set(seqs)) == logged

    set_dir, out = bridge.sets_root / "kinds", tmp_path / "export"
    exported = cli("audit", "export", "-c", str(bridge.config_path), "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    # A member with the power to send state puts junk under the log's state
    # key: ignored with a note (every later audit failed for good).
    origin = _meta(bridge, "audit_origin")
    await _let_send_state(bridge, bridge.alice.user_id)
    junk = await bridge.alice.client.room_put_state(bridge.room_id, STATE, {"checkpoint": "junk"}, state_key=origin)
    assert getattr(junk, "event_id", None), junk
    good = cli("verify", str(set_dir), "--log", str(out), "--room", "-c", str(bridge.config_path))
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[-1].startswith("all holds: 8 records"), good.stdout
    assert f"1 checkpoint event(s) sent by {bridge.alice.user_id}, not the bridge, are not signed" in good.stdout

    # The export re-signed by a new key of a new log (key.txt swapped, the
    # receipts' log dropped): the rooms' checkpoints of the log the answers
    # were given under were left aside, and it all held.
    _resign_as_another_log(out, tmp_path / "swapped", set_dir, tmp_path / "swapped-set")
    swapped = cli("verify", str(tmp_path / "swapped-set"), "--log", str(tmp_path / "swapped"), "--room", "-c",
                  str(bridge.config_path))
    assert swapped.returncode == 1, swapped.stdout + swapped.stderr
    assert "the rooms hold no checkpoint of the log 'example.org/forged'" in swapped.stdout
    assert f"the bridge ({bridge.bot['user_id']}) signed as another log, {origin!r}" in swapped.stdout

    # A record's choice changed in answers.json: that record is named.
    original = (set_dir / "answers.json").read_text()
    doc = json.loads(original)
    doc["answers"]["branch"]["choice"] = "stable" if doc["answers"]["branch"]["choice"] != "stable" else "main"
    (set_dir / "answers.json").write_text(json.dumps(doc))
    changed = cli("verify", str(set_dir), "--log", str(out))
    assert changed.returncode == 1
    assert f"record 'branch' (leaf {doc['answers']['branch']['receipt']['index']}): the record's answer" \
        in changed.stdout
    (set_dir / "answers.json").write_text(original)

    # A checkpoint signed by another key: named, exit 1.
    vkey = (out / "key.txt").read_text().strip()
    origin, public = cp.parse_verifier_key(vkey)
    leaves = (out / "leaves.jsonl").read_bytes().split(b"\n")[:-1]
    forged = tmp_path / "forged.txt"
    forged.write_text(cp.sign_checkpoint(cp.Checkpoint(origin, len(leaves), merkle.root(
        [merkle.leaf_hash(x) for x in leaves])), Ed25519PrivateKey.generate()))
    other = cli("verify", str(set_dir), "--log", str(out), "--checkpoint", str(forged))
    assert other.returncode == 1 and "not signed by the log's key" in other.stdout

    # Someone with the store and the key rewrites history: a leaf changed, the
    # store's checkpoints replaced by one over the new tree.  The export alone
    # then checks out; the checkpoints the room holds do not.
    from bridge.service.auditing.keys import read_key

    key = read_key(bridge.workdir / "bridge.sqlite.log-key")
    db = sqlite3.connect(bridge.store_path)
    # (A field no record repeats: one that does, such as the time, is caught by the records alone.)
    leaf = db.execute("SELECT leaf FROM audit_leaf WHERE idx=0").fetchone()[0].replace('"reason":null',
                                                                                      '"reason":"rewritten"', 1)
    assert '"reason":"rewritten"' in leaf
    db.execute("UPDATE audit_leaf SET leaf=?, hash=? WHERE idx=0", (leaf, merkle.leaf_hash(leaf.encode()).hex()))
    hashes = [bytes.fromhex(h) for (h,) in db.execute("SELECT hash FROM audit_leaf ORDER BY idx")]
    db.execute("DELETE FROM audit_checkpoint")
    db.execute("INSERT INTO audit_checkpoint(size, note, at) VALUES (?,?,0)", (len(hashes), cp.sign_checkpoint(
        cp.Checkpoint(origin, len(hashes), merkle.root(hashes)), key.private)))
    db.commit()
    db.close()
    doc = json.loads(original)  # ... and the receipt that names leaf 0 made to match
    for record in doc["answers"].values():
        if record["receipt"]["index"] == 0:
            record["receipt"]["leaf"] = merkle.leaf_hash(leaf.encode()).hex()
    (set_dir / "answers.json").write_text(json.dumps(doc))
    rewritten = tmp_path / "rewritten"
    assert cli("audit", "export", "-c", str(bridge.config_path), "-o", str(rewritten)).returncode == 0
    assert cli("verify", str(set_dir), "--log", str(rewritten)).returncode == 0  # the store alone can lie
    caught = cli("verify", str(set_dir), "--log", str(rewritten), "--room", "-c", str(bridge.config_path))
    assert caught.returncode == 1, caught.stdout
    assert "is not consistent with the latest" in caught.stdout

    # The key file lost while the log has leaves: the bridge refuses to start, in one line.
    (bridge.workdir / "bridge.sqlite.log-key").unlink()
    bridge.start()
    assert bridge.process.wait(60) == 2
    assert "leaves but its key file" in bridge.log_text().splitlines()[-1]

    # Unreadable inputs: exit 2, never a traceback.
    (rewritten / "leaves.jsonl").write_bytes(b'{"v":1')
    truncated = cli("verify", str(set_dir), "--log", str(rewritten))
    assert truncated.returncode == 2 and "truncated" in truncated.stderr and "Traceback" not in truncated.stderr


async def _let_send_state(bridge, user_id: str) -> None:
    """The bot (the room's creator) gives ``user_id`` power 50, enough to send state."""
    base = f"{bridge.synapse.url}/_matrix/client/v3/rooms/{bridge.room_id}/state/m.room.power_levels"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {bridge.bot['access_token']}"}) as http:
        async with http.get(base) as response:
            levels = await response.json()
        levels.setdefault("users", {})[user_id] = 50
        async with http.put(base, json=levels) as response:
            assert response.status == 200, await response.text()


def _resign_as_another_log(out, forged_out, set_dir, forged_set) -> None:
    shutil.copytree(out, forged_out)
    shutil.copytree(set_dir, forged_set)
    key = Ed25519PrivateKey.generate()
    (forged_out / "key.txt").write_text(cp.verifier_key("example.org/forged", cp.raw_public(key.public_key())) + "\n")
    leaves = (forged_out / "leaves.jsonl").read_bytes().split(b"\n")[:-1]
    for path in (forged_out / "checkpoints").glob("*.txt"):
        size = int(path.stem)
        path.write_text(cp.sign_checkpoint(cp.Checkpoint("example.org/forged", size, merkle.root(
            [merkle.leaf_hash(x) for x in leaves[:size]])), key))
    doc = json.loads((forged_set / "answers.json").read_text())
    for record in doc["answers"].values():
        record.get("receipt", {}).pop("log", None)
    (forged_set / "answers.json").write_text(json.dumps(doc))


async def test_an_agent_verifies_its_set_with_the_mcp_tool(bridge):
    """The MCP ``verify`` tool over streamable HTTP: the set an agent asked holds, and a changed choice is named."""
    from helpers.agents import structured

    async with _asked_and_answered(bridge, "1s") as (client, base, _questions):
        record = await bridge.wait_answer("release", "branch")
        await room_checkpoint(bridge, record["receipt"]["index"] + 1)
        result = structured(await client.call_tool("verify", {"set_id": "release"}))
        assert (result["holds"], result["records"], result["problems"]) == (True, 1, [])
        for agent, wanted in (("planner", ["release"]), ("other", [])):  # leaves only of the agent's own sets
            async with aiohttp.ClientSession(headers=auth(agent)) as leaves_http:
                async with leaves_http.get(f"{base}/v1/log/leaves") as response:
                    seen = (await response.json())["leaves"]
            assert sorted({json.loads(item["leaf"])["set"] for item in seen}) == wanted, agent
        path = bridge.sets_root / "release" / "answers.json"
        doc = json.loads(path.read_text())
        doc["answers"]["branch"]["choice"] = "stable"
        path.write_text(json.dumps(doc))
        result = structured(await client.call_tool("verify", {"set_id": "release"}))
        assert result["holds"] is False
        assert result["problems"][0].startswith("record 'branch'")


async def test_a_set_id_taken_again_by_another_agent_shows_it_none_of_the_earlier_sets_leaves(bridge):
    """Leaves go to the agent whose set they are about: the set's name alone
    is not that once its folder was removed and another agent took the name."""
    from helpers.agents import one_question

    async with _asked_and_answered(bridge, "1s") as (_client, base, _questions):
        await bridge.wait_answer("release", "branch")
        shutil.rmtree(bridge.sets_root / "release")

        async def closed() -> bool:
            return store_rows(bridge.store_path, "SELECT open FROM posted WHERE qid='branch'") == [(0,)]
        await until(closed, 30, "the removed set's question closed")
        async with aiohttp.ClientSession(headers=auth("other")) as http:
            async with http.put(f"{base}/v1/sets/release", json=one_question("release")) as response:
                assert response.status == 201, await response.text()
            async with http.get(f"{base}/v1/log/leaves") as response:
                seen = await response.json()
            assert seen["size"] >= 2 and seen["leaves"] == []  # the planner's answer and its question's closing
            # A range past the tree is refused, not answered with an end before its start.
            async with http.get(f"{base}/v1/log/leaves",
                                params={"start": seen["size"] + 1, "end": seen["size"] + 2}) as response:
                assert response.status == 422, await response.text()


async def test_an_answer_given_a_moment_ago_checks_out_before_the_bridge_signs_on_its_own(bridge, tmp_path):
    """The bridge signs on its own every audit.checkpoint_every (an hour
    here): the checkpoint an agent asks for, its MCP ``verify`` and an export
    taken right after an answer all cover that answer."""
    from helpers.agents import structured

    async with _asked_and_answered(bridge, "1h") as (client, base, questions):
        receipt = (await bridge.wait_answer("release", "branch"))["receipt"]

        async with aiohttp.ClientSession(headers=auth("planner")) as agent:
            async with agent.get(f"{base}/v1/log/checkpoint") as response:
                assert response.status == 200, await response.text()
                latest = await response.json()
            origin, public = cp.parse_verifier_key(latest["key"])
            point = cp.open_checkpoint(latest["checkpoint"], public, origin)
            assert point.size > receipt["index"]
            async with agent.get(f"{base}/v1/log/inclusion", params={"index": str(receipt["index"]),
                                                                     "size": str(point.size)}) as response:
                proof = [bytes.fromhex(h) for h in (await response.json())["proof"]]
        merkle.verify_inclusion(receipt["index"], point.size, bytes.fromhex(receipt["leaf"]), proof, point.root)

        await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="stable"))
        await _choice(bridge, "stable")
        result = structured(await client.call_tool("verify", {"set_id": "release"}))
        assert (result["holds"], result["problems"]) == (True, [])
        assert result["checkpoint_size"] == result["leaves"]

    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await _choice(bridge, "main")
    out = tmp_path / "export"
    exported = cli("audit", "export", "-c", str(bridge.config_path), "-o", str(out))  # the bridge still running
    assert exported.returncode == 0, exported.stderr
    checked = cli("verify", str(bridge.sets_root / "release"), "--log", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("all holds: 1 records")


async def _choice(bridge, choice: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while bridge.answers("release")["answers"]["branch"].get("choice") != choice:
        bridge.check_alive()
        assert time.monotonic() < deadline, bridge.log_text()[-3000:]
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _asked_and_answered(bridge, checkpoint_every: str):
    """The bridge with the agents' API; the agent "planner" asks one question
    over MCP and alice answers it "main".  Yields (the MCP client, the API's
    base URL, the questions the room shows)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from helpers.agents import one_question, structured

    port = free_port()
    bridge.extra_config = {**agents_config(port), "audit": {"checkpoint_every": checkpoint_every}}
    bridge.start()
    base = f"http://127.0.0.1:{port}"
    await wait_listener(bridge, base)
    http = httpx2.AsyncClient(headers=auth("planner"), timeout=httpx2.Timeout(30, read=120))
    async with Client(streamable_http_client(base + "/mcp", http_client=http)) as client:
        structured(await client.call_tool("ask", {"set": one_question("release")}))
        questions = await bridge.wait_questions(bridge.alice, 1)
        await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
        yield client, base, questions
