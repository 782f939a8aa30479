"""The answer log in the store (both backends): one leaf per outcome, in the
outcome's transaction; receipts on records; checkpoints; offline verification."""

from __future__ import annotations

import asyncio
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.protocol import audit_leaf, audit_verify, checkpoint as cp, merkle
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.auditing.checkpoints import Checkpointer
from bridge.service.auditing.keys import LogKey, LogKeyError, check_present, load_or_create, read_key
from bridge.service.storage.store import LogEntry, Store

pytestmark = pytest.mark.usefixtures("store_backend")

ORIGIN = "example.org/askwright-bridge/bridge"


def _store(tmp_path) -> Store:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", ORIGIN)
        content = {"elicitation_id": "elc_q", "set": "s", "question": {"id": "branch", "rev": 1, "title": "T"},
                   "subject": {"id": "deploy-42", "digest": "sha256:ab"}}
        store.record_posted(RecordedQuestion(event_id="$q", room_id="!r", set_id="s", content=content),
                            set_dir="/sets/s", posted_at=1)
    return store


def _answer(store: Store, event_id: str, choice: str, ts: int, device=None) -> int:
    record = {"qid": "branch", "state": "answered", "choice": choice, "subject": {"id": "deploy-42",
              "digest": "sha256:ab"}, "q_rev": 1, "rev": 1, "updated": "t",
              "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": event_id,
                         "sender": "@ana:hs", "ts": ts}}
    with store.transaction():
        return store.append_log(LogEntry(event_id, "!r", "@ana:hs", "answer_event", "accepted", set_id="s",
                                         set_dir="/sets/s", qid="branch", question_event_id="$q", record=record,
                                         ts=ts, device=device))


def _doc(store: Store) -> dict:
    return {"askwright": 1, "set": "s", "rev": 1, "answers": {"branch": store.projection("/sets/s", "branch")}}


def _leaves(store: Store) -> list[bytes]:
    return [leaf.encode() for _i, leaf in store.audit.leaves(0, store.audit.size())]


def test_every_outcome_appends_one_leaf_in_its_transaction(tmp_path):
    store = _store(tmp_path)
    _answer(store, "$a1", "main", 10, device={"device_id": "ANADEV", "cross_signed": True})
    _answer(store, "$a2", "stable", 20)
    with store.transaction():
        store.append_log(LogEntry("$x", "!r", "@bob:hs", "answer_event", "refused", reason="not_allowed", ts=30))
    with pytest.raises(RuntimeError):
        with store.transaction():
            _entry = store.append_log(LogEntry("$y", "!r", "@bob:hs", "answer_event", "refused", ts=40))
            raise RuntimeError("the batch fails: its outcome and its leaf go together")
    with store.transaction():
        store.close_question("$q", "closed_by_agent")
    rows = store.audit.leaves(0, 100)
    assert [i for i, _leaf in rows] == [0, 1, 2, 3]
    leaves = [audit_leaf.parse_leaf(leaf.encode()) for _i, leaf in rows]
    assert [leaf["outcome"] for leaf in leaves] == ["accepted", "accepted", "refused", "closed"]
    first = leaves[0]
    assert first["device"] == {"device_id": "ANADEV", "cross_signed": True}
    assert first["subject"] == {"id": "deploy-42", "digest": "sha256:ab"}
    assert first["question"]["id"] == "branch" and first["question"]["event_id"] == "$q"
    assert first["question"]["content_sha256"] == audit_leaf.content_sha256(store.question_by_event("$q").content)
    assert (first["sender"], first["room_id"], first["event_id"], first["ts"]) == ("@ana:hs", "!r", "$a1", 10)
    record = store.projection("/sets/s", "branch")
    assert record["receipt"] == {"log": ORIGIN, "index": 1, "leaf": merkle.leaf_hash(rows[1][1].encode()).hex()}
    assert leaves[1]["answer_sha256"] == audit_leaf.answer_sha256(record)


def _signed(store: Store, tmp_path, key=None) -> tuple[Checkpointer, LogKey]:
    key = key or LogKey(ORIGIN, Ed25519PrivateKey.generate())
    return Checkpointer(store, key, 60), key


