"""Files people send arrive whole, at real sizes (issue 27): 1 byte to 10 MB,
exactly the configured limit and one byte past it, in bot and appservice
mode, plain and encrypted rooms, from a matrix-nio person and from a
matrix-js-sdk person; and a download cut off midway is tried again, never
saved short."""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import pytest

from bridge.devserver import free_port
from helpers.attack import AS_BOT, Relay
from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson
from helpers.files import LIMIT, OUTCOME, check_files, files_set, random_files, send_files
from helpers.harness import Bridge, Person, answer_content, unique
from helpers.waiting import until

pytestmark = pytest.mark.integration

QUESTIONS = len(files_set()["questions"])


@pytest.fixture
async def files_room(request, tmp_path):
    """A room with one person in it and a bridge (attachments.max_bytes =
    12 MiB) not yet started; the parameter is "<mode>-<plain|encrypted>"."""
    mode, room_kind = request.param.split("-")
    encrypted = room_kind == "encrypted"
    synapse = request.getfixturevalue("appservice_synapse" if mode == "appservice" else "synapse")
    account = synapse.register(unique("person"))
    alice = EncryptingPerson(synapse, account, tmp_path / "alice-keys") if encrypted else Person(synapse, account)
    state = [ENCRYPTION_STATE] if encrypted else []
    extra: dict = {"attachments": {"max_bytes": LIMIT}}
    if mode == "appservice":
        bot = {"user_id": AS_BOT, "access_token": None}
        room_id = synapse.create_room(alice.token, invite=[AS_BOT], initial_state=state)
        extra["appservice"] = dict(synapse.appservice)
    else:
        bot = synapse.register(unique("askbot"))
        room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id], initial_state=state)
        synapse.join(alice.token, room_id)
    if encrypted:
        await alice.cross_sign()
        extra["encryption"] = {"grace": "30s"}
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    env = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot, extra_config=extra)
    env.sets_root.mkdir()
    env.alice = alice
    env.encrypted = encrypted
    yield env
    env.kill()
    await alice.close()


@pytest.mark.parametrize("files_room", ["bot-plain", "bot-encrypted", "appservice-plain", "appservice-encrypted"],
                         indirect=True)
async def test_every_size_up_to_the_limit_is_kept_byte_for_byte_and_one_byte_more_is_refused(files_room):
    bridge, alice = files_room, files_room.alice
    bridge.add_set(files_set())
    bridge.start()
    questions = await bridge.wait_questions(alice, QUESTIONS, timeout=60)
    files = random_files()
    await send_files(alice, bridge.room_id, questions, files, encrypted=bridge.encrypted)
    await check_files(bridge, alice, files)


@pytest.fixture
async def js_files_room(synapse, tmp_path, js_sdk):
    """An encrypted room the bot made, a person on matrix-js-sdk in it."""
    from helpers.jsperson import JsPerson

    bot = synapse.register(unique("askbot"))
    alice = JsPerson(synapse, synapse.register(unique("person")), tmp_path / "alice-js.log")
    room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id], initial_state=[ENCRYPTION_STATE])
    synapse.join(alice.token, room_id)
    await alice.start()
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    env = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot,
                 extra_config={"attachments": {"max_bytes": LIMIT}, "encryption": {"grace": "60s"}})
    env.sets_root.mkdir()
    env.alice = alice
    yield env
    env.kill()
    await alice.close()


async def test_a_matrix_js_sdk_person_in_an_encrypted_room_too(js_files_room, tmp_path):
    bridge, alice = js_files_room, js_files_room.alice
    bridge.add_set(files_set())
    bridge.start()
    questions = await bridge.wait_questions(alice, QUESTIONS, timeout=90)
    files = random_files()
    for file in files:  # her client encrypts each file as Element does (AES-256-CTR, the hash of the ciphertext)
        path = tmp_path / file.name
        path.write_bytes(file.data)
        sent = await alice.call("send_file", room_id=bridge.room_id, path=str(path), name=file.name,
                                thread_root=questions[(file.qid, 1)]["event_id"], with_size=len(file.data) <= LIMIT,
                                timeout=120)
        assert sent["encrypted"] is True
        file.event_id = sent["event_id"]
    await check_files(bridge, alice, files)


