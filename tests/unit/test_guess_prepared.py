"""The condition a batch sends instead of its look-ups (``guesses``) is one
text whatever the batch holds, so PostgreSQL keeps it prepared: parsed and
planned once per connection, not once per batch.  Made to each batch's
shape (how many events, postings and questions), it was parsed and planned
again nearly every batch: about 0.5 ms of the server's time, more than the
round trip the guess saves."""

from __future__ import annotations

import json

from helpers.pgstore import on_postgresql
from test_isolation_parts import ALICE, BOB, ROOM, answer, setup


def test_batches_of_every_shape_share_one_prepared_condition(tmp_path, monkeypatch, postgres_server):
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$warm", "first")])
    sent = 1
    for batch in range(9):
        size = batch % 3 + 1  # one, two, three answers: each shape three times
        pipeline.process([answer(0, f"$b{batch}e{n}", f"answer {batch}.{n}", sender=ALICE if n % 2 else BOB)
                          for n in range(size)])
        sent += size
    prepared = store.db.execute("SELECT statement FROM pg_prepared_statements"
                                " WHERE statement LIKE 'SELECT CASE WHEN %'").fetchall()
    assert len(prepared) == 1
    record = json.loads((folders[ROOM] / "answers.json").read_text())["answers"]["name"]
    assert record["rev"] == sent  # every answer taken, as reading would have