def test_a_set_verifies_and_each_tampering_is_named(tmp_path):
    store = _store(tmp_path)
    _answer(store, "$a1", "main", 10)
    signer, key = _signed(store, tmp_path)
    first = signer.sign_if_grown()
    assert signer.sign_if_grown() == first  # not grown: no new checkpoint
    _answer(store, "$a2", "stable", 20)
    latest = signer.sign_if_grown()
    assert latest[0] == 2 and latest != first
    notes = [note for _size, note in store.audit.checkpoints()]
    doc = _doc(store)
    verdict = audit_verify.verify_set(doc, _leaves(store), notes, ORIGIN, key.public)
    assert verdict.holds, verdict.problems
    assert (verdict.checked_records, verdict.earlier_checkpoints) == (1, 1)

    changed = {**doc, "answers": {"branch": {**doc["answers"]["branch"], "choice": "main"}}}
    problems = audit_verify.verify_set(changed, _leaves(store), notes, ORIGIN, key.public).problems
    assert problems == ["record 'branch' (leaf 1): the record's answer (choice, q_rev, qid, state, subject) differs "
                        "from what the log recorded"]

    # Who answered, where and when is what the log vouches for too: a record given to another sender is named.
    record = doc["answers"]["branch"]
    for field, value, words in (("sender", "@mallory:hs", "sender"), ("room_id", "!elsewhere", "room"),
                                ("ts", 21, "time")):
        forged = {**doc, "answers": {"branch": {**record, "source": {**record["source"], field: value}}}}
        problems = audit_verify.verify_set(forged, _leaves(store), notes, ORIGIN, key.public).problems
        assert problems == [f"record 'branch' (leaf 1): the record's {words} {value!r} differs from the leaf's "
                            f"{record['source'][field]!r}"]

    # A record taken out (the answer someone would rather nobody acted on) is named.
    removed = {**doc, "answers": {}}
    assert audit_verify.verify_set(removed, _leaves(store), notes, ORIGIN, key.public).problems == [
        "question 'branch': the log's answer that stands is leaf 1, but answers.json has no record of it"]

    past = {**doc, "answers": {"branch": {**doc["answers"]["branch"],
                                          "receipt": {"log": ORIGIN, "index": 7, "leaf": "00"}}}}
    assert audit_verify.verify_set(past, _leaves(store), notes, ORIGIN, key.public).problems == [
        "record 'branch' (leaf 7): past the 2 leaves of this export (answered after it was taken, or never logged); "
        "export again to check it"]  # one problem, not also "a later answer replaced this one"

    # A leaf changed in the store and the tree re-signed: the earlier checkpoint the room holds no longer fits.
    rewritten = _leaves(store)
    rewritten[0] = rewritten[0].replace(b'"ts":10', b'"ts":11')
    resigned = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 2, merkle.root([merkle.leaf_hash(x) for x in rewritten])),
                                  key.private)
    problems = audit_verify.verify_log(rewritten, [first[1], resigned], ORIGIN, key.public)[0].problems
    assert problems and "checkpoint of size 1 is not consistent with the latest (size 2)" in problems[0]

    # Dropped and rebuilt: the same.
    dropped = _leaves(store)[1:]
    resigned = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 1, merkle.root([merkle.leaf_hash(x) for x in dropped])),
                                  key.private)
    assert audit_verify.verify_log(dropped, [first[1], resigned], ORIGIN, key.public)[0].problems

    forged = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 2, merkle.root([merkle.leaf_hash(x) for x in _leaves(store)])),
                                Ed25519PrivateKey.generate())
    problems = audit_verify.verify_log(_leaves(store), [forged], ORIGIN, key.public)[0].problems
    assert any("not signed by the log's key" in p for p in problems)

    garbage = _leaves(store)
    garbage[1] = b"{not json"
    problems = audit_verify.verify_log(garbage, notes, ORIGIN, key.public)[0].problems
    assert problems[0].startswith("leaf 1: does not parse")


def test_answers_given_before_the_log_began_are_named_as_not_covered_not_as_tampering(tmp_path):
    # A deployment that turned the log on (an upgrade, audit.enabled off at
    # first) failed verify for good: every earlier record "carries no receipt".
    store = _store(tmp_path)
    _answer(store, "$a1", "main", 10_000)
    signer, key = _signed(store, tmp_path)
    signer.sign_if_grown()
    notes = [note for _size, note in store.audit.checkpoints()]
    doc = _doc(store)
    earlier = {"qid": "older", "state": "answered", "choice": "yes", "q_rev": 1, "rev": 1, "updated": "t",
               "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": "$old",
                          "sender": "@ana:hs", "ts": 9_000}}
    doc["answers"]["older"] = earlier
    verdict = audit_verify.verify_set(doc, _leaves(store), notes, ORIGIN, key.public)
    assert verdict.holds, verdict.problems
    assert verdict.before_the_log == ["older"] and verdict.log_began_ms == 10_000
    # One answered after the log began and carrying no receipt is still named.
    doc["answers"]["older"] = {**earlier, "source": {**earlier["source"], "ts": 11_000}}
    assert audit_verify.verify_set(doc, _leaves(store), notes, ORIGIN, key.public).problems == [
        "record 'older': written by the bridge but carries no receipt"]
    # And one of a question the log has leaves about, whatever time it claims.
    doc["answers"]["older"] = earlier
    with store.transaction():
        content = {"elicitation_id": "elc_older", "set": "s", "question": {"id": "older", "rev": 1, "title": "O"}}
        store.record_posted(RecordedQuestion(event_id="$q2", room_id="!r", set_id="s", content=content),
                            set_dir="/sets/s", posted_at=1)
        store.append_log(LogEntry("$r", "!r", "@bob:hs", "answer_event", "refused", set_id="s", set_dir="/sets/s",
                                  qid="older", question_event_id="$q2", reason="not_allowed", ts=12_000))
    signer.sign_if_grown()
    notes = [note for _size, note in store.audit.checkpoints()]
    assert audit_verify.verify_set(doc, _leaves(store), notes, ORIGIN, key.public).problems == [
        "record 'older': written by the bridge but carries no receipt"]