# ---------------------------------------------------------------- a download cut off midway


class MediaProxy(Relay):
    """The homeserver as the bridge reaches it, through a proxy that passes
    everything on but media downloads: of those it fetches the whole body,
    sends the status line and the full Content-Length, and leaves the body
    to ``_serve``."""

    async def __aenter__(self) -> "MediaProxy":
        await super().__aenter__()
        assert self._runner is not None
        self._runner._shutdown_timeout = 1.0  # a sync still waiting at the homeserver is not waited for
        return self

    async def _relay(self, request):
        from aiohttp import web

        if "/media/download/" not in request.path:
            return await super()._relay(request)
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        async with self._http.get(self.target + request.path_qs, headers=headers) as upstream:
            data = await upstream.read()
            if upstream.status != 200:
                return web.Response(status=upstream.status, body=data, content_type=upstream.content_type)
        response = web.StreamResponse(status=200)
        response.content_type = "application/octet-stream"
        response.content_length = len(data)
        await response.prepare(request)
        await self._serve(request, response, data)
        return response

    async def _serve(self, request, response, data: bytes) -> None:
        await response.write(data)
        await response.write_eof()


class CuttingProxy(MediaProxy):
    """A media body closed after its half, ``cuts`` times (every time when
    None), as a connection that dies in the middle of a transfer does."""

    def __init__(self, listen: tuple[str, int], target: str, cuts: int | None):
        super().__init__(listen, target)
        self.cuts = cuts
        self.cut: list[str] = []
        self.whole: list[str] = []

    async def _serve(self, request, response, data: bytes) -> None:
        if self.cuts is None or len(self.cut) < self.cuts:
            self.cut.append(request.path)
            await response.write(data[:len(data) // 2])
            await asyncio.sleep(0.1)  # the half is on its way before the connection dies
            request.transport.close()
            return
        self.whole.append(request.path)
        await super()._serve(request, response, data)


@pytest.mark.parametrize("cuts", [2, None], ids=["lands-on-the-third-try", "refused-after-the-tries"])
async def test_a_download_cut_off_midway_is_tried_again_and_never_saved_short(bridge, cuts):
    port = free_port()
    async with CuttingProxy(("127.0.0.1", port), bridge.synapse.url, cuts) as proxy:
        try:
            await cut_off(bridge, proxy, port, cuts)
        finally:
            bridge.kill()  # its sync waiting in the proxy would hold the proxy's shutdown


async def cut_off(bridge: Bridge, proxy: CuttingProxy, port: int, cuts: int | None) -> None:
    bridge.extra_config = {"homeserver": {"url": f"http://127.0.0.1:{port}"},
                           "attachments": {"max_bytes": LIMIT}}
    alice = bridge.alice
    bridge.add_set(files_set())
    bridge.start()
    questions = await bridge.wait_questions(alice, QUESTIONS, timeout=60)
    [file] = random_files((3_200_000,))  # the PDF of the issue
    await send_files(alice, bridge.room_id, questions, [file], encrypted=False)
    other = await alice.send(bridge.room_id, answer_content(questions[("q1", 1)], text="the settings page"))
    notice = await alice.wait_notice(bridge.room_id, file.event_id, timeout=120)
    outcome, body = notice["content"][OUTCOME], notice["content"]["body"]
    folder = bridge.sets_root / "files" / "attachments"
    if cuts is not None:
        assert outcome["outcome"] == "recorded", body
        assert len(proxy.cut) == cuts and len(proxy.whole) == 1
        saved = folder / "q0-1.bin"
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == file.sha256
        assert sorted(p.name for p in folder.iterdir()) == ["q0-1.bin"]
    else:
        assert (outcome["outcome"], outcome["reason"]) == ("refused", "attachment_not_fetched"), body
        assert f"“{file.name}” could not be downloaded whole" in body
        assert len(proxy.cut) == 3 and proxy.whole == []
        # Nothing saved short, no part file left behind.
        assert not folder.exists() or list(folder.iterdir()) == []
        assert "q0" not in bridge.answers("files")["answers"]
    # Nothing else was held up for good: the answer sent beside the file landed.
    assert (await bridge.wait_answer("files", "q1", timeout=60))["text"] == "the settings page"
    assert (await alice.wait_notice(bridge.room_id, other))["content"][OUTCOME]["outcome"] == "recorded"


# ---------------------------------------------------------------- a file fetched over federation first


class LateHeadersProxy(MediaProxy):
    """The homeserver fetching the file from the sender's server before it
    answers: Synapse has a remote file whole before it sends a byte, so its
    response (status line and all) comes ``late`` seconds after the ask."""

    def __init__(self, listen: tuple[str, int], target: str, late: float):
        super().__init__(listen, target)
        self.late = late
        self.asked = 0

    async def _relay(self, request):
        if "/media/download/" in request.path:
            self.asked += 1
            await asyncio.sleep(self.late)
        return await super()._relay(request)


async def test_a_picture_the_homeserver_fetches_for_25_s_before_answering_lands_whole(bridge):
    """A 5 MB screenshot from another server: nothing at all for 25 s (the
    homeserver fetching it over federation), then all of it.  Its first
    byte was held to the body's 20 s stall bound, so such a file was refused
    on every try."""
    port = free_port()
    async with LateHeadersProxy(("127.0.0.1", port), bridge.synapse.url, late=25) as proxy:
        try:
            questions, file = await a_file_behind(bridge, port, size=5_000_000)
            notice = await bridge.alice.wait_notice(bridge.room_id, file.event_id, timeout=120)
            assert notice["content"][OUTCOME]["outcome"] == "recorded", notice["content"]["body"]
            saved = bridge.sets_root / "files" / "attachments" / "q0-1.bin"
            assert hashlib.sha256(saved.read_bytes()).hexdigest() == file.sha256
            assert proxy.asked == 1  # taken on the first try, not after the tries ran out
        finally:
            bridge.kill()  # its sync waiting in the proxy would hold the proxy's shutdown


# ---------------------------------------------------------------- a download that stalls


class StallingProxy(MediaProxy):
    """A media body that stops after its half until ``released`` is set (a
    content repository, or a federated server, that hangs); that try then
    dies, and the next one gets it all."""

    def __init__(self, listen: tuple[str, int], target: str):
        super().__init__(listen, target)
        self.released = asyncio.Event()
        self.stalled = 0
        self.served = 0  # whole bodies, once released

    async def _serve(self, request, response, data: bytes) -> None:
        if self.released.is_set():
            await super()._serve(request, response, data)
            self.served += 1
            return
        self.stalled += 1
        await response.write(data[:len(data) // 2])
        await self.released.wait()
        request.transport.close()


async def a_file_behind(bridge: Bridge, port: int, size: int = 3_200_000) -> tuple[dict, Any]:
    """The bridge started with the homeserver behind the proxy at ``port``,
    and a file of ``size`` bytes (3.2 MB: the PDF of the issue) Alice sends to q0: (the questions, the file)."""
    bridge.extra_config = {**bridge.extra_config, "homeserver": {"url": f"http://127.0.0.1:{port}"}}
    bridge.add_set(files_set())
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTIONS, timeout=60)
    [file] = random_files((size,))
    await send_files(bridge.alice, bridge.room_id, questions, [file], encrypted=False)
    return questions, file


@pytest.mark.parametrize("files_room", ["bot-plain", "appservice-plain"], indirect=True)
async def test_a_stalled_download_holds_up_no_other_answer_and_lands_once_it_moves_even_across_a_kill(files_room):
    # A batch waited for its files: one stalled download held every later
    # answer, in every room, for up to three tries of 20 s and more (and in
    # appservice mode the homeserver's push timed out, counting the bridge
    # down). Now the batch goes on after a few seconds and the file's event
    # is judged once its download ends, also after a kill -9 in between.
    bridge, alice = files_room, files_room.alice
    port = free_port()
    async with StallingProxy(("127.0.0.1", port), bridge.synapse.url) as proxy:
        try:
            questions, file = await a_file_behind(bridge, port)
            other = await alice.send(bridge.room_id, answer_content(questions[("q1", 1)], text="the settings page"))
            # Landed while the file is still stalled (it would be given up after about a minute and a half).
            assert (await bridge.wait_answer("files", "q1", timeout=45))["text"] == "the settings page"
            assert (await alice.wait_notice(bridge.room_id, other))["content"][OUTCOME]["outcome"] == "recorded"
            assert proxy.stalled >= 1 and not proxy.released.is_set()
            bridge.kill()  # with the file still coming: kept in the store, fetched again at the start
            proxy.released.set()
            bridge.start()
            notice = await alice.wait_notice(bridge.room_id, file.event_id, timeout=90)
            assert notice["content"][OUTCOME]["outcome"] == "recorded", notice["content"]["body"]
            saved = bridge.sets_root / "files" / "attachments" / "q0-1.bin"
            assert hashlib.sha256(saved.read_bytes()).hexdigest() == file.sha256
            record = bridge.answers("files")["answers"]["q0"]
            assert record["attachments"] == ["attachments/q0-1.bin"]
            assert sorted(p.name for p in saved.parent.iterdir()) == ["q0-1.bin"]
        finally:
            bridge.kill()


@pytest.mark.parametrize("files_room", ["bot-plain"], indirect=True)
async def test_a_file_whose_message_is_redacted_while_it_comes_is_not_left_behind(files_room):
    """Alice sends a file, then takes it back while it is still coming: once
    it is in, its event is judged to record nothing, and the file must go as
    a withdrawn one does (it stayed in attachments/ for good, named by no
    answer and served to no agent)."""
    bridge, alice = files_room, files_room.alice
    port = free_port()
    async with StallingProxy(("127.0.0.1", port), bridge.synapse.url) as proxy:
        try:
            questions, file = await a_file_behind(bridge, port)
            await until(lambda: proxy.stalled >= 1, what="the download under way", timeout=30)
            redacted = await alice.client.room_redact(bridge.room_id, file.event_id)
            assert not hasattr(redacted, "status_code"), redacted
            other = await alice.send(bridge.room_id, answer_content(questions[("q1", 1)], text="the settings page"))
            await alice.wait_notice(bridge.room_id, other)  # the redaction is in the store too by now
            proxy.released.set()
            await until(lambda: proxy.served >= 1, what="the file fetched whole", timeout=60)
            folder = bridge.sets_root / "files" / "attachments"
            await until(lambda: not folder.exists() or not any(folder.iterdir()), what="no file left", timeout=20)
            assert "q0" not in bridge.answers("files")["answers"]
        finally:
            bridge.kill()


async def _withdrawn_said(person: Any, room_id: str, withdrawn: str) -> str | None:
    """The body of the word back on ``withdrawn`` taken back, None before it is there."""
    return next((e["content"]["body"] for e in await person.messages(room_id)
                 if e.get("content", {}).get("dev.superpipeline.question.withdrawn", {}).get("withdrawn_event_id")
                 == withdrawn), None)


def _edit_of(original: str, content: dict[str, Any]) -> dict[str, Any]:
    """An edit of a file message sending ``content``'s file (m.new_content carries no relation)."""
    new = {k: v for k, v in content.items() if k != "m.relates_to"}
    return {**new, "body": f"* {new['body']}", "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": original}}


@pytest.mark.parametrize("files_room", ["bot-plain", "bot-encrypted"], indirect=True)
async def test_an_edit_sending_another_file_brings_that_file_and_one_of_a_refused_file_is_judged(files_room):
    """A file message edited to another file was told "Kept, as changed"
    while answers.json kept the first file and the new one was never
    fetched; an edit of a file refused as too large got no word at all."""
    from helpers.files import SentFile, in_thread, upload_file

    bridge, alice = files_room, files_room.alice
    bridge.add_set(files_set())
    bridge.start()
    questions = await bridge.wait_questions(alice, QUESTIONS, timeout=60)
    root = {qid: questions[(qid, 1)]["event_id"] for qid in ("q0", "q1")}
    old, new = SentFile("q0", "old.bin", os.urandom(1_400_000)), SentFile("q0", "new.bin", os.urandom(3_000_000))
    big, small = SentFile("q1", "big.bin", os.urandom(LIMIT + 1)), SentFile("q1", "small.bin", os.urandom(70_000))
    first = await alice.send(bridge.room_id, in_thread(root["q0"], await upload_file(alice, old, bridge.encrypted)))
    refused = await alice.send(bridge.room_id, in_thread(root["q1"], await upload_file(alice, big, bridge.encrypted)))
    assert (await alice.wait_notice(bridge.room_id, first, timeout=60))["content"][OUTCOME]["outcome"] == "recorded"
    told = await alice.wait_notice(bridge.room_id, refused, timeout=60)
    assert told["content"][OUTCOME]["reason"] == "attachment_too_large"
    edits = {}
    for original, file in ((first, new), (refused, small)):
        edits[file.name] = await alice.send(bridge.room_id, _edit_of(original, await upload_file(
            alice, file, bridge.encrypted)))
    for name, qid in (("new.bin", "q0"), ("small.bin", "q1")):
        notice = await alice.wait_notice(bridge.room_id, edits[name], timeout=60)
        assert notice["content"][OUTCOME]["outcome"] == "recorded", notice["content"]["body"]
    folder = bridge.sets_root / "files"
    for qid, file in (("q0", new), ("q1", small)):
        (path,) = (await bridge.wait_answer("files", qid))["attachments"]
        assert hashlib.sha256((folder / path).read_bytes()).hexdigest() == file.sha256, f"{qid}: not the new file"
    # The edit taken back brings the first file back, and is said so: it was
    # "Your answer … is withdrawn; no answer is recorded now, only your notes".
    await alice.redact(bridge.room_id, edits["new.bin"])
    await until(lambda: _withdrawn_said(alice, bridge.room_id, edits["new.bin"]), what="the word back", timeout=60)
    said = await _withdrawn_said(alice, bridge.room_id, edits["new.bin"])
    assert said == f"Your edit to “{questions[('q0', 1)]['content']['question']['title']}” is " \
                   "withdrawn; what you sent before it stands: a file.", said
    (path,) = bridge.answers("files")["answers"]["q0"]["attachments"]
    assert hashlib.sha256((folder / path).read_bytes()).hexdigest() == old.sha256
    # Element's caption edit sends the same file again: the file kept stays, its caption becomes the note.
    same = await upload_file(alice, SentFile("q2", "shot.bin", os.urandom(70_000)), bridge.encrypted)
    shot = await alice.send(bridge.room_id, in_thread(questions[("q2", 1)]["event_id"], same))
    await alice.wait_notice(bridge.room_id, shot, timeout=60)
    captioned = await alice.send(bridge.room_id, _edit_of(shot, {**same, "body": "the settings page"}))
    await alice.wait_notice(bridge.room_id, captioned, timeout=60)
    record = bridge.answers("files")["answers"]["q2"]
    assert record["attachments"] == ["attachments/q2-1.bin"] and record["note"] == "the settings page"
