"""Model-based (issue 29): the store on SQLite and the store on PostgreSQL,
driven through the same operations the bridge makes, in its transactions
and savepoints, with restarts, say the same thing: after every operation
its result, the rows it changed and every view the bridge reads agree.

The two stores are each other's model: nothing is predicted, so whatever
the operations do (clashes, upserts, ties in the room's order, unicode and
the \\x1f separator in ids, ms times past 2**31, a transaction or a savepoint
rolled back, a vacuum moving PostgreSQL's rows) is compared.  PostgreSQL's
database sorts text by a language's rules, as most do.  The few things
that legitimately differ are normalised where they are read, each said why
at that place.

Its size is set by time: every view PostgreSQL answers is a round trip,
about a hundred of them after each step, so a run is 15 examples of 25
steps (each run draws new ones)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from bridge.agents import outbox
from bridge.agents.owner import OWNER_FILE
from bridge.agents.outbox import OutboxHook
from bridge.protocol.approval_record import outcome_of
from bridge.protocol.deadline import format_rfc3339
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.config import Agent
from bridge.service.storage.heldback import held_back
from bridge.service.storage.store import COALESCED, DROPPED, SENT, LogEntry, PostingConflict, Store, votes_key
from helpers.pgstore import linguistic_schema

T0 = 1_790_000_000_000  # ms: past 2**31, as every time the bridge keeps
MAX_SAFE = 2**53 - 1  # the largest origin_server_ts the bridge keeps (fit.timestamp)

# Small pools, so operations meet: clashes, upserts, edits of edits, ties.
# Ids differ in case, in scripts and by the \x1f separator the store uses in keys.
QUESTIONS = ("$q", "$Q\x1f", "$qǅ")
ANSWERS = ("$a", "$B", "$😀", "$ä")
REDACTIONS = ("$r", "$R\x1f")
NOTICES = ("$n", "$N")
POLLS = ("$p", "$P")  # a posting's polls are these followed by its own id (see ``poll_of``)
ELICITATIONS = ("elc_1", "elc_É", "elc_1\x1f")
ROOMS = ("!r:hs", "!Ř:hs")
SENDERS = ("@ana:hs", "@Bo:hs", "@çy:hs")
ADMIN = "@op:hs"  # may redact anyone's event
# Who sent each event: an event has one sender, whatever path it comes by.
SENDER_OF = {"$a": SENDERS[0], "$B": SENDERS[1], "$😀": SENDERS[2], "$ä": SENDERS[0],
             "$r": ADMIN, "$R\x1f": SENDERS[1]}
SET_IDS = ("s", "S\x1fß")
QIDS = ("q", "Q")
# Under the run's folder; the second is never created (a set removed whole).
# "P" comes before "o" in bytes, after it in English.
FOLDERS = ("one", "Pönë\x1f")
META_KEYS = ("sync_token", "approval:$q", "approval_logged:$q", "expired:$q", "ключ", "k\x1fx", "K", "k")
PREFIXES = ("", "approval:", "кл")
UPLOADS = ("aa", "AA")  # media by their sha256
URLS = ("https://a.example/hook", "https://b.example/Ü")
LANES = tuple(("agent-a", url) for url in URLS)  # the deliverer's lanes: an agent's URL
AGENTS = {"agent-a": Agent(token="token-of-agent-a-0123", webhook_url=URLS[0])}
OWNERS = {"one": {"agent": "agent-a", "callbacks": [URLS[1]]}}

# No NUL: PostgreSQL keeps no NUL in text (SQLite does), so no id or word of the bridge may carry one.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00") | st.sampled_from("\x1fßǅ😀\u200b'%?"),
               max_size=6)
TIMES = st.sampled_from((0, T0, T0 + 1, T0 + 1000, T0 + 2000, MAX_SAFE))
CHOICES = ("main", "stable", "unsure")


def poll_of(poll: str | None, question: str) -> str | None:
    """A poll's event id: the homeserver gives every poll its own, so no two
    postings share one (a poll read for two would be either, on both backends)."""
    return None if poll is None else poll + question


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What a call gave: its value, or the kind of error it raised.  Errors
    are compared by the ``sqlite3`` class the store raises on both backends
    (the callers catch those); their text is each engine's own, except a
    PostingConflict, whose message the store writes."""
    try:
        return "ok", call()
    except PostingConflict as exc:
        return "PostingConflict", str(exc)
    except sqlite3.Error as exc:
        kind = next(k for k in (sqlite3.IntegrityError, sqlite3.OperationalError, sqlite3.DatabaseError, sqlite3.Error)
                    if isinstance(exc, k))
        return kind.__name__, None
    except Exception as exc:  # noqa: BLE001 - compared: the same Python error on both is fine
        return type(exc).__name__, str(exc)


