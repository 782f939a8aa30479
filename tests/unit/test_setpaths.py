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
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.answering.pipeline import Pipeline
from test_isolation_parts import BOT, ROOM, Transport, answer, setup


def rows_naming(store: Store, folder: str) -> dict[str, int]:
    counts = {table: store.db.execute(f"SELECT COUNT(*) FROM {table} WHERE set_dir = ?", (folder,)).fetchone()[0]
              for table in SET_DIR_TABLES}
    counts["meta"] = store.db.execute("SELECT COUNT(*) FROM meta WHERE key = ?",
                                      (f"set_synced:{folder}",)).fetchone()[0]
    # When each revision was first posted: the clock of its expires and escalate.
    counts["meta first posted"] = store.db.execute("SELECT COUNT(*) FROM meta WHERE substr(key, 1, ?) = ?", (
        len(f"rev_first_posted:{folder}\x1f"), f"rev_first_posted:{folder}\x1f")).fetchone()[0]
    # A file still coming, taken up again at the next start into its folder.
    counts["meta download"] = sum(json.loads(value)["set_dir"] == folder
                                  for _key, value in store.meta_with_prefix("download:"))
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
        store.set_meta(f"rev_first_posted:{old}\x1fname\x1f1", "1800000000000")
        store.set_meta("download:$f", json.dumps({"event": {"event_id": "$f"}, "set_dir": old, "qid": "name",
                                                  "number": 1}))
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
    # The new root holds a set the store knows already (the bridge started
    # there and posted it anew): two sets can't be made one.
    disk2 = tmp_path.parent / f"{tmp_path.name}-disk2"
    other = disk2 / "set0"
    posted = store.question_by_event("$q0")
    with store.transaction():
        store.record_posted(RecordedQuestion(event_id="$again", room_id=posted.room_id, set_id=posted.set_id,
                                             content={**posted.content, "elicitation_id": "elc_again"}),
                            set_dir=str(other), posted_at=2)
    with pytest.raises(MoveRefused, match="knows sets under"):
        move_sets(store, str(tmp_path), str(disk2))
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


def test_a_set_deleted_beside_an_unrelated_one_of_the_same_name_is_no_move(tmp_path: Path) -> None:
    """team/alpha deleted, an unrelated set made at alpha: nothing moved, the
    start goes on (it refused, naming team as the sets' old root)."""
    root = tmp_path / "sets"
    (root / "team").mkdir(parents=True)
    (root / "alpha").mkdir()
    assert sets_seen_elsewhere([str(root / "team" / "alpha")], root) is None


def test_the_old_root_is_the_one_most_sets_are_found_under_not_the_first_name_that_matches(tmp_path: Path) -> None:
    new_root = tmp_path / "disk2"
    for rel in ("team/alpha", "team/beta", "alpha"):  # "alpha": an unrelated set that shares a name
        (new_root / rel).mkdir(parents=True)
    old = [str(tmp_path / "sets" / "team" / "alpha"), str(tmp_path / "sets" / "team" / "beta")]
    assert sets_seen_elsewhere(old, new_root) == str(tmp_path / "sets")


def test_sets_moved_up_into_the_folder_that_held_their_root_can_be_moved(tmp_path: Path, store_backend) -> None:
    (tmp_path / "sets").mkdir()
    store, _pipeline, _transport, folders = setup(tmp_path / "sets")  # the set at <tmp>/sets/set0
    assert move_sets(store, str(tmp_path / "sets"), str(tmp_path)) == 1
    assert store.db.execute("SELECT set_dir FROM posted").fetchall() == [(str(tmp_path / "set0"),)]
    store.close()


def test_open_sets_outside_the_sets_root_are_named_at_start(tmp_path, caplog):
    # A standby configured with another sets.root than its leader: the sets
    # it would lead are not below it, and new sets under the leader's root
    # would never be posted.  Said at start, naming both.
    from bridge.service.config import parse_config
    from bridge.service.storage.setpaths import sets_outside, warn_sets_outside
    from helpers.config import GOOD

    theirs, mine = tmp_path / "shared" / "sets", tmp_path / "local" / "sets"
    (theirs / "release").mkdir(parents=True)
    mine.mkdir(parents=True)
    folders = [str(theirs / "release")]
    assert sets_outside(folders, mine) == folders
    assert sets_outside(folders, theirs) == []
    config = parse_config({**GOOD, "sets": {"root": str(mine)}}, base_dir=tmp_path, environ={})
    with caplog.at_level("WARNING"):
        warn_sets_outside(folders, config)
    said = caplog.text
    assert str(mine) in said and str(theirs / "release") in said and "same sets.root" in said
