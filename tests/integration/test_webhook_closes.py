"""Every way a question closes reaches its agent's webhook once, saying why:
closed, withdrawn, superseded, replaced by a revision, removed from the set,
and the set removed.  Against the real Synapse, a real receiver."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from helpers.agents import SECRETS, Receiver, agents_config, auth, free_port, one_question
from helpers.harness import unique

pytestmark = pytest.mark.integration


def question(qid: str, title: str) -> dict[str, Any]:
    q = copy.deepcopy(one_question("x")["questions"][0])
    return {**q, "id": qid, "title": title, "question": f"{title}: which branch should it follow?"}


def set_folder(root: Path, set_id: str) -> Path:
    [found] = [p.parent for p in root.rglob("questions.json") if json.loads(p.read_text()).get("id") == set_id]
    return found


async def closes(receiver: Receiver, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The question.closed bodies taken so far, once there are ``count``."""
    for _ in range(int(timeout * 10)):
        found = [t["body"] for t in receiver.taken if t["body"]["type"] == "question.closed"]
        if len(found) >= count:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"{len(found)} of {count} question.closed webhooks: {found}")


async def test_each_way_a_question_closes_is_one_webhook_with_its_why(bridge):
    receiver = Receiver(SECRETS["planner"])
    await receiver.start()
    port = free_port()
    bridge.extra_config = agents_config(port, webhook_urls={"planner": receiver.url})
    base = f"http://127.0.0.1:{port}"
    set_id = unique("closes")
    titles = {"cut": "Release branch", "done": "Freeze date", "drop": "Splash screen",
              "old": "Old wording", "new": "New wording", "gone": "Changelog style"}
    body = {**one_question(set_id), "questions": [question(qid, title) for qid, title in titles.items()]}
    bridge.start()
    try:
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            for _ in range(150):
                bridge.check_alive()
                try:
                    async with http.put(f"{base}/v1/sets/{set_id}", json=body) as response:
                        assert response.status == 201, await response.text()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.2)
            posted = await bridge.wait_questions(bridge.alice, len(titles))
            event_of = {qid: event["event_id"] for (qid, rev), event in posted.items()}

            async def put(change) -> None:
                current = json.loads((set_folder(bridge.sets_root, set_id) / "questions.json").read_text())
                change(current)
                async with http.put(f"{base}/v1/sets/{set_id}", json=current) as response:
                    assert response.status == 200, await response.text()

            async def close(**fields: Any) -> None:
                async with http.post(f"{base}/v1/sets/{set_id}/close", json=fields) as response:
                    assert response.status == 200, await response.text()

            # A new revision replaces the posted one.
            def revise(data):
                cut = next(q for q in data["questions"] if q["id"] == "cut")
                cut["rev"], cut["question"] = 2, "Which branch should the 2.0 release be cut from?"
            await put(revise)
            await closes(receiver, 1)
            await close(questions=["done"], status="closed")
            await closes(receiver, 2)
            await close(questions=["drop"], status="withdrawn", reason="Cut from the release")
            await closes(receiver, 3)

            def supersede(data):
                old = next(q for q in data["questions"] if q["id"] == "old")
                old["status"], old["superseded_by"] = "superseded", "new"
            await put(supersede)
            await closes(receiver, 4)
            await put(lambda data: data.update(questions=[q for q in data["questions"] if q["id"] != "gone"]))
            await closes(receiver, 5)
            revised = await bridge.wait_questions(bridge.alice, len(titles) + 1)
            cut_rev2 = revised[("cut", 2)]["event_id"]

        # The folder removed whole: its two open postings close with it.
        shutil.rmtree(set_folder(bridge.sets_root, set_id))
        # (On a loaded machine the last PUT's owner read came while rm -r had
        # taken the owner file: the agent was forgotten and these never came.)
        told = await closes(receiver, 7)
        await asyncio.sleep(3)  # a second webhook for any of them, were there one, would be here now
        told = await closes(receiver, 7)
        whys = sorted((t["qid"], t["q_rev"], t["question_event_id"], t["why"]) for t in told)
        assert whys == sorted([
            ("cut", 1, event_of["cut"], "replaced by revision 2"),
            ("done", 1, event_of["done"], "closed"),
            ("drop", 1, event_of["drop"], "withdrawn (Cut from the release)"),
            ("old", 1, event_of["old"], f"superseded by “{titles['new']}”"),
            ("gone", 1, event_of["gone"], "removed from the set"),
            ("cut", 2, cut_rev2, "this set was removed"),
            ("new", 1, event_of["new"], "this set was removed"),
        ])
        assert all(t["set"] == set_id and t["agent"] == "planner" for t in told)
        # Exactly one each: one key per posting, each taken once, every POST signed.
        keys = [t["id"] for t in told]
        assert len(set(keys)) == len(keys) == 7
        assert sorted(k for k in receiver.ok if k.startswith("question.closed:")) == sorted(keys)
        assert all(a["good"] for a in receiver.attempts)
    finally:
        await receiver.close()


