"""What the poster puts in a question's thread: the promised background, and
the media with the video last so the thread's summary shows it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.protocol.outcome import txn_id
from bridge.protocol.question_event import content_size
from bridge.questionset.model import QuestionSet
from bridge.service.posting import media
from bridge.service.posting.poster import Poster, PostReport
from bridge.service.storage.store import Store

pytestmark = pytest.mark.usefixtures("store_backend")  # on SQLite and on PostgreSQL

ROOM = "!room:hs"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (4).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"\x00" * 16


class Transport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []
        self.uploads: list[str] = []

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        self.sent.append((event_type, content, txn_id))
        return f"$e{len(self.sent)}"

    async def upload(self, data: bytes, mimetype: str, name: str) -> str:
        self.uploads.append(name)
        return f"mxc://hs/{name.replace('.', '_')}"


def question(**fields: Any) -> dict[str, Any]:
    q = {
        "id": "bg",
        "kind": "confirm",
        "title": "With a one-pager",
        "question": "Ship the background-checked change?",
        "why": "The background changes the risk.",
        "options": [{"id": "ship", "label": "Ship the change"}, {"id": "hold", "label": "Hold the change"}],
        "guess": {"option": "ship", "why": "Low risk.", "confidence": "low"},
    }
    q.update(fields)
    return q


def run_poster(tmp_path: Path, q: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Transport, Store]:
    monkeypatch.setattr(media, "probe", lambda _path: (None, None, None))
    set_dir = tmp_path / "qa"
    set_dir.mkdir(exist_ok=True)
    raw = {"askwright": 1, "id": "qa", "title": "QA", "questions": [q]}
    (set_dir / "questions.json").write_text(json.dumps(raw))
    qset = QuestionSet.model_validate(raw)
    store = Store(tmp_path / "bridge.sqlite")
    transport = Transport()
    poster = Poster(store, transport, room_for=lambda _set: ROOM, load_set=lambda _dir: (qset, []))
    asyncio.run(poster.sync_root(tmp_path))
    return transport, store


def thread_of(transport: Transport, root: str) -> list[tuple[dict[str, Any], str]]:
    return [(c, txn) for _t, c, txn in transport.sent if c.get("m.relates_to", {}).get("event_id") == root]


def test_the_background_is_posted_in_the_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "chart.png").write_bytes(PNG)
    q = question(one_pager=[
        {"type": "text", "text": "Background: the change touches <b>three</b> services."},
        {"type": "facts", "items": [{"label": "Risk", "value": "low"}]},
        {"type": "image", "src": "chart.png", "caption": "Error rate"},
        {"type": "image", "src": "missing.png", "caption": "Not there"},
        {"type": "table", "columns": ["Service", "Change"], "rows": [["sync", "retry"]]},
    ])
    transport, store = run_poster(tmp_path, q, monkeypatch)
    root_type, root, _ = transport.sent[0]
    assert root_type == "m.room.message" and "posted in this message's thread" in root["body"]
    thread = thread_of(transport, "$e1")
    assert [c["msgtype"] for c, _ in thread] == ["m.notice", "m.image", "m.notice", "m.notice"]
    first = thread[0][0]
    assert "the change touches &lt;b&gt;three&lt;/b&gt; services." in first["formatted_body"]
    assert "<strong>Risk:</strong> low" in first["formatted_body"]
    assert first["m.relates_to"]["rel_type"] == "m.thread"
    # The file is resolved and uploaded like a media item; one that isn't there is named.
    assert thread[1][0]["url"] == "mxc://hs/chart_png" and thread[1][0]["body"] == "Error rate"
    assert "missing.png" in thread[2][0]["body"] and "could not be sent" in thread[2][0]["body"]
    assert "<table>" in thread[3][0]["formatted_body"]
    assert all(content_size(c) < 60_000 for c, _ in thread)
    # Deterministic transaction ids: a retry is the same transaction.
    assert len({txn for _, txn in thread}) == len(thread)
    sent = len(transport.sent)
    qset = QuestionSet.model_validate({"askwright": 1, "id": "qa", "title": "QA", "questions": [q]})
    asyncio.run(media.post_one_pager(qset, qset.questions[0], tmp_path / "qa", "$e1", ROOM, store, transport))
    assert len(transport.sent) == sent  # posted once
    store.close()


def test_no_background_no_thread_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transport, store = run_poster(tmp_path, question(), monkeypatch)
    assert thread_of(transport, "$e1") == []
    store.close()


def test_captions_go_before_the_video_and_say_what_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "splash_pair.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    (tmp_path / "qa" / "splash_pair.vtt").write_bytes(b"WEBVTT\n")
    q = question(kind="compare", media=[{"src": "splash_pair.mp4", "label": "Both animations"}],
                 look_for=["The first second: does the picture stay sharp?"],
                 sides={"left": "hold", "right": "ship", "randomized": True},
                 one_pager=[{"type": "text", "text": "Why two."}])
    transport, store = run_poster(tmp_path, q, monkeypatch)
    thread = [c for c, _ in thread_of(transport, "$e1")]
    # The background first, then the captions, and the video last: the
    # thread summary shows the last message.
    assert [c["msgtype"] for c in thread] == ["m.notice", "m.file", "m.video"]
    assert thread[1]["filename"] == "splash_pair.vtt"
    assert thread[1]["body"] == "Captions (WebVTT subtitles) for the video splash_pair.mp4, which follows"
    assert thread[2]["body"] == "Both animations"
    store.close()


def test_a_close_the_room_was_not_told_of_is_told_on_the_next_pass(tmp_path: Path) -> None:
    set_dir = tmp_path / "qa"
    set_dir.mkdir()
    raw = {"askwright": 1, "id": "qa", "title": "QA", "questions": [question()]}
    store = Store(tmp_path / "bridge.sqlite")
    transport = Transport()
    current = {"set": QuestionSet.model_validate(raw)}
    poster = Poster(store, transport, room_for=lambda _set: ROOM, load_set=lambda _dir: (current["set"], []))
    asyncio.run(poster.sync_set(set_dir, PostReport()))

    current["set"] = QuestionSet.model_validate({**raw, "questions": [question(status="withdrawn", reason="moot")]})
    failing = Transport()

    async def refused(room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        raise RuntimeError("M_FORBIDDEN")

    failing.send = refused  # type: ignore[method-assign]
    poster.transport = failing
    with pytest.raises(RuntimeError):
        asyncio.run(poster.sync_set(set_dir, PostReport()))
    assert store.latest_posted(str(set_dir.resolve()), "bg").open is False  # answers are refused from the close on

    poster.transport = transport
    asyncio.run(poster.sync_set(set_dir, PostReport()))
    asyncio.run(poster.sync_set(set_dir, PostReport()))  # said once, not on every pass
    closes = [(c, txn) for _t, c, txn in transport.sent if "dev.superpipeline.question.closed" in c]
    assert len(closes) == 1
    content, txn = closes[0]
    assert content["dev.superpipeline.question.closed"]["why"] == "withdrawn (moot)"
    assert content["m.relates_to"]["event_id"] == "$e1"
    assert txn == txn_id("close", "$e1")  # the transaction id a send that did get through would have had


def test_a_media_upload_the_homeserver_fails_once_is_tried_again_before_the_question_goes_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One 502 on the upload posted the question for good without its screen
    # ("could not be sent"), never tried again: people answered it blind.
    from types import SimpleNamespace

    from bridge.service.transport.matrix import MatrixError

    class Flaky(Transport):
        failures = 1

        async def upload(self, data: bytes, mimetype: str, name: str) -> str:
            if self.failures:
                self.failures -= 1
                raise MatrixError(f"uploading {name}", SimpleNamespace(
                    status_code="M_UNKNOWN", message="Bad Gateway", transport_response=SimpleNamespace(status=502)))
            return await super().upload(data, mimetype, name)

    monkeypatch.setattr(media, "probe", lambda _path: (None, None, None))
    set_dir = tmp_path / "qa"
    set_dir.mkdir()
    (set_dir / "chart.png").write_bytes(PNG)
    raw = {"askwright": 1, "id": "qa", "title": "QA", "questions": [question(media=[{"src": "chart.png"}])]}
    (set_dir / "questions.json").write_text(json.dumps(raw))
    qset = QuestionSet.model_validate(raw)
    store = Store(tmp_path / "bridge.sqlite")
    transport = Flaky()
    poster = Poster(store, transport, room_for=lambda _set: ROOM, load_set=lambda _dir: (qset, []))
    first = asyncio.run(poster.sync_root(tmp_path))
    assert first.failed == [set_dir] and transport.sent == []  # nothing posted without its screen
    second = asyncio.run(poster.sync_dirs(first.failed))
    assert second.failed == []
    posted = transport.sent[0][1]
    assert "chart.png" in json.dumps(posted["question"]["media"]) and "mxc://hs/chart_png" in json.dumps(posted)
    assert not any("could not be sent" in c.get("body", "") for _t, c, _txn in transport.sent)


def test_a_big_clip_is_sent_from_its_file_never_read_whole(tmp_path: Path) -> None:
    # A 60 MB clip took 64 MB of the bridge's memory to post (read whole,
    # then chunked), four sets posted at once; a plain room's upload now
    # reads the file as it is sent.  Its size and hash are the file's.
    import asyncio
    import hashlib
    import os

    from bridge.service.storage.store import Store

    clip = tmp_path / "take.mp4"
    clip.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    given: list[object] = []

    class Streaming(Transport):
        async def upload(self, data: object, mimetype: str, name: str) -> str:
            given.append(data)
            return await super().upload(data, mimetype, name)  # type: ignore[arg-type]

    store = Store(tmp_path / "s.sqlite")
    upload = asyncio.run(media._upload_once(clip, store, Streaming()))
    assert given == [clip]  # the path, not its bytes
    assert upload.size == clip.stat().st_size
    url, info = store.upload_of(hashlib.sha256(clip.read_bytes()).hexdigest())
    assert url == upload.url and info["size"] == upload.size
    store.close()


def test_a_file_replaced_while_it_is_uploaded_is_never_kept_under_the_old_bytes_hash(tmp_path: Path) -> None:
    """An agent's PUT renamed a new file into place between the bridge's
    hashing and its upload: the new bytes went up and were filed under the
    old bytes' hash (with the old size), and a later question showing the
    old file was posted with the new one."""
    import asyncio
    import hashlib
    import os

    from bridge.service.storage.store import Store

    shot = tmp_path / "shot.png"
    old, new = PNG + os.urandom(3000), PNG + os.urandom(40)
    shot.write_bytes(old)
    sent: list[bytes] = []

    class Swapped(Transport):
        async def upload(self, data: object, mimetype: str, name: str) -> str:
            if not sent:  # the agent's new file comes as the first upload starts
                staged = tmp_path / ".shot.png.new"
                staged.write_bytes(new)
                os.replace(staged, shot)
            sent.append(Path(data).read_bytes())  # type: ignore[arg-type]
            return f"mxc://hs/{len(sent)}"

    store = Store(tmp_path / "s.sqlite")
    upload = asyncio.run(media._upload_once(shot, store, Swapped()))
    assert sent == [new, new] and upload.url == "mxc://hs/2" and upload.size == len(new)
    assert store.upload_of(hashlib.sha256(old).hexdigest()) is None
    assert store.upload_of(hashlib.sha256(new).hexdigest())[0] == "mxc://hs/2"
    store.close()


def test_a_file_that_keeps_changing_while_it_is_uploaded_holds_its_question_for_a_later_try(tmp_path: Path) -> None:
    import asyncio
    import os

    from bridge.service.storage.store import Store

    shot = tmp_path / "shot.png"
    shot.write_bytes(PNG)

    class Rewriting(Transport):
        async def upload(self, data: object, mimetype: str, name: str) -> str:
            staged = tmp_path / ".shot.png.new"
            staged.write_bytes(PNG + os.urandom(10))
            os.replace(staged, shot)
            return await super().upload(data, mimetype, name)  # type: ignore[arg-type]

    store = Store(tmp_path / "s.sqlite")
    try:
        with pytest.raises(media.ChangedWhileSent) as raised:
            asyncio.run(media._upload_once(shot, store, Rewriting()))
        assert media.passing(raised.value)  # not posted for good without it: its set is tried again
    finally:
        store.close()


class FailingOnce(Transport):
    """The homeserver's upload of ``name`` fails once (a connection reset), then works."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.failing = name

    async def upload(self, data: bytes, mimetype: str, name: str) -> str:
        if name == self.failing:
            self.failing = ""
            import aiohttp
            raise aiohttp.ClientConnectionError("Connection reset by peer")
        return await super().upload(data, mimetype, name)


