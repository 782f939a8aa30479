"""A batch's look-ups taken from the batch before, on PostgreSQL.

Before judging, a batch reads whether its events were processed, redacted
or are waited for by edits, and the postings its answers name with their
questions' counts (``Store.know_batch``): a round trip before anything can
be written, and a second one carries the writes and the COMMIT.  Answers
to questions already being answered need nothing new: the batch before
read those postings and counts and kept them up to date with its own
writes; and what the bridge posted itself, it knows from its own writes
(``Postings.record_posted``, ``set_poll``).  So a batch takes them from
there, and takes its events as new, and
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

from bridge.service.storage.postings import _LOOKED_UP_BY

# Guessing for more than this many ids and postings reads instead (a
# back-fill's page, whose one read costs little beside its writes): the
# condition's arrays stay small.
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


# The columns a posting is looked up by, by ``Postings.looked_up``'s keys ("event_id=?").
_BY = {where: where.removesuffix("=?") for where, _column in _LOOKED_UP_BY}


def _postings_hold(column: str) -> str:
    """The postings looked up by ``column`` as taken: those taken as absent
    found nowhere, every other found once, with the values taken."""
    return (f"NOT EXISTS (SELECT 1 FROM posted WHERE {column} = ANY(%s::text[]))"
            " AND NOT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::text[],"
            " %s::text[]) AS g(value, event_id, open, closed_why, set_dir, qid)"
            f" WHERE (SELECT COUNT(*) FROM posted p WHERE p.{column} = g.value) <> 1"
            f" OR NOT EXISTS (SELECT 1 FROM posted p WHERE p.{column} = g.value AND p.event_id = g.event_id"
            " AND p.open = g.open AND p.closed_why IS NOT DISTINCT FROM g.closed_why AND p.set_dir = g.set_dir"
            " AND p.qid = g.qid))")


# One text whatever the batch holds (its values go in arrays): the server
# keeps it prepared and planned, where a text made to the batch's shape was
# parsed and planned again nearly every batch, costing more than the round
# trip the guess saves.
CONDITION = " AND ".join([
    *(f"NOT EXISTS (SELECT 1 FROM {table} WHERE {column} = ANY(%s::text[]))"
      for table, column in (("processed", "event_id"), ("redaction", "target"), ("parked_edit", "target"))),
    *(_postings_hold(column) for column in _BY.values()),
    "NOT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS c(set_dir, qid, n)"
    " WHERE (SELECT COUNT(*) FROM answer_log a WHERE a.set_dir = c.set_dir AND a.qid = c.qid"
    " AND a.outcome = 'accepted') <> c.n)",
    "NOT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::bigint[]) AS v(target, ts)"
    " JOIN redaction r ON r.target = v.target AND r.ts >= v.ts)",  # no empty vote since a vote
    "NOT EXISTS (SELECT 1 FROM appservice_txn WHERE txn_id = %s::text)",  # NULL (no delivery): none found
])


def condition(ids: Sequence[str], keys: Sequence[tuple[str, str]], postings: dict, questions: dict,
              counts: dict, votes: dict, delivery: str | None) -> tuple[str, list[Any]]:
    """What the batch took for granted, as one SQL condition (``CONDITION``)
    and its parameters: its events new, each posting as taken (found once,
    or not at all), each question's accepted count, no empty vote since
    each vote (``votes``: ``votes_key`` -> (earliest vote's ts, ...)), its
    delivery not taken before.  Numbers go as text, cast on the server:
    psycopg types an array of numbers by its values, and each typing is
    another statement to the server's cache."""
    params: list[Any] = [list(ids)] * 3
    for by in _BY:
        absent: list[str] = []
        found: list[list[Any]] = [[] for _ in range(6)]  # value, event id, open, closed_why, set dir, qid
        for where, value in keys:
            if where != by:
                continue
            posting = postings[(where, value)]
            if posting is None:
                absent.append(value)
                continue
            event_id, is_open, closed_why = posting
            for values, taken_value in zip(found, (value, event_id, str(int(is_open)), closed_why,
                                                   *questions[event_id])):
                values.append(taken_value)
        params += [absent, *found]
    params += [[set_dir for set_dir, _qid in counts], [qid for _set_dir, qid in counts],
               [str(n) for n in counts.values()]]
    params += [list(votes), [str(floor) for floor, _redactions in votes.values()]]
    params.append(delivery)
    return CONDITION, params