class Clock:
    """The one clock of both stores: each backend has its own by design (dbclock),
    and the times the store writes from it (a close's leaf) must be the same."""

    def __init__(self) -> None:
        self.ms = T0 + 500

    def now_ms(self) -> int:
        return self.ms

    def seconds(self) -> float:
        return self.ms / 1000


class Side:
    """One store, opened again after a restart, with the hook the pipeline writes webhooks through."""

    def __init__(self, open_store: Callable[[], Store], clock: Clock):
        self.open_store = open_store
        self.clock = clock
        self.open()

    def open(self) -> None:
        self.store = self.open_store()
        self.store.clock = self.clock
        self.hook = OutboxHook(self.store, AGENTS, clock=self.clock.seconds)

    def numbering(self, table: str, column: str) -> dict[int, int]:
        """Row id -> its place among the table's rows.  PostgreSQL's sequences
        are not transactional (a rolled-back insert, or one ON CONFLICT DO
        NOTHING skips, uses a number up), SQLite's AUTOINCREMENT is: the
        numbers differ, their order does not."""
        ids = [row[0] for row in self.store.db.execute(f"SELECT {column} FROM {table} ORDER BY {column}").fetchall()]
        return {value: place for place, value in enumerate(ids)}

    def seqs(self) -> list[int]:
        return [row[0] for row in self.store.db.execute("SELECT seq FROM answer_log ORDER BY seq").fetchall()]


def canon(numbers: dict[int, int], value: Any) -> Any:
    return None if value is None else numbers.get(value, ("not a row", value))


def delivery(numbers: dict[int, int], found: outbox.Delivery) -> tuple:
    return canon(numbers, found.id), found.key, found.agent, found.url, found.body, found.created_at, found.attempts