def test_the_checkpoint_is_put_in_every_room_the_bridge_posts_in(tmp_path):
    store = _store(tmp_path)
    _answer(store, "$a1", "main", 10)
    put: list[tuple] = []

    async def put_state(room, kind, key, content):
        if room == "!locked":
            raise PermissionError("M_FORBIDDEN")
        put.append((room, kind, key, content))

    signer, key = _signed(store, tmp_path)
    signer.put_state, signer.rooms = put_state, lambda: ["!r", "!locked", "!other"]
    asyncio.run(signer.once())
    asyncio.run(signer.once())  # not grown: nothing new to put
    assert [(r, k, s) for r, k, s, _c in put] == [("!r", "dev.superpipeline.answer_log.checkpoint", ORIGIN),
                                                   ("!other", "dev.superpipeline.answer_log.checkpoint", ORIGIN)]
    content = put[0][3]
    assert content["size"] == 1 and content["key"] == key.verifier_key
    assert cp.open_checkpoint(content["checkpoint"], key.public, ORIGIN).size == 1


def test_the_log_key_is_its_own_0600_file_and_never_remade_for_a_log_with_leaves(tmp_path):
    path = tmp_path / "log-key"
    key = load_or_create(path, ORIGIN, leaves=0)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_key(path).public == key.public
    assert load_or_create(path, ORIGIN, leaves=5).public == key.public
    path.unlink()
    with pytest.raises(LogKeyError, match="5 leaves but its key file"):
        check_present(path, 5)
    with pytest.raises(LogKeyError, match="missing"):
        load_or_create(path, ORIGIN, leaves=5)


def test_the_key_is_made_at_the_first_start_before_any_leaf(tmp_path):
    """A bridge killed before its first checkpoint still finds its key: it was made at start."""
    from bridge.service.auditing.checkpoints import open_log

    store = Store(tmp_path / "s.sqlite")
    plan = open_log(store, user_id="@bridge:example.org", store_path=tmp_path / "s.sqlite", key_file=None)
    assert (tmp_path / "s.sqlite.log-key").is_file()
    assert store.audit_origin() == "example.org/askwright-bridge/bridge"
    # Known to the store at once: a standby started now is held to it (before any checkpoint).
    assert store.get_meta("audit_key") == plan.key(store).verifier_key
    _answer(store, "$a1", "main", 10)
    again = open_log(store, user_id="@bridge:example.org", store_path=tmp_path / "s.sqlite", key_file=None)
    assert again.key(store).public == plan.key(store).public


def test_another_keys_file_is_refused_at_start_and_never_signs_on(tmp_path):
    """A wrong backup of the key file restored: the bridge took the key,
    signed on with it and overwrote the store's verifier key, and ``verify
    --room`` then called the rooms' genuine checkpoints forged."""
    from bridge.service.auditing.checkpoints import LogPlan, open_log
    from bridge.service.auditing.keys import write_key

    store_path, path = tmp_path / "s.sqlite", tmp_path / "s.sqlite.log-key"
    store = Store(store_path)
    plan = open_log(store, user_id="@bridge:example.org", store_path=store_path, key_file=None)
    _answer(store, "$a1", "main", 10)
    first = Checkpointer(store, plan, 60.0).sign_if_grown()
    signed_with = store.get_meta("audit_key")
    write_key(path, LogKey(store.audit_origin(), Ed25519PrivateKey.generate()))
    with pytest.raises(LogKeyError, match="holds another key .* than the one that signed this log's checkpoints"):
        open_log(store, user_id="@bridge:example.org", store_path=store_path, key_file=None)
    _answer(store, "$a2", "main", 11)
    late = Checkpointer(store, LogPlan(path, store.audit_origin(), may_create=False), 60.0)
    with pytest.raises(LogKeyError, match="another key"):
        late.sign_if_grown()
    assert store.get_meta("audit_key") == signed_with and store.audit.latest_checkpoint() == first


