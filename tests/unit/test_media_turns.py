"""The turns to download files people send, shared out by the server a file
comes from and the person who sent it: one pool of 32 for every room let a
slow federated server, or one person, hold every turn for minutes a file
(a first byte waited for as long as the file at the slowest rate, three
tries), and every other room's files waited behind theirs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from bridge.protocol import annotate
from bridge.service.answering.mediaturns import PER_ORIGIN, PER_PEOPLES_SERVER, PER_SENDER, MediaTurns, origin_of
from bridge.service.transport.matrix import MediaBody
from bridge.service.transport.mediasession import MEDIA_CONNECTIONS

SHOT = b"\x89PNG" + bytes(range(256)) * 20


class SlowServers:
    """A content repository whose files on the ``slow`` servers never send
    their first byte (a homeserver still fetching them over federation)."""

    def __init__(self) -> None:
        self.waiting = 0  # slow downloads holding a turn now

    @contextlib.asynccontextmanager
    async def download(self, mxc: str, _stall: float, _first: float | None = None):
        if origin_of(mxc).startswith("slow"):
            self.waiting += 1
            try:
                await asyncio.Event().wait()
            finally:
                self.waiting -= 1

        async def chunks():
            yield SHOT

        yield MediaBody(len(SHOT), chunks())


def _files(senders_and_urls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    from helpers.timeline import picture

    events = []
    for n, (sender, url) in enumerate(senders_and_urls):
        event = picture(f"$f{n}", sender, 2000 + n)
        event["content"]["url"] = url
        events.append(event)
    return events


def _fast_file_beside(tmp_path: Path, monkeypatch, slow: list[tuple[str, str]]) -> tuple[float, Any, int]:
    """``slow`` files sent, then another person's file from a server that
    answers: (the seconds its batch took, what the store says of that file,
    how many slow downloads held a turn meanwhile)."""
    from bridge.service.answering.downloads import Downloads
    from helpers.timeline import Room

    # One question holds them all (an answer holds at most 20 files; in
    # life they are the files of several questions, rooms and sets).
    monkeypatch.setattr(annotate, "MAX_ATTACHMENTS", len(slow) + 1)
    room = Room(tmp_path)
    repository = SlowServers()

    async def judge_later(later: list[dict[str, Any]]) -> None:
        room.deliver(later)

    downloads = Downloads(room.store, repository.download, lambda *_: True, None, 1024 * 1024,
                          judge_later=judge_later)
    events = _files([*slow, ("@alice:hs", "mxc://fast.example/shot")])

    async def send() -> tuple[float, int]:
        try:
            room.deliver(await downloads.prefetch(events[:-1]))  # its batch goes on, its files still coming
            began = time.monotonic()
            room.deliver(await downloads.prefetch(events[-1:]))
            return time.monotonic() - began, repository.waiting
        finally:
            running = list(downloads.running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    took, waiting = asyncio.run(send())
    return took, room.store.attachment(events[-1]["event_id"]), waiting


def test_a_slow_servers_files_leave_turns_for_another_servers_file(tmp_path: Path, monkeypatch) -> None:
    """32 files from a slow server (sent by 8 people, 4 each, so no person's
    share is what holds them) take that server's share; another room's
    screenshot from a server that answers is fetched within its batch."""
    slow = [(f"@p{n % 8}:slow.example", f"mxc://slow.example/file{n}") for n in range(MEDIA_CONNECTIONS)]
    took, (saved, problem), waiting = _fast_file_beside(tmp_path, monkeypatch, slow)
    assert problem is None and saved is not None, (saved, problem)  # not "pending": saved, not waiting its turn
    assert took < 3.5
    assert (tmp_path / "kinds" / saved).read_bytes() == SHOT
    assert waiting == PER_ORIGIN  # the slow server's files still wait, no more of them than its share


def test_one_persons_files_leave_turns_for_another_persons_file(tmp_path: Path, monkeypatch) -> None:
    """One person sends 32 files, each naming another slow server (any mxc
    URL is the sender's to write): their share holds them, and another
    person's screenshot is fetched within its batch."""
    slow = [("@mallory:slow.example", f"mxc://slow{n}.example/file") for n in range(MEDIA_CONNECTIONS)]
    took, (saved, problem), waiting = _fast_file_beside(tmp_path, monkeypatch, slow)
    assert problem is None and saved is not None, (saved, problem)
    assert took < 3.5
    assert (tmp_path / "kinds" / saved).read_bytes() == SHOT
    assert waiting == PER_SENDER


def test_one_homeservers_people_leave_turns_for_another_servers_person(tmp_path: Path, monkeypatch) -> None:
    """Eight accounts on one homeserver (its operator's to make) send four
    files each, every file naming another slow server: no person's share
    nor any file server's holds them, and they took every turn; their
    homeserver's share does, and another person's screenshot is fetched
    within its batch."""
    slow = [(f"@p{n % 8}:hostile.example", f"mxc://slow{n}.example/file") for n in range(MEDIA_CONNECTIONS)]
    _took, (saved, problem), waiting = _fast_file_beside(tmp_path, monkeypatch, slow)
    assert problem is None and saved is not None, (saved, problem)
    assert (tmp_path / "kinds" / saved).read_bytes() == SHOT
    assert waiting == PER_PEOPLES_SERVER


def test_a_download_cancelled_waiting_or_just_handed_its_turn_holds_none() -> None:
    """A batch undone (``Downloads._undo``) cancels downloads still waiting
    for a turn, and one may be cancelled just as a turn was handed to it:
    neither keeps one, and the next in line gets it."""
    async def go() -> None:
        turns = MediaTurns(at_once=2, per_origin=2, per_sender=2)
        first, second = turns.of("a", "@x:a"), turns.of("b", "@y:b")
        await first.__aenter__()
        await second.__aenter__()
        waiting = asyncio.ensure_future(turns.take("c", "@z:c"))
        handed = asyncio.ensure_future(turns.take("d", "@w:d"))
        later = asyncio.ensure_future(turns.take("e", "@v:e"))
        await asyncio.sleep(0)
        waiting.cancel()  # cancelled while it waits
        await first.__aexit__(None, None, None)  # the turn goes to ``handed``...
        handed.cancel()  # ...cancelled before it runs: the turn goes on to ``later``
        await asyncio.gather(waiting, handed, return_exceptions=True)
        await asyncio.wait_for(later, 1)
        assert turns.running == 2
        turns.give("e", "@v:e")
        await second.__aexit__(None, None, None)
        assert turns.running == 0 and not turns._origins and not turns._senders and not turns._peoples_servers
        assert not turns._waiting

    asyncio.run(go())


def test_a_download_queued_behind_its_servers_share_holds_no_turn_and_keeps_its_place() -> None:
    """Waiting for its server's share, a download holds none of the turns;
    when the share has room the longest-waiting download of that server
    goes first."""
    async def go() -> None:
        turns = MediaTurns(at_once=3, per_origin=1, per_sender=3)
        await turns.take("slow", "@a:slow")
        queued = [asyncio.ensure_future(turns.take("slow", f"@{n}:slow")) for n in range(3)]
        await asyncio.sleep(0)
        await asyncio.wait_for(turns.take("fast", "@b:fast"), 1)  # the 3 queued hold no turn
        turns.give("slow", "@a:slow")
        await asyncio.sleep(0)
        assert [task.done() for task in queued] == [True, False, False]
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)

    asyncio.run(go())
