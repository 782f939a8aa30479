"""The verifiable answer log from the store's side (issue 32): every
outcome's leaf, appended in the outcome's own transaction, and the receipts
records and webhooks carry.  The tables themselves are ``auditlog.AuditLog``'s."""

from __future__ import annotations

from typing import Any

from bridge.protocol import audit_leaf
from bridge.service.storage.answerlog import LogEntry
from bridge.service.storage.auditlog import AuditLog, LastLogged


class Leaves:
    """A part of ``Store`` (store.py): the leaf of each outcome (none with
    ``audit_enabled`` off) and the receipt of each entry."""

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.db)

    def append_leaf(self, entry: LogEntry, seq: "int | None | LastLogged", *, outcome: str | None = None) -> None:
        """The answer log's leaf for ``entry`` (``outcome`` when it differs
        from the entry's: a later decision about it), appended in the caller's
        transaction (none with ``audit.enabled`` off).  Every place an outcome
        is recorded makes this one call."""
        if not self.audit_enabled:
            return
        question = self.question_by_event(entry.question_event_id) if entry.question_event_id else None
        leaf = audit_leaf.build_leaf(
            outcome=outcome or entry.outcome, set_id=entry.set_id, room_id=entry.room_id, event_id=entry.event_id,
            sender=entry.sender, ts=entry.ts, via=entry.via, question=question.content if question else None,
            question_event_id=entry.question_event_id, replaces=entry.replaces, device=entry.device,
            record=entry.record, reason=entry.reason)
        self.audit.append(leaf, seq)

    def receipt_of(self, event_id: str) -> dict[str, Any] | None:
        """The receipt of the newest logged outcome of ``event_id`` (what a webhook about it carries)."""
        if not self.audit_enabled:
            return None
        row = self.db.execute("SELECT MAX(seq) FROM answer_log WHERE event_id=?", (event_id,)).fetchone()
        found = self.audit.receipt(row[0]) if row and row[0] is not None else None
        return None if found is None else {"log": self.audit_origin(), "index": found[0], "leaf": found[1]}

    def audit_origin(self) -> str | None:
        """The answer log's origin (its name in checkpoints), set on the first start with the log."""
        if self._origin is None:  # kept once found: it is set once, and never changes after
            self._origin = self.get_meta("audit_origin")
        return self._origin