@pytest.mark.parametrize("tampering", ["a middle leaf deleted", "the last leaf deleted", "a leaf changed",
                                       "the last leaf deleted, nothing added",
                                       "a leaf changed and its checkpoint forged"])
def test_a_log_edited_in_the_store_is_never_signed_over_and_says_so_once(tmp_path, caplog, tampering):
    """A leaf deleted from the store: the restarted bridge counted 9 leaves,
    read on from index 9 and put leaf 9 in twice, then signed checkpoints
    of 12 and 13 leaves over a log of 12, which no export can match."""
    from bridge.service.auditing.checkpoints import LogDamaged

    store = _store(tmp_path)
    for n in range(10):
        _answer(store, f"$a{n}", "main", 10 + n)
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    signed = Checkpointer(store, key, 60).sign_if_grown()
    assert signed[0] == 10
    with store.transaction():
        if tampering == "a middle leaf deleted":
            store.db.execute("DELETE FROM audit_leaf WHERE idx=3")
        elif tampering.startswith("the last leaf deleted"):
            store.db.execute("DELETE FROM audit_leaf WHERE idx=9")
        else:
            store.db.execute("UPDATE audit_leaf SET hash=? WHERE idx=4", ("00" * 32,))
        if tampering.endswith("forged"):
            # The latest checkpoint made to match, signed by a key that is not the log's.
            from bridge.protocol import checkpoint as cp, merkle

            hashes = [bytes.fromhex(h) for (h,) in store.db.execute("SELECT hash FROM audit_leaf ORDER BY idx")]
            forged = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 10, merkle.root(hashes)),
                                        Ed25519PrivateKey.generate())
            store.db.execute("UPDATE audit_checkpoint SET note=? WHERE size=10", (forged,))
    for n in range(0 if tampering.endswith("nothing added") else 3):
        _answer(store, f"$b{n}", "main", 30 + n)
    restarted = Checkpointer(store, key, 60)
    with pytest.raises(LogDamaged):
        restarted.sign_if_grown()
    with caplog.at_level("ERROR"):
        stop = asyncio.Event()
        stop.set()
        for _ in range(2):
            asyncio.run(restarted.run(stop))
    assert store.audit.latest_checkpoint()[0] == signed[0]  # nothing signed over it
    said = [r.getMessage() for r in caplog.records if "not the one this bridge signed" in r.getMessage()]
    assert len(said) == 1, said


@pytest.mark.parametrize("tampering", ["checkpoints deleted, a leaf changed",
                                       "checkpoints deleted, the last leaves deleted",
                                       "an older backup restored, answers added"])
def test_a_log_whose_store_lost_its_checkpoints_is_checked_against_the_one_kept_beside_the_key(tmp_path,
                                                                                                tampering):
    """Every check at start went through the store's latest checkpoint:
    delete them all and change a leaf, and the bridge signed the new log
    (a store restored from an older backup too: a fork of what the rooms hold)."""
    from bridge.service.auditing.checkpoints import LogDamaged
    from bridge.service.auditing.witness import witness_file

    store = _store(tmp_path)
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    kept = witness_file(tmp_path / "s.sqlite.log-key")
    signer = Checkpointer(store, key, 60, witness=kept)
    for n in range(10):
        _answer(store, f"$a{n}", "main", 10 + n)
        if n in (5, 9):
            signer.sign_if_grown()  # checkpoints of 6 and of 10 leaves
    assert "\n10\n" in kept.read_text()
    with store.transaction():
        if tampering.startswith("checkpoints deleted"):
            store.db.execute("DELETE FROM audit_checkpoint")
        if tampering.endswith("a leaf changed"):
            store.db.execute("UPDATE audit_leaf SET hash=? WHERE idx=4", ("00" * 32,))
        elif tampering.endswith("leaves deleted"):
            store.db.execute("DELETE FROM audit_leaf WHERE idx >= 8")
        else:  # as the store was when it held 6 leaves and their checkpoint
            store.db.execute("DELETE FROM audit_leaf WHERE idx >= 6")
            store.db.execute("DELETE FROM audit_checkpoint WHERE size > 6")
    for n in range(5):
        _answer(store, f"$b{n}", "main", 30 + n)
    restarted = Checkpointer(store, key, 60, witness=kept)
    with pytest.raises(LogDamaged, match=str(kept)):
        restarted.sign_if_grown()
    assert store.audit.latest_checkpoint() is None or store.audit.latest_checkpoint()[0] < 10


