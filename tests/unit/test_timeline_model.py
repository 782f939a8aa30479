"""Model-based: whatever people do and however the events reach the bridge,
answers.json says what the room's timeline says.

Several people answer (answer events, poll votes and vote changes, keycap
reactions), edit (now and then an edit of an edit, which counts for
nothing), take votes back, redact their own events and others', and add
notes and files; a moderator may redact anyone's.  Each event
reaches the bridge by one of the paths it has (live, held for decryption
then released, back-filled or found by the safety net later), in any order,
and the bridge is restarted at random.  After every step the record equals
a reference computed from the set of events delivered so far alone, in the
room's order (``origin_server_ts``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import bridge.answers.file as answers_file
from helpers.timeline import MODERATOR, PEOPLE, Room, answer, edit, note, picture, reaction, redact, saved_file, vote

OPTIONS = ("main", "stable")
WORDS = ("aside alpha", "aside bravo", "aside charlie")
SENDERS = (*PEOPLE, MODERATOR)


def reference(events: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What a client shows, from the events delivered (their order does not matter)."""
    def sender(event_id: str) -> str | None:
        return events[event_id]["sender"] if event_id in events else None

    redacted = {e["target"] for e in events.values() if e["kind"] == "redact" and e["target"] in events
                and (e["sender"] == sender(e["target"]) or e["sender"] == MODERATOR)}
    # An empty vote takes back the person's votes before it in the room.
    cleared = {v["id"] for v in events.values() if v["kind"] == "vote" and v["option"] is not None
               for c in events.values() if c["kind"] == "vote" and c["option"] is None
               and c["sender"] == v["sender"] and c["ts"] >= v["ts"]}
    versions: dict[str, list[dict[str, Any]]] = {}
    for e in events.values():
        if e["kind"] in ("answer", "reaction") or (e["kind"] == "vote" and e["option"] is not None):
            if e["id"] not in redacted and e["id"] not in cleared:
                versions.setdefault(e["id"], []).append(e)
    for e in events.values():
        # Only an edit of the original counts: clients ignore an edit of an
        # edit (the spec's rule), and one whose original is late waits for it.
        if e["kind"] == "edit" and e["id"] not in redacted and e["via"] in versions \
                and e["sender"] == sender(e["via"]):
            versions[e["via"]].append(e)
    standing = [max(group, key=lambda v: v["ts"]) for group in versions.values()]
    pick = max(standing, key=lambda v: v["ts"]) if standing else None
    added = sorted((e for e in events.values() if e["kind"] in ("note", "file") and e["id"] not in redacted),
                   key=lambda e: e["ts"])
    if pick is None and not added:
        return None
    out: dict[str, Any] = {"choice": pick["option"] if pick else None, "event_id": pick["id"] if pick else None}
    # A note by anyone but the record's sender (the pick's; with no pick, the
    # last addition's) says whose it is.
    notes = [n for n in added if n["kind"] == "note"]
    owner = pick["sender"] if pick else added[-1]["sender"]
    out["note"] = "\n\n".join(n["text"] if n["sender"] == owner else f"{n['sender']}: {n['text']}"
                                for n in notes) or None
    out["attachments"] = [f["path"] for f in added if f["kind"] == "file"] or None
    return out


