"""What the agents' writers leave when the bridge is killed in the middle of
a write, and what the next start removes: the part of an upload, a
questions.json half replaced, a set folder half made.  Each writer is the
real one, in a process of its own that stops for good inside its write and
is then killed -9 (or, for the live case, left running)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from pathlib import Path

from bridge.agents import media_files
from bridge.agents.sets import AgentSets
from bridge.service.app import remove_strays
from helpers.agents import one_question

SET_ID = "takes"


def asked(set_id: str, title: str = "Release plan") -> dict:
    return {**one_question(set_id), "title": title}


def _hang(*_args: object) -> None:
    _ready.set()
    time.sleep(600)


_ready = None


def _writer(root: str, what: str, ready) -> None:
    """One of the agents' writes, stopped for good at its last step."""
    global _ready
    _ready = ready
    sets = AgentSets(Path(root))
    if what == "upload":  # 2 MB of a clip on disk, the rest never comes
        async def chunks():
            yield b"\0" * (2 * media_files.WRITE_BATCH)
            ready.set()
            await asyncio.sleep(600)
        asyncio.run(media_files.receive(Path(root) / SET_ID, SET_ID, "take.mp4", chunks(), 10**9))
    elif what == "questions":  # the set asked again: its new questions.json written, not yet renamed
        os.replace = _hang
        sets.ask("planner", SET_ID, asked(SET_ID, "Release plan, again"))
    elif what == "new set":  # a new set's folder made in hiding, not yet renamed into place
        os.rename = _hang
        sets.ask("planner", "fresh", asked("fresh"))


def _start(root: Path, what: str) -> multiprocessing.Process:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    writer = ctx.Process(target=_writer, args=(str(root), what, ready))
    writer.start()
    assert ready.wait(60), f"the {what} writer never got to its write"
    return writer


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_what_an_agents_write_killed_midway_left_is_removed_at_the_next_start_and_a_live_ones_kept(tmp_path):
    AgentSets(tmp_path).ask("planner", SET_ID, asked(SET_ID))
    before = _listing(tmp_path)
    writers = [_start(tmp_path, what) for what in ("upload", "questions", "new set")]
    try:
        during = _listing(tmp_path)
        assert len(during) > len(before), "the writers left nothing to remove"
        remove_strays(tmp_path)  # the writers are alive: all is kept
        assert _listing(tmp_path) == during
    finally:
        for writer in writers:
            writer.kill()  # kill -9 in the middle of each write
            writer.join()
    remove_strays(tmp_path)
    assert _listing(tmp_path) == sorted([*before, f"{SET_ID}/.answers.lock"])  # removed under the set's lock


def test_a_temp_file_of_another_machines_writer_is_removed_once_old_without_a_restart(tmp_path, monkeypatch):
    """A leader on another machine killed mid-write left its temp file; the
    new leader keeps it at its start (that writer may still be alive, its
    file under 5 minutes old) and it stayed until some instance started
    again.  It goes once old, while the bridge runs."""
    from bridge.service import app

    folder = tmp_path / "sets" / "plan"
    folder.mkdir(parents=True)
    (folder / "questions.json").write_text("{}")
    stray = folder / "answers.json.askwright-tmp.machine-a.4242"
    stray.write_text("{")
    app.remove_strays(tmp_path / "sets")
    assert stray.exists()  # young: its writer may still be at it
    long_ago = time.time() - 400
    os.utime(stray, (long_ago, long_ago))
    monkeypatch.setattr(app, "STRAY_SECONDS", 0.05)

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(app.keep_removing_strays(tmp_path / "sets", stop))
        for _ in range(100):
            if not stray.exists():
                break
            await asyncio.sleep(0.05)
        stop.set()
        await task

    asyncio.run(run())
    assert not stray.exists()


def test_only_names_of_the_bridges_own_temporary_form_are_ever_removed(tmp_path):
    """An agent's own files whose names merely hold the mark, old ones
    included, in a set or in a folder that is no set, are never touched
    (and no lock file is made beside them); the bridge's own forms are."""
    from bridge.wholefile import HOST

    set_dir, notes = tmp_path / "plan", tmp_path / "projectA" / "notes"
    set_dir.mkdir()
    (set_dir / "questions.json").write_text("{}")
    notes.mkdir(parents=True)
    agents = [set_dir / "notes.askwright-tmp.txt", set_dir / "draft.askwright-tmp.v2.md",
              set_dir / "answers.json.askwright-tmp.", set_dir / ".askwright-tmp.host.12",
              set_dir / "take.mp4.askwright-tmp.host.12.not-hex-tail", notes / "plan.askwright-tmp.md"]
    # A dead writer's, another machine's, and one of this host and pid left by
    # a run before (a restarted container is pid 1 again, its host the same).
    dead = [set_dir / f"answers.json.askwright-tmp.{HOST}.999999999",
            set_dir / "take.mp4.askwright-tmp.machine-a.4242.0123456789ab",
            set_dir / f"clip.mp4.askwright-tmp.{HOST}.{os.getpid()}.0123456789ab"]
    long_ago = time.time() - 4000
    for path in agents + dead:
        path.write_text("mine")
        os.utime(path, (long_ago, long_ago))
    remove_strays(tmp_path)
    assert [p.exists() for p in agents] == [True] * len(agents)
    assert [p.exists() for p in dead] == [False] * len(dead)
    assert not (notes / ".answers.lock").exists()