def test_the_checkpoint_kept_beside_the_key_follows_the_latest_and_a_log_as_left_signs_on(tmp_path):
    from bridge.service.auditing.witness import witness_file

    store = _store(tmp_path)
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    kept = witness_file(tmp_path / "s.sqlite.log-key")
    signer = Checkpointer(store, key, 60, witness=kept)
    assert signer.sign_if_grown() is None and not kept.exists()
    _answer(store, "$a1", "main", 10)
    first = signer.sign_if_grown()
    assert kept.read_text() == first[1]
    _answer(store, "$a2", "main", 11)
    latest = signer.sign_if_grown()
    assert latest[0] == 2 and kept.read_text() == latest[1]
    _answer(store, "$a3", "main", 12)
    assert Checkpointer(store, key, 60, witness=kept).sign_if_grown()[0] == 3  # restarted: signs on
    assert cp.open_checkpoint(kept.read_text(), key.public, ORIGIN).size == 3


def test_a_leaf_is_canonical_json_and_a_changed_byte_is_not_a_leaf():
    leaf = audit_leaf.build_leaf(outcome="accepted", set_id="s", room_id="!r", event_id="$e", sender="@p:hs", ts=1,
                                 question={"question": {"id": "q", "rev": 1}, "n": 2 ** 60},
                                 record={"qid": "q", "state": "answered", "text": "caf\u00e9 \u2028"})
    data = audit_leaf.canonical(leaf)
    assert audit_leaf.parse_leaf(data) == leaf
    assert data.index(b'"answer_sha256"') < data.index(b'"v"')  # keys sorted, as RFC 8785 says
    for broken in (data.replace(b'"v":1', b'"v": 1'), b"{not json", data[:-1], b'{"v":2}'):
        with pytest.raises(audit_leaf.LeafError):
            audit_leaf.parse_leaf(broken)


def _outcomes(store: Store) -> list[tuple[str, str, str | None]]:
    import json
    leaves = [json.loads(leaf) for leaf in _leaves(store)]
    return [(leaf["outcome"], leaf["event_id"], leaf["replaces"]) for leaf in leaves
            if leaf["outcome"] in ("accepted", "withdrawn")]


def test_a_vote_taken_back_before_it_arrived_gets_its_withdrawal_leaf(tmp_path):
    """A poll vote that reaches the bridge after the empty vote that took it
    back (a late path: held for decryption, back-filled) is accepted and
    withdrawn at once: both are outcomes, so both are leaves, just as when
    the empty vote comes after the vote."""
    from helpers.timeline import PEOPLE, Room, vote

    (tmp_path / "late").mkdir()
    (tmp_path / "in_order").mkdir()
    late = Room(tmp_path / "late")
    late.deliver([vote("$empty", PEOPLE[0], 200, [])])        # takes back every vote before it: none yet
    late.deliver([vote("$v1", PEOPLE[0], 100, ["main"])])     # the vote it took back, arriving late
    assert late.record() is None or late.record().get("choice") is None
    assert _outcomes(late.store) == [("accepted", "$v1", None), ("withdrawn", "$empty", "$v1")]

    in_order = Room(tmp_path / "in_order")
    in_order.deliver([vote("$v1", PEOPLE[0], 100, ["main"])])
    in_order.deliver([vote("$empty", PEOPLE[0], 200, [])])
    assert [o[:2] for o in _outcomes(in_order.store)] == [("accepted", "$v1"), ("withdrawn", "$empty")]

    # In one batch, the empty vote known from the batch's look-ups and kept up to date by its own write.
    (tmp_path / "together").mkdir()
    together = Room(tmp_path / "together")
    together.deliver([vote("$warm", PEOPLE[1], 50, ["main"])])  # what later batches take (PostgreSQL)
    together.deliver([vote("$empty", PEOPLE[0], 200, []), vote("$v1", PEOPLE[0], 100, ["main"]),
                      vote("$v2", PEOPLE[0], 300, ["stable"])])
    assert together.record()["choice"] == "stable"  # $v2 came after the empty vote: it stands
    assert _outcomes(together.store)[1:] == [("accepted", "$v1", None), ("withdrawn", "$empty", "$v1"),
                                             ("accepted", "$v2", None)]

    # and the log still verifies: every leaf under a signed checkpoint
    key = Ed25519PrivateKey.generate()
    size = late.store.audit.size()
    point = cp.Checkpoint(ORIGIN, size, merkle.root(late.store.audit.hashes()))
    verdict, _hashes, _latest = audit_verify.verify_log(_leaves(late.store), [cp.sign_checkpoint(point, key)],
                                                        ORIGIN, cp.raw_public(key.public_key()))
    assert verdict.problems == []


def _verify_room(room) -> list[str]:
    return room.verify()