def seen(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {"choice": record.get("choice"), "event_id": record["source"]["event_id"] if "choice" in record else None,
            "note": record.get("note"), "attachments": record.get("attachments")}


class Timeline(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Memory-backed when the system has it: the store syncs every batch.
        shm = Path("/dev/shm")
        self.dir = Path(tempfile.mkdtemp(prefix="timeline-", dir=shm if shm.is_dir() else None))
        self.room = Room(self.dir)
        self.ts = 1000
        self.sent: list[dict[str, Any]] = []       # the room's timeline, in order
        self.waiting: list[dict[str, Any]] = []    # not delivered yet (late paths)
        self.held: list[dict[str, Any]] = []       # kept undecrypted by the bridge
        self.delivered: dict[str, dict[str, Any]] = {}

    def teardown(self) -> None:
        self.room.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _new(self, kind: str, who: str, path: str, **fields: Any) -> None:
        self.ts += 1
        meta = {"id": f"$ev{len(self.sent)}", "kind": kind, "sender": who, "ts": self.ts, **fields}
        if kind == "file":
            meta["path"] = saved_file(self.room, meta["id"])  # fetched before its batch is judged
        builder = {"answer": lambda: answer(meta["id"], who, self.ts, fields["option"]),
                   "vote": lambda: vote(meta["id"], who, self.ts, [fields["option"]] if fields["option"] else []),
                   "reaction": lambda: reaction(meta["id"], who, self.ts, fields["number"]),
                   "edit": lambda: edit(meta["id"], who, self.ts, fields["via"], fields["option"]),
                   "note": lambda: note(meta["id"], who, self.ts, fields["text"]),
                   "file": lambda: picture(meta["id"], who, self.ts),
                   "redact": lambda: redact(meta["id"], who, self.ts, fields["target"])}[kind]
        meta["event"] = builder()
        self.sent.append(meta)
        if path == "live":
            self._deliver([meta])
        elif path == "held":
            self.room.hold(meta["event"])
            self.held.append(meta)
        else:
            self.waiting.append(meta)

    def _deliver(self, metas: list[dict[str, Any]]) -> None:
        self.room.deliver([m["event"] for m in metas])
        for m in metas:
            self.delivered[m["id"]] = m

    paths = st.sampled_from(("live", "live", "held", "late"))

    @rule(who=st.sampled_from(PEOPLE), option=st.sampled_from(OPTIONS), path=paths)
    def send_answer(self, who: str, option: str, path: str) -> None:
        self._new("answer", who, path, option=option)

    @rule(who=st.sampled_from(PEOPLE), option=st.sampled_from((*OPTIONS, None)), path=paths)
    def send_vote(self, who: str, option: str | None, path: str) -> None:
        self._new("vote", who, path, option=option)  # None: the vote taken back

    @rule(who=st.sampled_from(PEOPLE), number=st.sampled_from((1, 2)), path=paths)
    def send_reaction(self, who: str, number: int, path: str) -> None:
        option = self.room.posted.options[number - 1]["id"]
        self._new("reaction", who, path, number=number, option=option)

    # An answer holds at most 20 files; the bridge refuses more (another test's business).
    @precondition(lambda self: sum(m["kind"] == "file" for m in self.sent) < 12)
    @rule(who=st.sampled_from(PEOPLE), path=paths)
    def send_file(self, who: str, path: str) -> None:
        self._new("file", who, path)

    @precondition(lambda self: any(m["kind"] in ("answer", "edit") for m in self.sent))
    @rule(data=st.data(), who=st.sampled_from(PEOPLE), option=st.sampled_from(OPTIONS), path=paths)
    def send_edit(self, data: st.DataObject, who: str, option: str, path: str) -> None:
        target = data.draw(st.sampled_from([m for m in self.sent if m["kind"] in ("answer", "edit")]))
        # Editing an edited message again: clients send the new edit against
        # the original; now and then one is sent against the edit itself,
        # which clients ignore (the spec's rule).
        original = target["target"] if target["kind"] == "edit" else target["id"]
        via = target["id"] if target["kind"] == "edit" and data.draw(st.integers(0, 3)) == 0 else original
        if data.draw(st.booleans()):
            who = target["sender"]  # mostly people edit their own
        self._new("edit", who, path, option=option, via=via, target=original)

    @rule(who=st.sampled_from(PEOPLE), text=st.sampled_from(WORDS), path=paths)
    def send_note(self, who: str, text: str, path: str) -> None:
        self._new("note", who, path, text=text)

    @precondition(lambda self: any(m["kind"] != "redact" for m in self.sent))
    @rule(data=st.data(), who=st.sampled_from(SENDERS), own=st.booleans(), path=paths)
    def send_redaction(self, data: st.DataObject, who: str, own: bool, path: str) -> None:
        target = data.draw(st.sampled_from([m for m in self.sent if m["kind"] != "redact"]))
        self._new("redact", target["sender"] if own else who, path, target=target["id"])

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def deliver_late(self, data: st.DataObject) -> None:
        picked = data.draw(st.lists(st.sampled_from(self.waiting), min_size=1, max_size=3, unique_by=lambda m: m["id"]))
        for m in picked:
            self.waiting.remove(m)
        self._deliver(picked)

    @precondition(lambda self: self.held)
    @rule()
    def keys_arrive(self) -> None:
        held, self.held = self.held, []
        self.room.release([m["event"] for m in held])
        for m in held:
            self.delivered[m["id"]] = m

    @rule()
    def restart(self) -> None:
        self.room.crash()

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def killed_while_writing(self, data: st.DataObject) -> None:
        """The bridge dies after committing a batch to its store and before
        answers.json is written; the batch was not acknowledged, so it comes
        again after the restart."""
        batch = [data.draw(st.sampled_from(self.waiting))]
        self.waiting.remove(batch[0])

        def killed(_path: Path, _data: bytes) -> None:
            raise OSError(5, "killed")

        real = answers_file.replace_whole
        answers_file.replace_whole = killed
        try:
            self._deliver(batch)
        except OSError:
            pass
        finally:
            answers_file.replace_whole = real
        self.room.crash()
        self._deliver(batch)

    @invariant()
    def record_is_the_timeline(self) -> None:
        # Held events the bridge has not judged yet are not delivered; a
        # redaction of one still counts once it is released (it drops it).
        assert seen(self.room.record()) == reference(self.delivered)

    @invariant()
    def verify_accepts_the_record(self) -> None:
        # The answer that stands in answers.json is the one the log says stands.
        assert self.room.verify() == []


Timeline.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
TestTimeline = Timeline.TestCase
