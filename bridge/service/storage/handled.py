"""What was handled once, so that what is delivered again is not handled
twice: the events processed (``processed``) and the appservice transactions
taken (``appservice_txn``)."""

from __future__ import annotations


class Handled:
    """A part of ``Store`` (store.py): ``processed`` and ``appservice_txn``.
    Whether an event was processed, and whether the batch's transaction was
    taken, are answered from the batch's memo (``Store.know_batch``) when the
    batch read them, and kept in it."""

    def is_processed(self, event_id: str) -> bool:
        known = self._known(event_id)
        if known is not None:
            return event_id in known.processed
        return self.db.execute("SELECT 1 FROM processed WHERE event_id=?", (event_id,)).fetchone() is not None

    def processed_among(self, event_ids: list[str]) -> set[str]:
        """Which of ``event_ids`` were processed: a query for each 500, not one each."""
        found: set[str] = set()
        for start in range(0, len(event_ids), 500):
            part = event_ids[start:start + 500]
            found.update(row[0] for row in self.db.execute(
                f"SELECT event_id FROM processed WHERE event_id IN ({','.join('?' * len(part))})",
                tuple(part)).fetchall())
        return found

    def mark_processed(self, event_id: str, outcome: str) -> None:
        """An event's outcome, for good; but a redaction "kept" while its
        target was unknown takes the outcome it has once it is applied to it
        (withdrawn, or ignored): a moderator's counts, in the tally of votes,
        where it is marked withdrawn (``Projection.casts``)."""
        self.db.defer("INSERT INTO processed(event_id, outcome) VALUES (?, ?)"
                      " ON CONFLICT(event_id) DO UPDATE SET outcome=excluded.outcome WHERE processed.outcome='kept'",
                      (event_id, outcome))
        if self._batch is not None:
            self._batch.processed.add(event_id)

    def txn_read(self, txn_id: str) -> tuple[str, tuple[str]]:
        return ("SELECT 1 FROM appservice_txn WHERE txn_id=?", (txn_id,))

    def txn_seen(self, txn_id: str) -> bool:
        batch = self._batch
        if batch is not None and batch.delivery == txn_id:
            return batch.delivered
        return self.db.execute(*self.txn_read(txn_id)).fetchone() is not None

    def mark_txn(self, txn_id: str) -> None:
        self.db.defer("INSERT INTO appservice_txn(txn_id) VALUES (?) ON CONFLICT DO NOTHING", (txn_id,))
        batch = self._batch
        if batch is not None and batch.delivery == txn_id:
            batch.delivered = True