def tamper(room, change) -> list[str]:
    """What verify says of ``room``'s answers.json with ``change`` made to the
    record (the file put back after)."""
    path = room.set_dir / "answers.json"
    original = path.read_text()
    doc = json.loads(original)
    change(doc["answers"]["branch"])
    path.write_text(json.dumps(doc))
    try:
        return room.verify()
    finally:
        path.write_text(original)


def test_an_approvals_tally_verifies_pending_decided_and_expired_and_a_changed_vote_is_named(tmp_path):
    """An approval's record is a tally (PROTOCOL 2a): its state and pick come
    from the votes it lists.  verify checks each vote against its leaf, the
    deciders against the pick and an expiry against the log's, rather than
    the tally against the one vote its receipt names."""
    from bridge.answers.file import AnswersFile
    from bridge.service.answering.deadlines import Deadlines
    from helpers.timeline import PEOPLE, Room, answer

    t0 = 1_800_000_000_000
    approval = {"answerers": list(PEOPLE), "quorum": {"required": 2, "veto": ["stable"]}, "expires": "45s"}
    ana, bob, cy = PEOPLE

    def expire(room) -> None:
        deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                              clock=lambda: (t0 + 46_000) / 1000)
        with room.store.transaction():
            room.store.set_meta("approval:$q", "1")
        asyncio.run(deadlines.pass_once())

    for name in ("pending", "decided", "expired", "nothing"):
        (tmp_path / name).mkdir()
    pending = Room(tmp_path / "pending", approval=approval, posted_ms=t0)
    pending.deliver([answer("$a1", ana, t0 + 1000, "main")])
    assert pending.record()["state"] == "pending" and _verify_room(pending) == []

    decided = Room(tmp_path / "decided", approval=approval, posted_ms=t0)
    decided.deliver([answer("$a1", ana, t0 + 1000, "main"), answer("$b1", bob, t0 + 2000, "main")])
    assert decided.record()["state"] == "answered" and _verify_room(decided) == []

    expired = Room(tmp_path / "expired", approval=approval, posted_ms=t0)
    expired.deliver([answer("$a1", ana, t0 + 1000, "main")])
    expire(expired)
    assert expired.record()["state"] == "expired" and _verify_room(expired) == []

    nothing = Room(tmp_path / "nothing", approval={"expires": "45s"}, posted_ms=t0)
    expire(nothing)
    assert nothing.record()["state"] == "expired" and "receipt" not in nothing.record()
    assert _verify_room(nothing) == []

    # Tampered: a vote's choice, the deciders, an expiry the log never recorded.

    assert tamper(pending, lambda r: r["votes"][0].update(choice="stable")) == [
        "record 'branch' (leaf 0): the vote $a1: its choice 'stable' differs from what the log recorded"]
    # (Each also differs from the decision the log's ``decided`` leaf hashed.)
    decision = ("record 'branch' (leaf 1): the record's decision ({}) differs from what the log's latest decided "
                "leaf recorded")
    assert tamper(decided, lambda r: r.update(decided_by=[ana, cy])) == [
        f"record 'branch' (leaf 1): {cy} decided it, and the log holds no vote of theirs it lists",
        decision.format("choice, decided_by, q_rev, qid, required, state")]
    assert tamper(decided, lambda r: r.update(choice="stable")) == [
        f"record 'branch' (leaf 1): {ana} decided it but voted 'main', not 'stable'",
        f"record 'branch' (leaf 1): {bob} decided it but voted 'main', not 'stable'",
        decision.format("choice, decided_by, q_rev, qid, required, state")]
    assert tamper(decided, lambda r: r.pop("decided_by")) == [
        "record 'branch' (leaf 1): the record says decided, and names no one who decided it",
        decision.format("choice, q_rev, qid, required, state")]
    assert tamper(pending, lambda r: r.update(state="expired")) == [
        "record 'branch' (leaf 0): the record says expired, and the log records no expiry of the question"]
    assert AnswersFile(pending.set_dir).load()["answers"]["branch"]["state"] == "pending"

    # Hidden outcomes (these passed with exit 0): a decision rewritten by
    # "another writer" (no receipt, not via matrix), an expiry made an agent's
    # own record, a decision made pending, an expired record taken out.
    def other_writer(record: dict, **changes: object) -> None:
        record.pop("receipt", None)
        record["source"] = {"via": "agent"}
        record.update(changes)

    assert tamper(decided, lambda r: other_writer(r, choice="stable")) == [
        "record 'branch': no receipt, where the log's latest word on the question is its decision (leaf 2)"]
    assert tamper(expired, lambda r: other_writer(r, state="answered", choice="main")) == [
        "record 'branch': no receipt, where the log's latest word on the question is its expiry (leaf 1)"]
    assert tamper(decided, lambda r: (r.update(state="pending"), r.pop("choice"), r.pop("decided_by"),
                                      r.pop("label", None), r.pop("matched_guess", None))) == [
        "record 'branch' (leaf 1): the record says pending, and the log's latest word on the question is its "
        "decision (leaf 2)"]
    path = nothing.set_dir / "answers.json"
    original = path.read_text()
    path.write_text(json.dumps({**json.loads(original), "answers": {}}))
    assert nothing.verify() == [
        "question 'branch': the log's latest word on it is its expiry (leaf 0), but answers.json has no record of it"]
    path.write_text(original)