@pytest.mark.parametrize("failing", ["chart.png", "splash_pair.vtt"], ids=["background-file", "captions"])
def test_a_background_file_or_captions_whose_upload_failed_once_are_sent_at_the_next_try(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """A reset connection while a one-pager's file (or a video's captions)
    was uploaded: the block went out as words (the video without subtitles),
    marked sent, and never tried again."""
    monkeypatch.setattr(media, "probe", lambda _path: (None, None, None))
    set_dir = tmp_path / "qa"
    set_dir.mkdir()
    (set_dir / "chart.png").write_bytes(PNG)
    (set_dir / "splash_pair.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    (set_dir / "splash_pair.vtt").write_bytes(b"WEBVTT\n")
    q = question(kind="compare", media=[{"src": "splash_pair.mp4", "label": "Both animations"}],
                 look_for=["The first second: does the picture stay sharp?"],
                 sides={"left": "hold", "right": "ship", "randomized": True},
                 one_pager=[{"type": "image", "src": "chart.png", "caption": "Error rate"}])
    raw = {"askwright": 1, "id": "qa", "title": "QA", "questions": [q]}
    (set_dir / "questions.json").write_text(json.dumps(raw))
    qset = QuestionSet.model_validate(raw)
    store = Store(tmp_path / "bridge.sqlite")
    transport = FailingOnce(failing)
    poster = Poster(store, transport, room_for=lambda _set: ROOM, load_set=lambda _dir: (qset, []))
    for _try in range(2):
        asyncio.run(poster.sync_root(tmp_path))
    thread = [c for c, _ in thread_of(transport, "$e1")]
    assert [c["msgtype"] for c in thread if c["msgtype"] != "m.notice"] == ["m.image", "m.file", "m.video"], thread
    assert not any("could not be sent" in c.get("body", "") for c in thread)
    store.close()
