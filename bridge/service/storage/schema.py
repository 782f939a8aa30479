"""The store's schema: one migration per version, oldest first.

The version a store is at is its ``PRAGMA user_version`` (``pgdialect``
keeps it in a table on PostgreSQL); ``Store`` runs the migrations it lacks,
each in its own transaction, and refuses a store newer than
``SCHEMA_VERSION``.  The comments say which issue brought each table and why.
"""

from __future__ import annotations

from bridge.service.storage.dialect import Dialect

# Each entry moves the schema one version forward; never change what a shipped
# one runs.  ``{int}``, ``{serial}`` and ``{rowid}`` are the types each backend
# writes its own way (``dialect.Dialect.types``): ``migration`` fills them in.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL{rowid});
    CREATE TABLE posted (
        event_id TEXT PRIMARY KEY,
        room_id TEXT NOT NULL,
        set_id TEXT NOT NULL,
        set_dir TEXT NOT NULL,
        qid TEXT NOT NULL,
        rev {int} NOT NULL,
        elicitation_id TEXT NOT NULL UNIQUE,
        content TEXT NOT NULL,
        open {int} NOT NULL DEFAULT 1,
        poll_event_id TEXT,
        posted_at {int} NOT NULL{rowid}
    );
    CREATE INDEX posted_by_question ON posted (set_id, qid, rev);
    CREATE INDEX posted_by_poll ON posted (poll_event_id);
    CREATE TABLE processed (event_id TEXT PRIMARY KEY, outcome TEXT NOT NULL{rowid});
    CREATE TABLE answer_log (
        seq {serial},
        event_id TEXT NOT NULL,
        room_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        set_id TEXT,
        set_dir TEXT,
        qid TEXT,
        question_event_id TEXT,
        via TEXT NOT NULL,
        outcome TEXT NOT NULL,          -- accepted | refused | withdrawn
        layer TEXT,
        reason TEXT,
        message TEXT,
        record TEXT,                    -- the answers.json record, for accepted answers
        withdrawn {int} NOT NULL DEFAULT 0,
        acked {int} NOT NULL DEFAULT 0,
        ts {int} NOT NULL
    );
    CREATE INDEX log_by_question ON answer_log (set_dir, qid, outcome);
    CREATE INDEX log_by_event ON answer_log (event_id);
    CREATE TABLE dirty (set_dir TEXT NOT NULL, set_id TEXT NOT NULL, qid TEXT NOT NULL,
                        PRIMARY KEY (set_dir, qid){rowid});
    CREATE TABLE appservice_txn (txn_id TEXT PRIMARY KEY{rowid});
    """,
    # Element's gestures (issue 5): edits point at the event they replace so a
    # redaction of the original withdraws its edits too; files people send are
    # downloaded before the batch is judged; question media is uploaded once.
    """
    ALTER TABLE answer_log ADD COLUMN replaces TEXT;
    CREATE INDEX log_by_replaces ON answer_log (replaces);
    CREATE TABLE attachment (
        event_id TEXT PRIMARY KEY,
        set_dir TEXT NOT NULL,
        qid TEXT NOT NULL,
        path TEXT,                      -- relative to the set folder, NULL when not saved
        problem TEXT{rowid}                    -- why it was not saved (a reason code)
    );
    CREATE INDEX attachment_by_question ON attachment (set_dir, qid);
    CREATE TABLE media_upload (
        sha256 TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        info TEXT NOT NULL{rowid}              -- JSON: mimetype, size, w, h, duration_ms
    );
    """,
    # Operators (issue 10): when each question was last nudged, so a reminder
    # goes out at most once per period across restarts; management commands
    # handled, so a replayed batch does not run one twice.
    """
    CREATE TABLE reminders (event_id TEXT PRIMARY KEY, last_at {int} NOT NULL{rowid});
    CREATE TABLE admin_command (event_id TEXT PRIMARY KEY, handled_at {int} NOT NULL{rowid});
    """,
    # Encrypted rooms (issue 9): events the bridge could not decrypt yet are
    # kept here before the sync token moves past them, retried as keys arrive
    # and given up on (the person told) after the grace period.
    """
    CREATE TABLE undecrypted (
        event_id TEXT PRIMARY KEY,
        room_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        event TEXT NOT NULL,            -- the m.room.encrypted event as received (JSON)
        first_seen {int} NOT NULL{rowid}     -- ms since the epoch
    );
    """,
    # Speed (issue 8): the notices still to send are looked up after every
    # batch; indexing only those keeps that lookup from reading the whole log.
    """
    CREATE INDEX log_unacked ON answer_log (seq) WHERE acked=0;
    """,
    # Fault isolation (issue 14): a set whose folder can't be written is held
    # back on its own (its questions stay dirty and are retried with backoff)
    # while the others and the transport move on; a notice that can never be
    # sent is dropped with its reason (answer_log.acked: 0 pending, 1 sent,
    # 2 told in a later coalesced reply, 3 dropped).
    """
    CREATE TABLE held_set (
        set_dir TEXT PRIMARY KEY,
        set_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        since {int} NOT NULL,         -- ms since the epoch
        attempts {int} NOT NULL,
        next_try {int} NOT NULL{rowid}       -- ms since the epoch
    );
    CREATE TABLE dropped_notice (
        seq {int} PRIMARY KEY,        -- the answer_log entry whose notice was dropped
        room_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        at {int} NOT NULL
    );
    """,
    # A word back for every gesture (issue 17): the bridge's own messages
    # about a question (acknowledgements, refusals, reminders, close notices),
    # so a reply to one of them is read as an answer to that question and a
    # withdrawal is told where its acknowledgement went.  Withdrawals are now
    # told too; those logged before this version were never owed a word.
    """
    CREATE TABLE sent (
        event_id TEXT PRIMARY KEY,          -- the bridge's message
        room_id TEXT NOT NULL,
        question_event_id TEXT,             -- the question it is about
        about TEXT,                         -- the person's event it answers (an acknowledgement's answer)
        kind TEXT NOT NULL{rowid}                  -- notice | reminder | closed | score
    );
    CREATE INDEX sent_by_about ON sent (about);
    UPDATE answer_log SET acked=1 WHERE outcome='withdrawn';
    """,
    # Agents from anywhere (issue 18): webhooks still to deliver, written in
    # the transaction of the answer they tell of; a row is deleted once its
    # URL took it (or when it is given up on).
    """
    CREATE TABLE webhook_outbox (
        id {serial},
        key TEXT NOT NULL,              -- the idempotency key: the same on every attempt
        agent TEXT NOT NULL,
        url TEXT NOT NULL,
        body TEXT NOT NULL,             -- the JSON body, signed as sent
        created_at {int} NOT NULL,    -- ms since the epoch
        next_at {int} NOT NULL,       -- ms since the epoch
        attempts {int} NOT NULL DEFAULT 0,
        UNIQUE (key, url)
    );
    CREATE INDEX webhook_due ON webhook_outbox (next_at);
    """,
    # The record is the room's timeline (issue 15): postings are a set
    # folder's, found newest first by posting order whatever their rev, and a
    # closed one says why (an answer to it is told).  The log is read in the
    # room's order (origin_server_ts, then arrival): an edit shadows the
    # versions before it instead of withdrawing them (redacting it brings the
    # previous one back), a pick's own note is kept apart from the notes
    # people add (``whole`` marks the records of older versions, which had
    # earlier notes and files folded in; ``noted``: a pick with a note, the
    # one a later pick without words keeps), redactions and edits whose target
    # has not arrived yet wait for it, and a withdrawn file is deleted.
    """
    ALTER TABLE posted ADD COLUMN closed_why TEXT;
    CREATE INDEX posted_by_folder ON posted (set_dir, qid);
    ALTER TABLE answer_log ADD COLUMN shadowed {int} NOT NULL DEFAULT 0;
    ALTER TABLE answer_log ADD COLUMN carry_note TEXT;
    ALTER TABLE answer_log ADD COLUMN whole {int} NOT NULL DEFAULT 0;
    ALTER TABLE answer_log ADD COLUMN noted {int} NOT NULL DEFAULT 0;
    UPDATE answer_log SET whole=1, noted=1 WHERE outcome='accepted';
    CREATE INDEX log_by_question_time ON answer_log (set_dir, qid, outcome, ts);
    CREATE INDEX log_noted ON answer_log (set_dir, qid, ts) WHERE noted=1;
    CREATE TABLE redaction (
        event_id TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        room_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        ts {int} NOT NULL{rowid}
    );
    CREATE INDEX redaction_by_target ON redaction (target);
    CREATE TABLE parked_edit (
        event_id TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        event TEXT NOT NULL,
        parked_at {int} NOT NULL{rowid}
    );
    CREATE INDEX parked_by_target ON parked_edit (target);
    CREATE TABLE doomed_file (set_dir TEXT NOT NULL, path TEXT NOT NULL, PRIMARY KEY (set_dir, path){rowid});
    CREATE TABLE edit_link (event_id TEXT PRIMARY KEY, original TEXT NOT NULL{rowid});
    """,
    # A word back where it is seen: an answer sent in a thread is answered in
    # that thread (Element shows a plain reply to a thread message nowhere).
    """
    ALTER TABLE answer_log ADD COLUMN thread_root TEXT;
    """,
    # A verifiable answer log (issue 32): one leaf per outcome, appended in
    # the outcome's own transaction (RFC 8785 JSON, its RFC 6962 leaf hash in
    # hex), and the signed checkpoints of the tree (C2SP signed notes).
    """
    CREATE TABLE audit_leaf (
        idx {int} PRIMARY KEY,            -- 0, 1, 2, ... with no gap
        leaf TEXT NOT NULL,                 -- the leaf: canonical JSON (docs/audit.md)
        hash TEXT NOT NULL,                 -- SHA-256(0x00 || leaf), hex
        seq {int}                         -- the answer_log entry it records, if any
    );
    CREATE INDEX audit_by_seq ON audit_leaf (seq);
    CREATE TABLE audit_checkpoint (
        size {int} PRIMARY KEY,           -- the tree size it signs
        note TEXT NOT NULL,                 -- the signed note
        at {int} NOT NULL                 -- ms since the epoch
    );
    """,
    # An edit of a file message that sends another file (not only a new
    # caption) brings that file: told apart by the content repository's URL
    # of the file each message sent (NULL in rows from before).
    """
    ALTER TABLE attachment ADD COLUMN url TEXT;
    """,
    # The webhook outbox's age, read every second for /health and every
    # minute for what to drop: a dead receiver's backlog of a day was read
    # whole (bodies and all) each time, on the store's thread.
    """
    CREATE INDEX webhook_by_age ON webhook_outbox (created_at);
    """,
    # A set's callbacks and its agent's webhook_url can name one URL, and
    # the event then has one row for it: ``callback`` says a set's callbacks
    # named it, so a changed webhook_url moves (or drops) only what the
    # agent's URL was owed, and the set's callback still gets its own.
    # Rows from before are taken as the agent's URL's, as they were.
    """
    ALTER TABLE webhook_outbox ADD COLUMN callback {int} NOT NULL DEFAULT 0;
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


def migration(number: int, dialect: Dialect) -> list[str]:
    """The statements that move a store of ``dialect`` from version ``number``
    to the next, run one at a time."""
    script = MIGRATIONS[number].format_map(dialect.types)
    return [s.strip() for s in script.split(";") if s.strip()]