def test_a_decision_swapped_for_another_the_votes_in_the_log_allow_is_named(tmp_path):
    """Ana first picked stable, then changed it to main, and Bob's main
    decided it.  A record rewritten to "stable, decided by Ana, one needed"
    names only votes the log holds, yet it is not what the room decided: the
    log's ``decided`` leaf hashes the decision, and verify holds the record
    to it.  So are fewer deciders, or a lower quorum, than the decision's."""
    from helpers.timeline import PEOPLE, Room, answer, edit

    t0 = 1_800_000_000_000
    ana, bob, _cy = PEOPLE
    (tmp_path / "r").mkdir()
    room = Room(tmp_path / "r", approval={"answerers": list(PEOPLE), "quorum": {"required": 2}}, posted_ms=t0)
    room.deliver([answer("$a1", ana, t0 + 1000, "stable"), edit("$a2", ana, t0 + 2000, "$a1", "main"),
                  answer("$b1", bob, t0 + 3000, "main")])
    record = room.record()
    assert (record["state"], record["choice"], record["decided_by"]) == ("answered", "main", [ana, bob])
    assert room.verify() == []
    decided = [audit_leaf.parse_leaf(leaf.encode()) for _i, leaf in room.store.audit.leaves(0, 1000)][-1]
    assert decided["outcome"] == "decided"
    assert decided["answer_sha256"] == audit_leaf.answer_sha256(record, "decided")

    fields = "choice, decided_by, q_rev, qid, required, state"
    named = f"record 'branch' (leaf 2): the record's decision ({fields}) differs from what the log's latest " \
            "decided leaf recorded"
    assert tamper(room, lambda r: r.update(choice="stable", label="The stable branch", decided_by=[ana],
                                     required=1)) == [named]
    assert tamper(room, lambda r: r.update(decided_by=[ana])) == [named]
    assert tamper(room, lambda r: r.update(required=1)) == [named]


def test_the_mcp_verify_tool_reads_which_questions_need_a_quorum_as_the_command_does(tmp_path):
    """A pending approval's record rewritten as one person's plain answer
    (its votes and quorum dropped, the vote's receipt kept): the command
    named it, reading questions.json; the MCP tool read only answers.json
    and said it holds."""
    from bridge.agents.log_verify import verify_tool
    from bridge.agents.owner import OWNER_FILE, Owner, owner_bytes
    from bridge.agents.sets import AgentSets
    from helpers.timeline import PEOPLE, Room, all_kinds_set, answer

    t0 = 1_800_000_000_000
    approval = {"answerers": list(PEOPLE), "quorum": {"required": 2}}
    room = Room(tmp_path, approval=approval, posted_ms=t0)
    room.deliver([answer("$a1", PEOPLE[0], t0 + 1000, "main")])
    assert room.record()["state"] == "pending"
    asked = all_kinds_set("kinds")
    next(q for q in asked["questions"] if q["id"] == "branch").update(approval)
    (room.set_dir / "questions.json").write_text(json.dumps(asked))
    (room.set_dir / OWNER_FILE).write_bytes(owner_bytes(Owner("a")))
    key = Ed25519PrivateKey.generate()
    origin = room.store.audit_origin() or ORIGIN
    with room.store.transaction():
        room.store.set_meta("audit_key", cp.verifier_key(origin, cp.raw_public(key.public_key())))
    point = cp.Checkpoint(origin, room.store.audit.size(), merkle.root(room.store.audit.hashes()))

    def verified() -> list[str]:
        found = asyncio.run(verify_tool(AgentSets(tmp_path), lambda: room.store, "a", "kinds",
                                        [cp.sign_checkpoint(point, key)]))
        assert found["holds"] == (not found["problems"])
        return found["problems"]

    assert verified() == []

    def plain(record: dict) -> None:
        record.update(state="answered", choice=record["votes"][0]["choice"])
        for field in ("votes", "required"):
            record.pop(field, None)

    path = room.set_dir / "answers.json"
    doc = json.loads(path.read_text())
    plain(doc["answers"]["branch"])
    path.write_text(json.dumps(doc))
    named = "the record says decided, and names no one who decided it"
    assert any(named in problem for problem in verified())
    assert any(named in problem for problem in room.verify())  # as the command says