async def test_the_docs_receiver_run_as_written_takes_every_event_once_and_refuses_the_unsigned(bridge, tmp_path):
    """docs/agents.md's receiver, copied as an agent's author would (its port
    and secret alone changed): it lost every question.closed (no record),
    marking it seen before the failure so the retry was taken as done."""
    import re
    import subprocess
    import sys

    from helpers.agents import wait_listener
    from helpers.harness import answer_content
    from helpers.waiting import until

    docs = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", docs.read_text(), re.S)
                   if "X-Askwright-Signature" in block)
    hook_port = free_port()
    snippet = snippet.replace('b"another-long-random-string"', repr(SECRETS["planner"].encode()))
    snippet = snippet.replace("port=8080", f"host='127.0.0.1', port={hook_port}")
    (tmp_path / "receiver.py").write_text(snippet)
    said = tmp_path / "receiver.out"
    receiver = subprocess.Popen([sys.executable, "-u", str(tmp_path / "receiver.py")], stdout=said.open("w"),
                                stderr=subprocess.STDOUT)
    port = free_port()
    bridge.extra_config = agents_config(port, webhook_urls={"planner": f"http://127.0.0.1:{hook_port}/askwright"})
    bridge.start()
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_listener(bridge, base)
        set_id = unique("docs")
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
                assert response.status == 201, await response.text()
            (question,) = (await bridge.wait_questions(bridge.alice, 1)).values()
            await bridge.alice.send(bridge.room_id, answer_content(question, option_id="main"))
            await until(lambda: "answer.accepted" in said.read_text(), timeout=30)
            async with http.post(f"{base}/v1/sets/{set_id}/close", json={"status": "closed"}) as response:
                assert response.status == 200, await response.text()
            await until(lambda: "question.closed" in said.read_text(), timeout=30)
        async with aiohttp.ClientSession() as anyone:
            async with anyone.post(f"http://127.0.0.1:{hook_port}/askwright", data=b"{}") as response:
                assert response.status == 401
    finally:
        receiver.terminate()
        receiver.wait()
    out = said.read_text()
    assert "Traceback" not in out and "Error" not in out, out
    assert [line.split()[0] for line in out.splitlines() if line.startswith(("answer.", "question."))] == \
        ["answer.accepted", "question.closed"], out


async def test_the_closes_of_a_folder_removed_go_to_the_callbacks_the_agent_named_last(bridge):
    """The agent asked again, only its callbacks changed (nothing new to
    post), then its folder went: "this set was removed" went to the callback
    it had dropped, and the one it named last heard nothing."""
    dropped, named = Receiver(SECRETS["planner"]), Receiver(SECRETS["planner"])
    await dropped.start()
    await named.start()
    port = free_port()
    bridge.extra_config = agents_config(port)
    base = f"http://127.0.0.1:{port}"
    set_id = unique("moved")
    bridge.start()
    try:
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async def ask(callback: str, status: int) -> None:
                for _ in range(150):
                    bridge.check_alive()
                    try:
                        async with http.put(f"{base}/v1/sets/{set_id}",
                                            json={"set": one_question(set_id), "callbacks": [callback]}) as response:
                            assert response.status == status, await response.text()
                            return
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.2)

            await ask(dropped.url, 201)
            await bridge.wait_questions(bridge.alice, 1)
            await ask(named.url, 200)
            await asyncio.sleep(2)  # the bridge takes the set again: nothing to post
        shutil.rmtree(set_folder(bridge.sets_root, set_id))
        [told] = await closes(named, 1)
        assert told["why"] == "this set was removed"
        await asyncio.sleep(2)
        assert not [t for t in dropped.taken if t["body"]["type"] == "question.closed"]
    finally:
        await dropped.close()
        await named.close()
