"""``store move-sets``: the store's paths moved with the sets folder, on
both backends; and the check a start makes before it would post every set
again (``setpaths.sets_seen_elsewhere``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bridge.service.storage.setpaths import SET_DIR_TABLES, MoveRefused, move_sets, sets_seen_elsewhere
from bridge.service.storage.store import Store
from bridge.service.answering.pipeline import Pipeline
from test_isolation_parts import BOT, ROOM, Transport, answer, setup


def rows_naming(store: Store, folder: str) -> dict[str, int]:
    counts = {table: store.db.execute(f"SELECT COUNT(*) FROM {table} WHERE set_dir = ?", (folder,)).fetchone()[0]
              for table in SET_DIR_TABLES}
    counts["meta"] = store.db.execute("SELECT COUNT(*) FROM meta WHERE key = ?",
                                      (f"set_synced:{folder}",)).fetchone()[0]
    return counts


def test_every_row_naming_a_moved_set_names_its_new_place(tmp_path: Path, store_backend) -> None:
    store, pipeline, _transport, folders = setup(tmp_path)
    old = str(folders[ROOM])
    sibling = f"{tmp_path}-sibling/set0"
    pipeline.process([answer(0, "$a1", "first")])
    with store.transaction():  # the rows a held set, a doomed file, a dirty question and the poster's mark leave
        store.db.execute("INSERT INTO held_set(set_dir, set_id, reason, since, attempts, next_try)"
                         " VALUES (?, 'kinds0', 'disk full', 1, 1, 2)", (old,))
        store.db.execute("INSERT INTO doomed_file(set_dir, path) VALUES (?, 'attachments/x.png')", (old,))
        store.db.execute("INSERT INTO dirty(set_dir, set_id, qid) VALUES (?, 'kinds0', 'name')", (old,))
        store.db.execute("INSERT INTO attachment(event_id, set_dir, qid, path) VALUES ('$f', ?, 'name', 'a.png')",
                         (old,))
        store.set_meta(f"set_synced:{old}", "fingerprint")
        # A set under a folder whose name only starts like the old root's is not moved with it.
        store.db.execute("INSERT INTO held_set(set_dir, set_id, reason, since, attempts, next_try)"
                         " VALUES (?, 'other', 'x', 1, 1, 2)", (sibling,))
    before = rows_naming(store, old)
    assert all(before.values()), before

    new_root = tmp_path / "disk2"
    assert move_sets(store, str(tmp_path), str(new_root)) == 1
    moved = str(new_root / Path(old).name)
    assert rows_naming(store, old) == dict.fromkeys(before, 0)
    assert rows_naming(store, moved) == before
    assert store.db.execute("SELECT COUNT(*) FROM held_set WHERE set_dir = ?", (sibling,)).fetchone()[0] == 1
    store.close()
    # The moved set goes on where it was (the bridge started again on the
    # moved store): its posting found at the new path takes the next answer.
    new_root.mkdir()
    folders[ROOM].rename(moved)
    store = Store(tmp_path / "bridge.sqlite")
    store.db.execute("DELETE FROM held_set")
    pipeline = Pipeline(store=store, transport=Transport(), answerers=None, own_users=lambda u: u == BOT)
    asyncio.run(pipeline.load_members(ROOM))
    pipeline.process([answer(0, "$a2", "second")])
    record = json.loads((Path(moved) / "answers.json").read_text())["answers"]["name"]
    assert record["text"] == "second" and record["rev"] == 2
    store.close()


def test_nothing_to_move_or_a_root_posted_anew_is_refused(tmp_path: Path, store_backend) -> None:
    store, _pipeline, _transport, folders = setup(tmp_path)
    with pytest.raises(MoveRefused, match="knows no set under"):
        move_sets(store, str(tmp_path / "elsewhere"), str(tmp_path / "disk2"))
    with pytest.raises(MoveRefused, match="already"):
        move_sets(store, str(tmp_path), str(tmp_path))  # old and new the same
    with pytest.raises(MoveRefused, match="knows sets under"):
        move_sets(store, str(tmp_path), str(folders[ROOM]))  # the new root already holds a set the store knows
    store.close()


def test_a_start_sees_the_sets_moved_only_when_none_is_where_the_store_says(tmp_path: Path) -> None:
    new_root = tmp_path / "new"
    (new_root / "team" / "alpha").mkdir(parents=True)
    old = [str(tmp_path / "old" / "team" / "alpha"), str(tmp_path / "old" / "beta")]  # beta removed meanwhile
    assert sets_seen_elsewhere(old, new_root) == str(tmp_path / "old")
    (tmp_path / "old" / "beta").mkdir(parents=True)
    assert sets_seen_elsewhere(old, new_root) is None  # one is still where the store says: not moved
    assert sets_seen_elsewhere([str(tmp_path / "gone" / "x")], new_root) is None  # not under the new root either
    assert sets_seen_elsewhere([], new_root) is None