def test_a_decision_undone_by_an_earlier_event_read_after_the_deadline_logs_the_expiry(tmp_path):
    """Decided as far as the room was read, the deadline passes, then an
    earlier redaction is read (late) that undoes the decision: the record is
    expired, so the log records the expiry, and verify accepts it.  The
    reverse, an expired question decided by an earlier vote read late, logs
    the decision.  Either way the room, told the other outcome at the close,
    is told the outcome now."""
    from bridge.service.answering.deadlines import Deadlines
    from helpers.timeline import PEOPLE, Room, answer, redact

    t0 = 1_800_000_000_000
    approval = {"answerers": list(PEOPLE), "quorum": {"required": 2, "veto": ["stable"]}, "expires": "45s"}
    ana, bob, cy = PEOPLE

    def pass_at(room, ms: int, track: bool = True) -> None:
        if track:  # what posting does (the bridge's own tracking after that is under test)
            with room.store.transaction():
                room.store.set_meta("approval:$q", "1")
        asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                              clock=lambda: ms / 1000).pass_once())

    def outcomes(room) -> list[str]:
        return [audit_leaf.parse_leaf(leaf.encode())["outcome"] for _i, leaf in room.store.audit.leaves(0, 1000)]

    (tmp_path / "undone").mkdir()
    undone = Room(tmp_path / "undone", approval=approval, posted_ms=t0)
    undone.deliver([answer("$a1", ana, t0 + 1000, "main"), answer("$b1", bob, t0 + 3000, "main")])
    pass_at(undone, t0 + 4000)  # decided, and closed so
    pass_at(undone, t0 + 46_000)  # its deadline passes
    assert undone.record()["state"] == "answered" and _verify_room(undone) == []
    undone.deliver([redact("$r1", ana, t0 + 2000, "$a1")])  # Ana took hers back before Bob voted: read late
    pass_at(undone, t0 + 47_000, track=False)
    assert undone.record()["state"] == "expired" and "choice" not in undone.record()
    assert outcomes(undone)[-2:] == ["withdrawn", "expired"]
    assert _verify_room(undone) == []
    # The room, told "decided" before, is told what it is now.
    told = [c.get("body", "") for c in undone.pipeline.transport.sent]
    assert any(b.startswith("This question expired undecided") for b in told[-3:]), told[-3:]

    (tmp_path / "decided_late").mkdir()
    late = Room(tmp_path / "decided_late", approval=approval, posted_ms=t0)
    late.deliver([answer("$a1", ana, t0 + 1000, "main")])
    pass_at(late, t0 + 46_000)  # expired undecided, as far as the room was read
    assert late.record()["state"] == "expired" and _verify_room(late) == []
    late.deliver([answer("$c1", cy, t0 + 44_000, "main")])  # sent before the deadline, read after it
    pass_at(late, t0 + 47_000, track=False)
    assert late.record()["state"] == "answered" and late.record()["decided_by"] == [ana, cy]
    assert outcomes(late)[-2:] == ["accepted", "decided"]
    assert _verify_room(late) == []
    told = [c.get("body", "") for c in late.pipeline.transport.sent]
    assert any(b.startswith("Decided: ") for b in told[-3:]), told[-3:]


def test_a_checkpoint_missed_because_another_instance_leads_now_is_no_error(tmp_path, caplog):
    """At every step-down the checkpoint task logged a LeaseLost traceback at
    ERROR, twice: alerting on errors fired at each ordinary failover."""
    import logging

    from bridge.service.storage.dialect import LeaseLost

    store = Store(tmp_path / "s.sqlite")
    checkpointer = Checkpointer(store, LogKey("example.org/askwright-bridge/bridge", Ed25519PrivateKey.generate()), 60)

    async def lost() -> None:
        raise LeaseLost("another instance leads now")

    checkpointer.once = lost  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        asyncio.run(checkpointer._once_said())
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "no longer leads" in caplog.records[0].getMessage()
    store.close()


def test_a_checkpoint_missed_because_the_store_is_down_is_one_line_not_an_error(tmp_path, caplog):
    """A database restart made the checkpoint task log fifty lines at ERROR,
    where every other part says the same outage in one WARNING line."""
    import logging
    import sqlite3

    store = Store(tmp_path / "s.sqlite")
    checkpointer = Checkpointer(store, LogKey("example.org/askwright-bridge/bridge", Ed25519PrivateKey.generate()), 60)

    async def down() -> None:
        raise sqlite3.OperationalError("PostgreSQL: connection refused\n\tIs the server running?")

    checkpointer.once = down  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        asyncio.run(checkpointer._once_said())
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert "(the store: PostgreSQL: connection refused Is the server running?)" in caplog.records[0].getMessage()
    store.close()
