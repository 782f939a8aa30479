"""A batch's look-ups taken from the batch before, on PostgreSQL.

Before judging, a batch reads whether its events were processed, redacted
or are waited for by edits, and the postings its answers name with their
questions' counts (``Store.know_batch``): a round trip before anything can
be written, and a second one carries the writes and the COMMIT.  Answers
to questions already being answered need nothing new: the batch before
read those postings and counts and kept them up to date with its own
writes.  So a batch takes them from it, and takes its events as new, and
sends instead one condition that all of it still holds, ahead of its writes
and with its COMMIT (``PgConnection.expect``): it waits once before
answers.json can be written, not twice.

What was taken for granted is never trusted: anything that changed it
(another writer, the event loop's own writes, an event delivered again)
makes the condition false on the server, nothing sent after it runs, and
the batch is handled again from reads (``GuessedWrong``).  SQLite reads
cost no round trip, so nothing is guessed there.  The SQL here is
PostgreSQL's own (``%s`` placeholders), sent as it is written.
"""

from __future__ import annotations

from typing import Any, Sequence

# Guessing for more than this many ids and postings reads instead: one
# statement's parameters stay well within the server's limit.
MOST = 500

Posting = tuple[Any, Any, Any]  # (event id, open, closed_why), as ``Postings._remember`` keeps it
Question = tuple[str, str]  # (set dir, qid)


def taken(before: Any, keys: Sequence[tuple[str, str]]) -> tuple[dict, dict, dict] | None:
    """The postings (``keys``: (where, value)), their questions and counts as
    the batch ``before`` left them; None when it did not know one of them."""
    postings: dict[tuple[str, str], Posting | None] = {}
    questions: dict[str, Question] = {}
    counts: dict[Question, int] = {}
    for key in keys:
        if before is None or key not in before.postings:
            return None
        posting = before.postings[key]
        postings[key] = posting
        if posting is not None:
            question = before.questions.get(posting[0])
            if question is None or question not in before.counts:
                return None
            postings[("event_id=?", posting[0])] = posting
            questions[posting[0]] = question
            counts[question] = before.counts[question]
    return postings, questions, counts


def condition(ids: Sequence[str], keys: Sequence[tuple[str, str]], postings: dict, questions: dict,
              counts: dict, delivery: str | None) -> tuple[str, list[Any]]:
    """What the batch took for granted, as one SQL condition and its parameters:
    its events new, each posting as taken (found once, or not at all), each
    question's accepted count, its delivery not taken before."""
    terms: list[str] = []
    params: list[Any] = []
    if ids:
        marks = ",".join(["%s"] * len(ids))
        for table, column in (("processed", "event_id"), ("redaction", "target"), ("parked_edit", "target")):
            terms.append(f"NOT EXISTS (SELECT 1 FROM {table} WHERE {column} IN ({marks}))")
            params += ids
    for where, value in keys:
        found = where.replace("?", "%s")
        posting = postings[(where, value)]
        if posting is None:
            terms.append(f"NOT EXISTS (SELECT 1 FROM posted WHERE {found})")
            params.append(value)
            continue
        event_id, is_open, closed_why = posting
        set_dir, qid = questions[event_id]
        terms.append(f"(SELECT COUNT(*) FROM posted WHERE {found}) = 1")
        terms.append(f"EXISTS (SELECT 1 FROM posted WHERE {found} AND event_id = %s AND open = %s"
                     " AND closed_why IS NOT DISTINCT FROM %s AND set_dir = %s AND qid = %s)")
        params += [value, value, event_id, int(is_open), closed_why, set_dir, qid]
    for (set_dir, qid), count in counts.items():
        terms.append("(SELECT COUNT(*) FROM answer_log WHERE set_dir = %s AND qid = %s AND outcome = 'accepted') = %s")
        params += [set_dir, qid, count]
    if delivery is not None:
        terms.append("NOT EXISTS (SELECT 1 FROM appservice_txn WHERE txn_id = %s)")
        params.append(delivery)
    return " AND ".join(terms) or "true", params