class DialectsAgree(RuleBasedStateMachine):
    url: str = ""  # the PostgreSQL schema of the run (set by the test) ...
    password: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="dialects-"))
        for name, owner in OWNERS.items():
            (self.folder / name).mkdir()
            (self.folder / name / OWNER_FILE).write_text(json.dumps(owner))
        self.clock = Clock()
        url, password = self.url, self.password
        self.sides = (Side(lambda: Store(self.folder / "bridge.sqlite"), self.clock),
                      Side(lambda: Store("unused", url=url, password=password), self.clock))
        # ... emptied for each example (a new schema, and its migrations, cost
        # twice as much), by TRUNCATE: rows deleted would leave the table's
        # layout, and so the order of ties, to the examples before.
        self.sides[1].store.db.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")
        self.posted: set[tuple[str, str]] = set()  # (folder, qid) ever posted, for the views
        self.used: set[str] = set()  # the ids the operations named, for the views
        self.checked: tuple[Any, ...] | None = None  # what the views were last compared at (see the invariant)
        self.diverged = False

    def teardown(self) -> None:
        try:
            if not self.diverged:  # (else the step that found it is the one to tell)
                self.compare(full=True)  # what the last steps left, the lookups included
        finally:
            for side in self.sides:
                side.store.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def dir(self, name: str) -> str:
        return str(self.folder / name)

    # -- running one operation on both -------------------------------------

    def both(self, what: str, op: Callable[[Side], Any], *ids: str | None) -> None:
        """``op`` on each store: what it returned (or raised) and how many rows it changed must agree."""
        self.used.update(i for i in ids if i is not None)
        seen = []
        for side in self.sides:
            before = side.store.changes()
            result = outcome(lambda: op(side))
            seen.append((result, side.store.changes() - before))
        self.agree(what, *seen)

    # -- postings ----------------------------------------------------------

    @rule(event=st.sampled_from(QUESTIONS), elicitation=st.sampled_from(ELICITATIONS), folder=st.sampled_from(FOLDERS),
          qid=st.sampled_from(QIDS), set_id=st.sampled_from(SET_IDS), room=st.sampled_from(ROOMS),
          rev=st.integers(1, 3), title=TEXT, approval=st.sampled_from((None, "quorum", "deadline")), at=TIMES,
          poll=st.none() | st.sampled_from(POLLS))
    def post(self, event, elicitation, folder, qid, set_id, room, rev, title, approval, at, poll):
        """As the poster does: record the posting and close the open ones it replaces, in one transaction."""
        question: dict[str, Any] = {"id": qid, "rev": rev, "title": title, "kind": "choice",
                                    "options": [{"id": c, "label": c.title()} for c in CHOICES]}
        if approval is not None:
            question["expires"] = format_rfc3339(T0 + 1500)
        if approval == "quorum":
            question.update(answerers=list(SENDERS), quorum={"required": 2, "veto": ["stable"]})
        posting = RecordedQuestion(event, room, set_id, {"elicitation_id": elicitation, "question": question})
        set_dir = self.dir(folder)
        self.posted.add((set_dir, qid))
        why = f"replaced by revision {rev}"

        def op(side: Side) -> Any:
            store = side.store
            replaced = [old for old in store.postings(set_dir, qid) if old.open]
            with store.transaction():
                store.record_posted(posting, set_dir=set_dir, posted_at=at, poll_event_id=poll_of(poll, event))
                for old in replaced:
                    store.close_question(old.event_id, why)
                    store.set_meta("untold:" + old.event_id, why)
                    side.hook.closed(old, why)
            side.hook.posted(posting)
            return [old.event_id for old in replaced]

        self.both("post", op, event, poll_of(poll, event), elicitation)

    @rule(event=st.sampled_from(QUESTIONS), why=st.sampled_from((None, "decided", "expired", "withdrawn by its agent")),
          by=st.sampled_from(("", ADMIN)))
    def close(self, event, why, by):
        """A close (by the bridge, an operator, a decision or the deadline), its webhook in the same transaction."""

        def op(side: Side) -> Any:
            store = side.store
            with store.transaction():
                posting = store.question_by_event(event)
                if why == "expired":
                    store.mark_expired(event, side.clock.now_ms())
                store.close_question(event, why, by=by, outcome=why if why in ("decided", "expired") else None)
                if posting is not None and why in ("decided", "expired"):
                    getattr(side.hook, why)(posting, store.projection(store.set_dir_of(event), posting.qid))
                elif posting is not None:
                    side.hook.closed(posting, why or "closed")
            return posting

        self.both("close", op, event)

    @rule(event=st.sampled_from(QUESTIONS), poll=st.sampled_from(POLLS))
    def set_poll(self, event, poll):
        poll = poll_of(poll, event)
        self.both("set_poll", lambda side: side.store.set_poll(event, poll), event, poll)

    # -- the answer log ----------------------------------------------------

    @rule(answer=st.sampled_from(ANSWERS), question=st.sampled_from(QUESTIONS),
          room=st.sampled_from(ROOMS), via=st.sampled_from(("answer_event", "reply", "poll")),
          choice=st.sampled_from(CHOICES), note=st.none() | TEXT, ts=TIMES,
          edit_of=st.none() | st.sampled_from(ANSWERS), thread=st.none() | st.sampled_from(QUESTIONS),
          annotation=st.booleans(), file=st.none() | TEXT)
    def answer(self, answer, question, room, via, choice, note, ts, edit_of, thread, annotation, file):
        """A pick or a note (or an edit of one) judged as the pipeline does, in its batch's transaction and
        the event's savepoint: logged (accepted, annotated or refused), its webhook queued, the edit's
        versions shadowed, a late poll vote already taken back withdrawn, the edits waiting for it unparked."""
        sender = SENDER_OF[answer]

        def op(side: Side) -> Any:
            store = side.store
            with store.transaction(), store.savepoint():
                replaces = None
                if edit_of is not None:
                    original = store.original_of(edit_of)
                    store.link_edit(answer, original)
                    author = store.logged_sender(original)
                    if author is None:
                        event = {"event_id": answer, "room_id": room, "sender": sender, "origin_server_ts": ts,
                                 "content": {"choice": choice, "note": note}}
                        store.park_edit(event, original, side.clock.now_ms())
                        store.mark_processed(answer, "parked")
                        return "parked", original
                    if author != sender:
                        store.mark_processed(answer, "ignored")
                        return "ignored", author
                    replaces = original
                posting = store.question_by_event(question)
                set_dir = store.set_dir_of(question) if posting is not None else None
                source = {"via": "matrix", "how": via, "room_id": room, "event_id": answer, "sender": sender, "ts": ts}
                common = dict(room_id=room, sender=sender, via=via, ts=ts, replaces=replaces, thread_root=thread,
                              set_id=posting.set_id if posting else None, set_dir=set_dir,
                              qid=posting.qid if posting else None, question_event_id=question if posting else None)
                if posting is None or not posting.open or not set_dir:
                    entry = LogEntry(answer, outcome="refused", layer="recorded", reason="closed",
                                     message=f"closed: {note}", **common)
                elif annotation:
                    record = {"note": note or "", "q_rev": posting.rev, "source": source}
                    if file is not None:
                        record["attachments"] = [f"files/{file}"]
                        store.record_attachment(answer, set_dir, posting.qid, f"files/{file}", None)
                    entry = LogEntry(answer, outcome="annotated", record=record, **common)
                else:
                    record = {"qid": posting.qid, "state": "answered", "choice": choice, "q_rev": posting.rev,
                              "source": source, "rev": store.accepted_count(set_dir, posting.qid) + 1}
                    if note:
                        record["note"] = note
                    entry = LogEntry(answer, outcome="accepted", record=record, carry_note=note, **common)
                seq = store.append_log(entry)
                side.hook(entry)
                store.mark_processed(answer, entry.outcome)
                if entry.outcome != "refused" and replaces:
                    store.reshadow(replaces)
                cleared = store.redaction_since(votes_key(question, sender), ts) \
                    if entry.outcome == "accepted" and via == "poll" else None
                if cleared is not None and store.withdraw(answer) is not None:
                    store.append_leaf(dataclasses.replace(entry, event_id=cleared[0], ts=cleared[1], replaces=answer,
                                                          record=None), None, outcome="withdrawn")
                unparked = store.unpark_edits(answer)
            return entry.outcome, canon(side.numbering("answer_log", "seq"), seq), cleared, unparked

        self.both("answer", op, answer, question, edit_of, thread)

    @rule(redaction=st.sampled_from(REDACTIONS), redacted=st.sampled_from(ANSWERS + QUESTIONS),
          room=st.sampled_from(ROOMS), ts=TIMES)
    def redact(self, redaction, redacted, room, ts):
        """A redaction, as the timeline and the pipeline apply it: kept (its target may come later), and
        what its target recorded withdrawn with a log entry of its own."""
        sender = SENDER_OF[redaction]

        def op(side: Side) -> Any:
            store = side.store
            seq = None
            with store.transaction(), store.savepoint():
                author = store.sender_of(redacted)
                store.keep_redaction(redaction, redacted, room, sender, ts)
                if author is None or (author != sender and sender != ADMIN):
                    store.mark_processed(redaction, "withdrawn" if author is None else "ignored")
                    return "not applied", author
                store.drop_undecrypted([redacted])
                if store.is_parked(redacted):  # judged when its original comes, then withdrawn
                    return "parked", store.redactions_kept(redacted)
                store.mark_processed(redacted, "withdrawn")
                touched = store.withdraw(redacted)
                if touched:
                    logged = store.logged_question(redacted)
                    entry = LogEntry(redaction, room, sender, "redaction", "withdrawn", set_id=touched[1],
                                     set_dir=touched[0], qid=touched[2], ts=ts, replaces=redacted,
                                     question_event_id=logged[0] if logged else None)
                    seq = store.append_log(entry)
                    side.hook(entry)
                store.mark_processed(redaction, "withdrawn")
            return touched, canon(side.numbering("answer_log", "seq"), seq)

        self.both("redact", op, redaction, redacted)

    @rule(n=st.integers(0, 1), question=st.sampled_from(QUESTIONS), sender=st.sampled_from(SENDERS),
          room=st.sampled_from(ROOMS), ts=TIMES)
    def empty_vote(self, n, question, sender, room, ts):
        """An emptied poll vote: the sender's votes before it withdrawn, and kept for a vote that comes late."""
        event = f"$v{n}\x1f{sender}"  # the poll response's own id

        def op(side: Side) -> Any:
            store = side.store
            with store.transaction():
                store.keep_redaction(event, votes_key(question, sender), room, sender, ts)
                touched = store.withdraw_votes(question, sender, ts)
                if touched:
                    entry = LogEntry(event, room, sender, "poll", "withdrawn", set_id=touched[1], set_dir=touched[0],
                                     qid=touched[2], ts=ts, question_event_id=question)
                    store.append_log(entry)
                    side.hook(entry)
                store.mark_processed(event, "withdrawn")
            return touched

        self.both("empty_vote", op, event, question)

    @rule(pick=st.integers(0, 30), reason=st.sampled_from(("internal_error", "unstorable")), message=TEXT)
    def set_aside(self, pick, reason, message):
        """A logged answer that can't be projected, turned into a refusal."""

        def op(side: Side) -> Any:
            seqs = side.seqs()
            if seqs:
                with side.store.transaction():
                    side.store.set_aside_entry(seqs[pick % len(seqs)], reason, message)

        self.both("set_aside", op)

    # -- notices -----------------------------------------------------------

    @rule(refusals=st.booleans(), limit=st.integers(1, 3), skip=st.sampled_from(((), ROOMS[:1])),
          pick=st.integers(0, 5),
          state=st.sampled_from((SENT, COALESCED, DROPPED)), reason=TEXT)
    def send_notice(self, refusals, limit, skip, pick, state, reason):
        """The notices pass: the oldest pending window, one notice sent (or dropped) for the entries it stands for."""

        def op(side: Side) -> Any:
            store = side.store
            rows = store.pending_refusals(limit, skip) if refusals else store.pending_acks(limit, skip)
            if not rows:
                return None
            last = rows[pick % len(rows)][0]
            seqs = store.notice_seqs(last)
            with store.transaction():
                for seq in seqs:
                    if state == DROPPED:
                        store.drop_notice(seq, ROOMS[0], reason, side.clock.now_ms())
                    else:
                        store.mark_acked(seq, state)
            numbers = side.numbering("answer_log", "seq")
            return [(canon(numbers, row[0]), *row[1:]) for row in rows], [canon(numbers, s) for s in seqs]

        self.both("send_notice", op)

    @rule(event=st.sampled_from(NOTICES), room=st.sampled_from(ROOMS), question=st.none() | st.sampled_from(QUESTIONS),
          about=st.none() | st.sampled_from(ANSWERS), kind=st.sampled_from(("notice", "reminder", "closed")))
    def sent(self, event, room, question, about, kind):
        self.both("record_sent", lambda side: side.store.record_sent(event, room, question_event_id=question,
                                                                     about=about, kind=kind), event, question, about)

    # -- the flush: dirty questions, approval outcomes, held sets ------------

    @rule(fails=st.sets(st.sampled_from(FOLDERS)), busy=st.booleans(), vacuum=st.booleans())
    def flush(self, fails, busy, vacuum):
        """As the pipeline's flush: approval outcomes logged in the dirty list's order, then each set written
        (or, for the folders in ``fails``, held back), the written ones cleared and released."""
        fails = {self.dir(f) for f in fails}

        def op(side: Side) -> Any:
            store = side.store
            dirty = store.dirty()
            changes = []
            for set_dir, _set_id, qid in dirty:
                posting = store.latest_posted(set_dir, qid)
                if posting is None or (posting.quorum is None and posting.expires_ms is None):
                    continue
                found = outcome_of(store.projection(set_dir, qid))
                if found is not None and store.approval_outcome_logged(posting.event_id) != found:
                    changes.append((posting.event_id, found))
            if changes:
                with store.transaction(flush=False):
                    for event_id, found in changes:
                        store.log_approval_outcome(event_id, found)
            held = {row[0] for row in store.held_sets()}
            written = [d for d in dirty if d[0] not in fails]
            attempts = []
            with store.transaction():
                store.clear_dirty(written)
                for set_dir in {d[0] for d in written} & held:
                    store.release_set(set_dir)
                for set_dir, set_id in sorted({(d[0], d[1]) for d in dirty if d[0] in fails}):
                    attempts.append(store.hold_set(set_dir, set_id, f"unwritable: {set_dir[-3:]}", side.clock.now_ms(),
                                                   retry_ms=200 if busy else None))
            if vacuum and side is self.sides[1]:
                store.db.execute("VACUUM")  # autovacuum, come for the rows just deleted (see ``autovacuum``)
            return dirty, changes, attempts

        self.both("flush", op)

    @rule(pick=st.integers(0, 5))
    def forget_doomed(self, pick):
        """A withdrawn file deleted from its folder: forgotten."""

        def op(side: Side) -> Any:
            doomed = sorted(side.store.doomed_files())  # no order is promised (each is deleted on its own)
            if doomed:
                with side.store.transaction():
                    side.store.forget_doomed(*doomed[pick % len(doomed)])

        self.both("forget_doomed", op)

    # -- meta, reminders, commands, appservice transactions ----------------

    @rule(key=st.sampled_from(META_KEYS), value=st.none() | TEXT, flush=st.booleans())
    def meta(self, key, value, flush):
        """A meta key set (an upsert) or deleted (value None)."""

        def op(side: Side) -> Any:
            with side.store.transaction(flush=flush):
                if value is None:
                    side.store.delete_meta(key)
                else:
                    side.store.set_meta(key, value)

        self.both("meta", op)

    @rule(question=st.sampled_from(QUESTIONS), found=st.sampled_from(("decided", "expired")))
    def approval_outcome(self, question, found):
        def op(side: Side) -> Any:
            with side.store.transaction(flush=False):
                return side.store.log_approval_outcome(question, found)

        self.both("log_approval_outcome", op, question)

    @rule(kind=st.sampled_from(("reminder", "command", "txn")), event=st.sampled_from(QUESTIONS + NOTICES), at=TIMES)
    def mark(self, kind, event, at):
        def op(side: Side) -> Any:
            store = side.store
            with store.transaction(flush=False):
                if kind == "reminder":
                    store.mark_reminded(event, at)
                elif kind == "command":
                    store.mark_command(event, at)
                else:
                    store.mark_txn(event)

        self.both("mark", op, event)

    # -- encrypted rooms, uploads ------------------------------------------

    @rule(event=st.sampled_from(ANSWERS), room=st.sampled_from(ROOMS),
          origin=st.none() | TIMES | st.just("late"), first_seen=TIMES, body=TEXT)
    def keep_undecrypted(self, event, room, origin, first_seen, body):
        message = {"event_id": event, "room_id": room, "sender": SENDER_OF[event], "type": "m.room.encrypted",
                   "content": {"ciphertext": body}}
        if origin is not None:
            message["origin_server_ts"] = origin

        def op(side: Side) -> Any:
            with side.store.transaction():
                return side.store.keep_undecrypted(message, first_seen)

        self.both("keep_undecrypted", op, event)

    @rule(events=st.lists(st.sampled_from(ANSWERS), max_size=3))
    def drop_undecrypted(self, events):
        def op(side: Side) -> Any:
            with side.store.transaction():
                side.store.drop_undecrypted(events)

        self.both("drop_undecrypted", op, *events)

    @rule(sha=st.sampled_from(UPLOADS), url=TEXT, size=st.integers(0, 2**40))
    def upload(self, sha, url, size):
        self.both("record_upload", lambda side: side.store.record_upload(sha, f"mxc://hs/{url}",
                                                                         {"mimetype": "image/png", "size": size}))

    # -- webhooks ----------------------------------------------------------

    @rule(per_url=st.integers(1, 3), leave_out=st.sampled_from(((), LANES[:1])), pick=st.integers(0, 5),
          taken=st.booleans(), delay=st.sampled_from((0, 1000, 60_000)))
    def deliver(self, per_url, leave_out, pick, taken, delay):
        """The deliverer: the due rows of each URL, one of them taken (deleted) or tried again later."""

        def op(side: Side) -> Any:
            store, now = side.store, side.clock.now_ms()
            rows = outbox.due_by_url(store, now, per_url, leave_out)
            numbers = side.numbering("webhook_outbox", "id")
            seen = [delivery(numbers, row) for row in rows]
            if rows:
                row = rows[pick % len(rows)]
                if taken:
                    outbox.delivered(store, row.id)
                else:
                    outbox.retry_at(store, row.id, row.attempts + 1, now + delay)
            return seen

        self.both("deliver", op)

    @rule(size=st.integers(0, 40), note=TEXT)
    def checkpoint(self, size, note):
        def op(side: Side) -> Any:
            with side.store.transaction():
                side.store.audit.keep_checkpoint(size, note, side.clock.now_ms())

        self.both("checkpoint", op)

    # -- time, failures, restarts ------------------------------------------

    @rule(by=st.sampled_from((1, 500, 1000, 90_000)))
    def advance(self, by):
        self.clock.ms += by

    @rule(event=st.sampled_from(ANSWERS), question=st.sampled_from(QUESTIONS), key=st.sampled_from(META_KEYS),
          in_savepoint=st.booleans())
    def fail(self, event, question, key, in_savepoint):
        """A batch (or, in ``in_savepoint``, one event of it) that fails after writing: all of it is undone,
        a savepoint's part only (the batch then goes on and commits)."""

        def writes(store: Store) -> None:
            store.append_log(LogEntry(event, ROOMS[0], SENDERS[0], "answer_event", "refused", layer="schema",
                                      reason="bad", question_event_id=question, ts=T0))
            store.mark_processed(event, "refused")
            store.set_meta(key, "during a failure")
            store.mark_reminded(question, T0)
            raise RuntimeError("the disk is full")

        def op(side: Side) -> Any:
            store = side.store
            with store.transaction():
                if in_savepoint:
                    try:
                        with store.savepoint():
                            writes(store)
                    except RuntimeError:
                        pass
                    store.mark_command(event, T0)  # the batch goes on
                else:
                    writes(store)

        self.both("fail", op, event, question)

    @rule()
    def autovacuum(self):
        """PostgreSQL's autovacuum, which runs when it likes: the space of rows
        deleted or updated is taken by the rows that come next, so a table's
        own order is no longer the order its rows came in (SQLite has none)."""
        self.sides[1].store.db.execute("VACUUM")

    @rule()
    def restart(self):
        """Both closed and opened again on the same file and URL: what persisted is compared from here on."""
        for side in self.sides:
            side.store.close()
            side.open()
        self.checked = None  # new connections, no question kept parsed: every view is read again

    # -- every view the bridge reads ---------------------------------------

    @invariant()
    def the_views_agree(self):
        # The views are read from the rows, the clock and what a store keeps
        # parsed: when neither store changed a row (its connection counts
        # them), the clock stood still and neither was opened again, they
        # are the ones compared after the step before.
        now = (tuple(side.store.changes() for side in self.sides), self.clock.ms, len(self.used), len(self.posted))
        if now != self.checked:
            self.compare(full=self.checked is None)
            self.checked = now

    def compare(self, full: bool) -> None:
        views = [self.views(side, full) for side in self.sides]
        for name in views[0]:
            self.agree(name, views[0][name], views[1][name])

    def agree(self, what: str, sqlite: Any, postgresql: Any) -> None:
        self.diverged = sqlite != postgresql
        assert not self.diverged, f"{what}: sqlite {sqlite!r} but postgresql {postgresql!r}"

    def views(self, side: Side, full: bool) -> dict[str, Any]:
        """Every view the bridge reads, of every id the operations used.
        Reading one row by its key (is_processed, get_meta, ...) shows only
        what the tables do, so those are read after a restart (``full``:
        the persistence check), not after every step: PostgreSQL answers
        each read in a round trip, and they would double the test's time."""
        store, now = side.store, side.clock.now_ms()
        seq = side.numbering("answer_log", "seq")
        ids = side.numbering("webhook_outbox", "id")
        seqs = sorted(seq)
        used = [i for i in ANSWERS + REDACTIONS + QUESTIONS + NOTICES if i in self.used]
        out: dict[str, Any] = {"tables": self.tables(side, seq, ids)}
        if full:
            polls = [poll_of(p, q) for p in POLLS for q in QUESTIONS if poll_of(p, q) in self.used]
            out["lookups"] = (
                [(store.is_processed(e), store.logged_sender(e), store.attachment(e), store.gesture_at(e),
                  sorted(store.redactions_of(e))) for e in used],
                [(store.question_by_event(q), store.set_dir_of(q), store.poll_of(q), store.approval_outcome_logged(q),
                  store.is_expired(q)) for q in QUESTIONS if q in used],
                [store.question_by_elicitation(e) for e in ELICITATIONS if e in self.used],
                [store.question_by_poll(p) for p in polls], [store.sent_question(n) for n in NOTICES if n in used],
                [(store.command_handled(e), store.txn_seen(e)) for e in QUESTIONS + NOTICES if e in used],
                [store.get_meta(k) for k in META_KEYS], [store.upload_of(u) for u in UPLOADS],
                [store.log_entry(s) for s in seqs], store.audit.size(), store.audit.all_checkpoints())
        # -- postings
        out["posted"] = (store.count_posted(), store.open_posted(), store.open_posted(SET_IDS[1]),
                         store.folders_with_open(),  # in this order removed sets are closed
                         [store.folders_of_set(s) for s in SET_IDS], store.highest_posted_revs(),
                         store.posted_question_counts(), [store.posted_for_set(self.dir(f)) for f in FOLDERS],
                         store.answered_question_events())
        for set_dir, qid in sorted(self.posted):
            where = f"{Path(set_dir).name!r}/{qid}"
            out[f"postings {where}"] = store.postings(set_dir, qid)
            out[f"projection {where}"] = store.projection(set_dir, qid)
            out[f"counts {where}"] = (store.accepted_count(set_dir, qid), store.standing_pick_sender(set_dir, qid),
                                      canon(seq, store.latest_recording(set_dir, qid)),
                                      store.attachment_count(set_dir, qid))
            out[f"standing_before {where}"] = [store.standing_before(set_dir, qid, a) for a in ANSWERS if a in used]
        for question in (q for q in QUESTIONS if q in used):
            out[f"casts {question!r}"] = [
                dataclasses.replace(c, at=(c.at[0], canon(seq, c.at[1])), withdrawn_at=(
                    c.withdrawn_at[0], c.withdrawn_at[1] if c.withdrawn_at[1] in (0, 2**62)  # an emptied vote; never
                    else canon(seq, c.withdrawn_at[1]))) for c in store.casts(question)]
        # -- events and the log
        for event in (e for e in ANSWERS + REDACTIONS if e in used):
            out[f"event {event!r}"] = (
                store.sender_of(event), store.original_of(event), store.logged_question(event),
                store.accepted_answer(event), store.receipt_of(event), store.redaction_since(event, T0 + 1),
                store.acknowledgement_of(event))
        out["log"] = ([store.log_entry(s) for s in seqs[-2:]],  # the newest; the others are in the tables
                      [[canon(seq, s) for s in store.notice_seqs(last)] for last in seqs[-3:]],
                      store.notice_pending(seqs[-3:]), store.notice_pending(seqs), store.log_counts())
        out["pending notices"] = [([(canon(seq, r[0]), r[1]) for r in store.pending_acks(limit, skip)],
                                   [(canon(seq, r[0]), *r[1:]) for r in store.pending_refusals(limit, skip)])
                                  for limit, skip in ((10, ()), (1, ROOMS[:1]))]
        held = held_back(store)
        out["held back"] = (
            [(canon(seq, r[0]), *r[1:]) for r in store.dropped_notices(1)],  # the whole list is in held_back
            store.dirty(),  # in this order the flush logs approval outcomes and writes sets
            sorted(store.doomed_files()),  # each deleted on its own, in no order
            store.held_sets(),
            {**held, "notices": [{**n, "log_seq": canon(seq, n["log_seq"])} for n in held["notices"]]})
        # -- meta, reminders, encrypted rooms
        out["meta"] = ([store.meta_with_prefix(p) for p in PREFIXES], store.reminded(),  # "": every row, in order
                       store.undecrypted())
        # -- webhooks
        out["outbox"] = ([[delivery(ids, d) for d in outbox.due(store, now, limit)] for limit in (50, 1)],
                         [[delivery(ids, d) for d in outbox.due_by_url(store, now, n, leave)]
                          for n, leave in ((1, ()), (2, LANES[1:]))],
                         outbox.next_due(store), outbox.next_due(store, now), outbox.next_due(store, 0, LANES[:1]),
                         [delivery(ids, d) for d in outbox.expired(store, now - 1000)], outbox.pending(store))
        # -- the verifiable log
        audit = store.audit
        out["audit"] = (audit.leaves(0, 10**6), audit.hashes(3), audit.hashes_from(2), audit.checkpoints(),
                        audit.latest_checkpoint())
        return out

    def tables(self, side: Side, seq: dict[int, int], ids: dict[int, int]) -> dict[str, list]:
        """Every row of every table the migrations make, its numbers by their
        place (see ``numbering``), sorted here: no view promises their order."""
        out = {}
        numbered = {"seq": seq, "id": ids}
        for table, columns in TABLES.items():
            if table in SHOWN_WHOLE:
                continue
            rows = side.store.db.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall()
            out[table] = sorted((tuple(canon(numbered[c], v) if c in numbered else v for c, v in zip(columns, row))
                                 for row in rows), key=repr)
        return out


def _tables() -> dict[str, list[str]]:
    """table -> its columns, as the migrations leave them (read from a new SQLite store)."""
    folder = Path(tempfile.mkdtemp(prefix="dialects-schema-"))
    try:
        db = Store(folder / "s.sqlite").db
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'"
                                          " AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        found = {name: [r[1] for r in db.execute(f"PRAGMA table_info({name})")] for name in names}
        db.close()
        return found
    finally:
        shutil.rmtree(folder, ignore_errors=True)


TABLES = _tables()
# Tables a view reads whole, every column (meta_with_prefix(""), reminded, dirty,
# doomed_files, held_sets, held_back's notices): compared there, not again.
SHOWN_WHOLE = ("meta", "reminders", "dirty", "doomed_file", "held_set", "dropped_notice")


def test_the_store_says_the_same_on_sqlite_and_postgresql(postgres_server):
    # In a database that sorts text by a language's rules, as most do (the
    # test server's own sorts bytes, as SQLite does, and would hide that).
    DialectsAgree.url, DialectsAgree.password = linguistic_schema(postgres_server), postgres_server.password
    run_state_machine_as_test(DialectsAgree, settings=settings(
        max_examples=15, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
