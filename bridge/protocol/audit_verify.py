"""Checking a set's answers against the answer log, offline.  Pure.

What ``askwright-bridge verify`` and the MCP ``verify`` tool run: given a
set's ``answers.json``, the log's leaves (as exported), its checkpoints and
the log's public key, every mismatch is named: the record, the index, what
differs.  Nothing here trusts the bridge: the leaves are hashed again, the
tree rebuilt, the signatures checked with the key given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from bridge import strictjson
from bridge.protocol import audit_leaf, checkpoint as cp, merkle


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    checked_records: int = 0
    leaves: int = 0
    checkpoint_size: int | None = None
    earlier_checkpoints: int = 0
    newer: list[int] = field(default_factory=list)  # sizes of checkpoints past the export (not checked)
    truncated: bool = False  # the export's own checkpoint is past its leaves: an input that can't be read whole
    # Records of answers given before the log's first leaf (the bridge ran
    # without the log then): the log can't vouch for them, and says so.
    before_the_log: list[str] = field(default_factory=list)
    log_began_ms: int | None = None

    @property
    def holds(self) -> bool:
        return not self.problems


def verify_log(leaves: Sequence[bytes], notes: Sequence[str], origin: str, public: bytes,
               verdict: Verdict | None = None, later: Sequence[str] = ()) -> tuple[Verdict, list[bytes],
                                                                                  cp.Checkpoint | None]:
    """The leaves against the checkpoints: each signature, the latest's root,
    every earlier one's consistency with it.  Returns the verdict so far, the
    leaf hashes and the latest checkpoint the leaves make (the latest given,
    unless a leaf under it was changed: then the largest one the leaves
    still make, whose leaves stay provable, or None).  ``later``:
    checkpoints from outside the export (the rooms', an agent's), which a
    running bridge may have signed after it: one past the export's leaves is
    named in ``newer``, not a truncation (the export's own one would be)."""
    verdict = verdict or Verdict()
    verdict.leaves = len(leaves)
    for index, data in enumerate(leaves):
        try:
            audit_leaf.parse_leaf(data)
        except audit_leaf.LeafError as exc:
            verdict.problems.append(f"leaf {index}: does not parse ({exc})")
    hashes = [merkle.leaf_hash(data) for data in leaves]
    points: list[cp.Checkpoint] = []
    beyond: dict[int, bytes] = {}  # newer checkpoints' roots by size: two for one size are a fork
    for number, note in enumerate([*notes, *later]):
        try:
            point = cp.open_checkpoint(note, public, origin)
        except cp.NoteError as exc:
            verdict.problems.append(f"checkpoint {_first_lines(note)}: {exc}")
            continue
        if number >= len(notes) and point.size > len(hashes):
            if beyond.setdefault(point.size, point.root) != point.root:
                verdict.problems.append(f"two checkpoints of size {point.size} sign different roots (a fork of "
                                        "the log, past the export)")
            elif point.size not in verdict.newer:
                verdict.newer.append(point.size)
        else:
            points.append(point)
    if not points:
        verdict.problems.append("no checkpoint signed by the log's key was given")
        return verdict, hashes, None
    latest = max(points, key=lambda p: p.size)
    verdict.checkpoint_size = latest.size
    if latest.size > len(hashes):
        verdict.problems.append(f"checkpoint of size {latest.size}: the export holds only {len(hashes)} leaves "
                                "(truncated)")
        verdict.truncated = True
        return verdict, hashes, None
    tree = merkle.Tree(hashes[:latest.size])
    leaves_hold = tree.root(latest.size) == latest.root
    seen: dict[int, bytes] = {latest.size: latest.root}
    # Where the leaves stop making the signed trees: the largest checkpoint
    # they still make, and the smallest they don't (the changed leaf is between).
    made, unmade = 0, latest.size
    for point in points:
        if point.size == latest.size:
            if point.root != latest.root:
                verdict.problems.append(f"two checkpoints of size {point.size} sign different roots")
            continue
        if seen.get(point.size, point.root) != point.root:
            verdict.problems.append(f"two checkpoints of size {point.size} sign different roots")
        seen[point.size] = point.root
        verdict.earlier_checkpoints += 1
        if point.size == 0:
            if point.root != merkle.EMPTY_ROOT:
                verdict.problems.append("checkpoint of size 0: its root is not the empty tree's")
            continue
        if not leaves_hold:
            # The exported leaves are not the latest tree: a proof made from
            # them would blame this checkpoint for the change.  Its own tree
            # is asked of them instead.
            if tree.root(point.size) == point.root:
                made = max(made, point.size)
            else:
                unmade = min(unmade, point.size)
            continue
        try:
            proof = tree.consistency_proof(point.size)
            # The proof is made from the exported leaves; it must bind the
            # earlier checkpoint's own root to the latest one's.
            merkle.verify_consistency(point.size, latest.size, point.root, latest.root, proof)
        except merkle.ProofError as exc:
            verdict.problems.append(f"checkpoint of size {point.size} is not consistent with the latest "
                                    f"(size {latest.size}): {exc}")
    if not leaves_hold:
        where = f"leaf {made}" if unmade - made == 1 else f"a leaf from {made} to {unmade - 1}"
        verdict.problems.append(f"checkpoint of size {latest.size}: the exported leaves do not make the tree it "
                                f"signs (a leaf was changed, dropped or added): {where} is not what the "
                                "checkpoints signed")
        return verdict, hashes, next((p for p in points if p.size == made), None) if made else None
    return verdict, hashes, latest


def read_answers(text: str) -> tuple[Any, list[str]]:
    """answers.json's document, and what its text says twice.  An object
    naming a key twice is JSON readers disagree on (Python's keeps the last
    value, others the first): a record that does says two things, and the
    log vouches for one of them at most.  ValueError when it is no JSON."""
    try:
        return strictjson.loads(text, unique_keys=True, utf8_only=False), []
    except strictjson.NotJson as exc:
        doc = strictjson.loads(text, utf8_only=False)  # (raises when the text is wrong some other way)
        return doc, [f"answers.json: {exc}: readers disagree on which value it holds"]


def verify_set(doc: dict[str, Any], leaves: Sequence[bytes], notes: Sequence[str], origin: str,
               public: bytes, questions: Any = None, later: Sequence[str] = ()) -> Verdict:
    """Every record of ``answers.json`` against its leaf, under the latest
    checkpoint.  ``questions``: the set's questions.json, when there is one:
    which questions need a quorum, whose records must be tallies."""
    verdict, hashes, vouching = verify_log(leaves, notes, origin, public, later=later)
    quorums = quorum_questions(questions)
    listed = listed_questions(questions)
    signed = None if verdict.truncated else verdict.checkpoint_size
    tree = merkle.Tree(hashes[:vouching.size]) if vouching is not None else None
    answers = doc.get("answers") if isinstance(doc, dict) else None
    if not isinstance(answers, dict):
        verdict.problems.append("answers.json has no answers object")
        return verdict
    if not isinstance(doc.get("set"), str):
        verdict.problems.append(f"answers.json names no set (its set is {_shown(doc.get('set'))})")
        return verdict
    # Only what a checkpoint covers speaks for or against a record: a leaf
    # appended past the latest (a withdrawal, say) is anyone's writing.
    logged = _Logged(leaves[:signed] if signed is not None else leaves)
    verdict.log_began_ms = _first_ts(leaves)
    for qid, record in sorted(answers.items()):
        if not isinstance(record, dict):
            verdict.problems.append(f"record {qid!r}: not an object")
            continue
        source = record.get("source") if isinstance(record.get("source"), dict) else {}
        receipt = record.get("receipt")
        if receipt is None and record.get("state") == "expired" and source.get("how") == "expiry":
            # Expired with no answer at all: the log's own leaf for the expiry speaks for it.
            verdict.checked_records += 1
            verdict.problems.extend(_tally_problems(f"record {qid!r}", qid, record, doc, logged))
            continue
        # A vote's leaf hashes what one person's answer would: a pending
        # approval rewritten as one answer matched its leaf.  The question
        # says it needs a quorum, so a pick it records is a decision, a tally
        # whatever the record says (a "not sure" alone is no vote: one answer).
        outcome = logged.latest_outcome((doc.get("set"), qid))
        standing = logged.standing().get((doc.get("set"), qid))
        # The log's own word that the answer the record stands on was a vote:
        # its leaf carries the quorum its question was posted with (leaves
        # from before that field say nothing, and questions.json is asked).
        voted = asked_a_quorum(logged.leaf(_receipt_index(receipt)))
        # "pending" is an approval's state only for a question with a quorum,
        # or, where neither the log nor questions.json says, when the answer
        # the log says stands is one of its votes: otherwise it hides that answer.
        hides = record.get("state") == "pending" and not asked_a_quorum(logged.leaf(standing)) \
            and not pending_is_tally(qid, record, quorums if qid in listed else None, logged.leaf(standing))
        if hides and standing is not None and receipt is not None:
            verdict.problems.append(
                f"record {qid!r}: the record says pending, and the log's answer that stands (leaf {standing}) "
                + ("answers a question with no quorum" if qid in listed else "is none of the votes it lists"))
        # A decision or an expiry the log holds is an approval's: its record is
        # a tally, whatever it says (an expired approval is never consent, so
        # "answered" on its one vote's receipt is the expiry rewritten).
        tally = (is_tally(record) and not hides) or ((qid in quorums or voted) and record.get("state") == "answered") \
            or outcome_makes_tally(qid, record, outcome, logged.leaf(outcome[2]) if outcome else None)
        stands = None if tally else standing
        if receipt is None:
            if outcome is not None and not (record.get("state") == "expired" and source.get("how") == "expiry"):
                # The log decided or expired the question: a record with no
                # receipt (whoever it says wrote it) is not that outcome.
                verdict.problems.append(f"record {qid!r}: no receipt, where the log's latest word on the question "
                                        f"is its {'decision' if outcome[0] == 'decided' else 'expiry'} "
                                        f"(leaf {outcome[2]})")
            elif standing is not None:
                # Whoever wrote it (or a writer's name taken off), the log
                # holds an answer that stands: the record is not what it says
                # (a tally's too: the bridge writes one with its latest vote's receipt).
                verdict.problems.append(f"record {qid!r}: no receipt, where the log's answer that stands is "
                                        f"leaf {standing}")
            elif source.get("via") == "matrix" and record.get("state") != "note_only":
                # (Notes kept before any pick vouch for no answer: they carry no receipt.)
                if _before(source.get("ts"), verdict.log_began_ms) and not logged.mentions((doc.get("set"), qid)):
                    # Answered before the log's first leaf, and the log holds
                    # nothing of this question: the bridge ran without the log
                    # then (an upgrade, audit.enabled off at first).  (Its time
                    # is the record's own word: the log vouches for nothing
                    # it never saw, and says so.)
                    verdict.before_the_log.append(qid)
                else:
                    verdict.problems.append(f"record {qid!r}: written by the bridge but carries no receipt")
            continue  # another writer's record: the log does not speak for it
        verdict.checked_records += 1
        verdict.problems.extend(_record_problems(qid, record, receipt, source, doc, leaves, hashes, signed,
                                                 vouching, origin, tree, logged, tally))
        index = receipt.get("index") if isinstance(receipt, dict) else None
        if not tally and index in logged.withdrawn:
            verdict.problems.append(f"record {qid!r} (leaf {index}): the log took this answer back later "
                                    "(withdrawn)")
        elif stands is not None and isinstance(index, int) and index != stands and index < len(leaves):
            verdict.problems.append(f"record {qid!r} (leaf {index}): the log's answer that stands is leaf {stands} "
                                    "(a later answer replaced this one, or it was withdrawn)")
    # A record taken out of answers.json (a veto, an answer someone would
    # rather nobody acted on) is named too: the log holds an answer that
    # stands for it, and the bridge drops a record only with its withdrawal.
    for (set_id, qid), stands in sorted(logged.standing().items(), key=lambda item: str(item[0])):
        if set_id == doc.get("set") and qid not in answers:
            verdict.problems.append(f"question {qid!r}: the log's answer that stands is leaf {stands}, but "
                                    "answers.json has no record of it")
    for (set_id, qid), (last, _sha256, index, _rev) in sorted(logged.outcomes().items(), key=lambda item: str(item[0])):
        if set_id == doc.get("set") and qid not in answers and (set_id, qid) not in logged.standing():
            verdict.problems.append(f"question {qid!r}: the log's latest word on it is its "
                                    f"{'decision' if last == 'decided' else 'expiry'} (leaf {index}), but "
                                    "answers.json has no record of it")
    return verdict


def _first_ts(leaves: Sequence[bytes]) -> int | None:
    """When the log began: its first leaf's ``ts`` (None for an empty log)."""
    if not leaves:
        return None
    try:
        ts = json.loads(leaves[0]).get("ts")
    except (ValueError, AttributeError, RecursionError):  # (the leaf itself is named as not parsing)
        return None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def _before(ts: Any, began_ms: int | None) -> bool:
    if not isinstance(ts, int) or isinstance(ts, bool):
        return False
    return began_ms is None or ts < began_ms


class _Logged:
    """The log's accepted answers by event id and by who answered, and the
    latest approval outcome it records for each question: what an approval's
    tally is checked against (read once, when a set has a tally)."""

    def __init__(self, leaves: Sequence[bytes]):
        self._leaves = leaves
        self._parsed: list[tuple[int, dict[str, Any]]] | None = None
        self._accepted: dict[str, dict[str, Any]] | None = None
        self._standing: dict[tuple[Any, Any], int] | None = None
        self.withdrawn: set[int] = set()  # accepted answers the log took back later (``standing``)
        # (set, question id) -> the log's latest word on its approval outcome:
        # (decided or expired, the hash of the decision it logged (None from
        # a bridge that logged none), its leaf, the revision it concerned)
        self._outcomes: dict[tuple[Any, Any], tuple[str, Any, int, Any]] = {}
        # (set, question id, sender) -> the hashes of the answers the log accepted from them
        self.answered: dict[tuple[Any, Any, Any], set[Any]] = {}
        self._mentioned: set[tuple[Any, Any]] | None = None  # every (set, question) a leaf is about
        self._withdrawn_at: dict[tuple[Any, Any], int] = {}  # the latest withdrawal's leaf, per question
        self._answers_at: dict[tuple[Any, Any], list[tuple[int, int]]] = {}  # (leaf, time) of each accepted answer
        self._by_index: dict[int, dict[str, Any]] | None = None

    def standing(self) -> dict[tuple[Any, Any], int]:
        """(set, question id) -> the index of the accepted answer that stands,
        as the room's order says: the latest by time (then by leaf) that no
        withdrawal took back (an original's withdrawal takes its edits with
        it; an empty poll vote takes back its sender's votes up to its time; a
        set-aside answer never stood)."""
        if self._standing is None:
            taken_back: set[Any] = set()
            cleared: dict[tuple[Any, Any, Any], int] = {}  # (set, question, sender) -> latest empty vote's time
            answers: list[tuple[int, dict[str, Any]]] = []
            # A deadline that closed a question with its answer standing (no
            # quorum): what is taken back after it, in the room's order, leaves
            # that answer standing, as the room and the agent were told.
            # (Each revision's own deadline: a withdrawal of an answer to a
            # later revision is not after the earlier one's close.)
            closed_at = {(leaf.get("set"), _question_id(leaf), _question_rev(leaf)): _ts(leaf)
                         for _index, leaf in self.parsed()
                         if leaf.get("outcome") == "closed" and leaf.get("reason") == "expired"}
            for index, leaf in self.parsed():
                target = {"withdrawn": leaf.get("replaces"), "set_aside": leaf.get("event_id")}.get(
                    str(leaf.get("outcome")))
                if leaf.get("outcome") == "withdrawn" and _ts(leaf) >= closed_at.get(
                        (leaf.get("set"), _question_id(leaf), _question_rev(leaf)), 2 ** 63):
                    continue
                if leaf.get("outcome") == "accepted":
                    answers.append((index, leaf))
                elif isinstance(target, str):
                    taken_back.add(target)
                elif leaf.get("outcome") == "withdrawn" and leaf.get("via") == "poll":
                    key = (leaf.get("set"), _question_id(leaf), leaf.get("sender"))
                    cleared[key] = max(cleared.get(key, 0), _ts(leaf))
            best: dict[tuple[Any, Any], tuple[tuple[int, int], int]] = {}
            self.withdrawn = set()
            for index, leaf in answers:
                key = (leaf.get("set"), _question_id(leaf))
                if leaf.get("event_id") in taken_back or leaf.get("replaces") in taken_back or (
                        leaf.get("via") == "poll" and cleared.get((*key, leaf.get("sender")), -1) >= _ts(leaf)):
                    self.withdrawn.add(index)
                    continue
                if key not in best or (_ts(leaf), index) > best[key][0]:
                    best[key] = ((_ts(leaf), index), index)
            self._standing = {key: index for key, (_position, index) in best.items()}
        return self._standing

    def parsed(self) -> list[tuple[int, dict[str, Any]]]:
        """(index, leaf) of every leaf that parses, parsed once for every reading here."""
        if self._parsed is None:
            self._parsed = []
            for index, data in enumerate(self._leaves):
                try:
                    self._parsed.append((index, audit_leaf.parse_leaf(data)))
                except audit_leaf.LeafError:
                    continue  # named by the log's check
        return self._parsed

    def accepted(self) -> dict[str, dict[str, Any]]:
        if self._accepted is None:
            self._accepted = {}
            for _index, leaf in self.parsed():
                if leaf.get("outcome") == "accepted" and isinstance(leaf.get("event_id"), str):
                    self._accepted[leaf["event_id"]] = leaf
                    self.answered.setdefault((leaf.get("set"), _question_id(leaf), leaf.get("sender")),
                                             set()).add(leaf.get("answer_sha256"))
                    self._answers_at.setdefault((leaf.get("set"), _question_id(leaf)), []).append((_index, _ts(leaf)))
                elif leaf.get("outcome") in ("decided", "expired"):
                    self._outcomes[(leaf.get("set"), _question_id(leaf))] = (
                        leaf["outcome"], leaf.get("answer_sha256"), _index, _question_rev(leaf))
                elif leaf.get("outcome") == "withdrawn":
                    self._withdrawn_at[(leaf.get("set"), _question_id(leaf))] = _index
        return self._accepted

    def outcomes(self) -> dict[tuple[Any, Any], tuple[str, Any, int, Any]]:
        """(set, question id) -> the log's latest approval outcome: (decided or
        expired, its decision's hash, its leaf, its revision)."""
        self.accepted()
        return self._outcomes

    def latest_outcome(self, key: tuple[Any, Any]) -> tuple[str, Any, int, Any] | None:
        return self.outcomes().get(key)

    def mentions(self, key: tuple[Any, Any]) -> bool:
        """Whether any leaf is about the question (an answer, a refusal, a close)."""
        if self._mentioned is None:
            self._mentioned = {(leaf.get("set"), _question_id(leaf)) for _index, leaf in self.parsed()}
        return key in self._mentioned

    def leaf(self, index: int | None) -> dict[str, Any] | None:
        """Leaf ``index``, parsed (None when there is none, or it does not parse)."""
        if self._by_index is None:
            self._by_index = dict(self.parsed())
        return self._by_index.get(index) if isinstance(index, int) else None

    def undone_since(self, key: tuple[Any, Any], index: int) -> bool:
        """Whether something logged after leaf ``index`` may have undone the
        decision logged there: a vote taken back, or an answer the room
        places before the decision, read late (a voter's change of mind
        that came first: the votes never agreed)."""
        self.accepted()
        if self._withdrawn_at.get(key, -1) > index:
            return True
        # The decision's place in the room: its latest vote's time (the
        # decision's own leaf has the time the bridge logged it).
        answers = self._answers_at.get(key, ())
        decided_at = max((ts for at, ts in answers if at < index), default=None)
        return decided_at is not None and any(at > index and ts <= decided_at for at, ts in answers)


def _question_id(leaf: dict[str, Any]) -> Any:
    return leaf["question"].get("id") if isinstance(leaf.get("question"), dict) else None


def _question_rev(leaf: dict[str, Any]) -> Any:
    return leaf["question"].get("rev") if isinstance(leaf.get("question"), dict) else None


def _ts(leaf: dict[str, Any]) -> int:
    return leaf["ts"] if isinstance(leaf.get("ts"), int) else 0


def _questions_listed(questions: Any) -> list[dict[str, Any]]:
    """The questions a questions.json lists, each with an id (none without one)."""
    listed = questions.get("questions") if isinstance(questions, dict) else None
    return [q for q in listed if isinstance(q, dict) and isinstance(q.get("id"), str)] \
        if isinstance(listed, list) else []


def quorum_questions(questions: Any) -> set[str]:
    """The ids of the questions of a questions.json that need a quorum (PROTOCOL 2a)."""
    return {q["id"] for q in _questions_listed(questions) if isinstance(q.get("quorum"), dict)}


def listed_questions(questions: Any) -> set[str]:
    """The ids of the questions a questions.json lists (none without one):
    for these it says which need a quorum."""
    return {q["id"] for q in _questions_listed(questions)}


def asked_a_quorum(leaf: dict[str, Any] | None) -> bool:
    """Whether the leaf says its question was posted with a quorum (an
    approval's leaves carry it: ``audit_leaf.posted_quorum``)."""
    question = leaf.get("question") if leaf is not None else None
    return isinstance(question, dict) and isinstance(question.get("quorum"), dict)


def _receipt_index(receipt: Any) -> int | None:
    index = receipt.get("index") if isinstance(receipt, dict) else None
    return index if _whole(index) else None


def is_tally(record: dict[str, Any]) -> bool:
    """An approval's record (PROTOCOL 2a): its state and pick come from the
    votes it lists, not from one person's answer."""
    return isinstance(record.get("votes"), list) or record.get("state") in ("pending", "expired")


def pending_is_tally(qid: str, record: dict[str, Any], quorums: set[str] | None,
                     stands: dict[str, Any] | None) -> bool:
    """Whether a ``pending`` record can be an approval's tally.  ``quorums``:
    the questions that need one, when questions.json lists this question
    (None when it does not say): then only those.  Otherwise what the log
    says stands (``stands``: that leaf, None when nothing does) must fit a
    tally still open: that answer is one of the votes it lists, or a "not
    sure" (no vote, so none listed).  A pending record that lists none of
    it hides an answer the log says stands."""
    if quorums is not None:
        return qid in quorums
    if stands is None:
        return True
    votes = record.get("votes") if isinstance(record.get("votes"), list) else []
    if stands.get("event_id") in {vote.get("event_id") for vote in votes if isinstance(vote, dict)}:
        return True
    unsure = {"qid": qid, "state": "unsure", "choice": "unsure", "q_rev": record.get("q_rev")}
    if "subject" in record:
        unsure["subject"] = record["subject"]
    return stands.get("answer_sha256") == _sha256_or_none(unsure)


def outcome_makes_tally(qid: str, record: dict[str, Any], outcome: tuple[str, Any, int, Any] | None,
                        at: dict[str, Any] | None) -> bool:
    """Whether the log's latest approval outcome for the question
    (``_Logged.latest_outcome``; ``at``: its leaf) makes the record a tally
    whatever the record says: a decision, or an expiry, of the record's
    revision or a later one.  Not one of an earlier revision (asked again,
    maybe with no quorum, and answered so: ``q_rev`` is in the answer's
    hash, so a record can't claim a later one).  Not an expiry the log shows
    was of a question with no quorum (its hash names no ``required``, which
    every quorum's expiry names): an answer given before that deadline and
    read after it stands, and the bridge logs no outcome for that."""
    if outcome is None:
        return False
    last, logged_sha256, _index, rev = outcome
    if _whole(record.get("q_rev", 1)) and _whole(rev) and record.get("q_rev", 1) > rev:
        return False
    return not (last == "expired" and logged_sha256 is not None
                and logged_sha256 in _quorumless_expiries(qid, rev, record, at))


def _quorumless_expiries(qid: str, rev: Any, record: dict[str, Any], at: dict[str, Any] | None) -> set[str | None]:
    """The hashes an expiry of a question with no quorum logs (OUTCOME_FIELDS
    of ``approval_record._expired`` with no votes): its id, state, revision
    and, on a subject-bound question, the subject as the answer or the
    question carried it."""
    bound = at.get("subject") if at is not None and isinstance(at.get("subject"), dict) else {}
    subjects = [None, record.get("subject"), {"id": bound.get("id"), "digest": bound.get("digest")}]
    out = set()
    for subject in subjects:
        fields = {"qid": qid, "state": "expired", "q_rev": rev if rev is not None else 1}
        if subject is not None:
            fields["subject"] = subject
        out.add(_sha256_or_none(fields, "expired"))
    out.discard(None)
    return out


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tally_problems(where: str, qid: str, record: dict[str, Any], doc: dict[str, Any], logged: _Logged) -> list[str]:
    """Each vote the record lists is an accepted answer in the log, by that
    sender, to this question, with that choice; the deciders' votes pick the
    record's choice; a decision or an expiry is the log's latest word on the
    question's outcome."""
    accepted = logged.accepted()
    problems = []
    votes = record.get("votes") if isinstance(record.get("votes"), list) else []
    choice_of: dict[str, Any] = {}
    for vote in votes:
        if not isinstance(vote, dict) or not isinstance(vote.get("event_id"), str):
            problems.append(f"{where}: a vote is malformed")
            continue
        said = f"{where}: the vote {vote['event_id']}"
        leaf = accepted.get(vote["event_id"])
        question = leaf.get("question") if leaf and isinstance(leaf.get("question"), dict) else {}
        if leaf is None:
            problems.append(f"{said} is not an accepted answer in the log")
        elif leaf.get("sender") != vote.get("sender"):
            problems.append(f"{said} was sent by {leaf.get('sender')!r}, not {vote.get('sender')!r}")
        elif leaf.get("set") != doc.get("set") or question.get("id") != qid:
            problems.append(f"{said} answers {leaf.get('set')!r}/{question.get('id')!r}, not this question")
        elif leaf.get("answer_sha256") != _vote_sha256(qid, vote, record):
            problems.append(f"{said}: its choice {vote.get('choice')!r} differs from what the log recorded")
        else:
            choice_of[str(vote.get("sender"))] = vote.get("choice")
    state = record.get("state")
    # The outcome can change after it was logged (an earlier event read late),
    # and the bridge logs each change: the log's latest word is the record's.
    outcome = logged.latest_outcome((doc.get("set"), qid))
    last, logged_sha256, at, rev = outcome or (None, None, None, None)
    if state == "answered" and last == "expired" and outcome_makes_tally(qid, record, outcome, logged.leaf(at)):
        # Its votes decide nothing now, whoever the record says decided it.
        problems.append(f"{where}: the record says answered, and the log's latest word on the question is its "
                        f"expiry (leaf {at}): an expired approval is never consent")
        return problems
    if state == "answered" and not (isinstance(record.get("decided_by"), list) and record["decided_by"]):
        problems.append(f"{where}: the record says decided, and names no one who decided it")
    elif state == "answered":
        decided = _vote_sha256(qid, {"choice": record.get("choice")}, record)
        for sender in record["decided_by"]:
            if not isinstance(sender, str):
                problems.append(f"{where}: decided_by names {_shown(sender)}, not a Matrix user id")
                continue
            if sender in choice_of and choice_of[sender] == record.get("choice"):
                continue
            # A decider may change or withdraw their vote after the decision
            # (it stands): the log must still hold their vote for the choice.
            if decided in logged.answered.get((doc.get("set"), qid, sender), ()):
                continue
            if sender not in choice_of:
                problems.append(f"{where}: {sender} decided it, and the log holds no vote of theirs it lists")
            else:
                problems.append(f"{where}: {sender} decided it but voted {choice_of[sender]!r}, "
                                f"not {record.get('choice')!r}")
    if state == "pending" and last == "decided" and rev == record.get("q_rev") \
            and not logged.undone_since((doc.get("set"), qid), at):
        # Undecided again only when a vote was taken back after the decision,
        # or one read late changed it (an undo), or for a revision after the one decided.
        problems.append(f"{where}: the record says pending, and the log's latest word on the question is its "
                        f"decision (leaf {at})")
    elif state == "expired" and last != "expired":
        problems.append(f"{where}: the record says expired, and the log records no expiry of the question"
                        + (" since its decision" if last == "decided" else ""))
    elif state == "answered" and record.get("decided_by") and last != "decided":
        problems.append(f"{where}: the record says decided, and the log records no decision of the question"
                        + (" since its expiry" if last == "expired" else ""))
    elif last == {"answered": "decided", "expired": "expired"}.get(str(state)) and logged_sha256 is not None \
            and logged_sha256 != _sha256_or_none(record, last):
        fields = ", ".join(sorted(audit_leaf.answer_fields(record, last)))
        problems.append(f"{where}: the record's {'decision' if last == 'decided' else 'expiry'} ({fields}) "
                        f"differs from what the log's latest {last} leaf recorded")
    return problems


def _sha256_or_none(record: dict[str, Any], outcome: str = "accepted") -> str | None:
    try:
        return audit_leaf.answer_sha256(record, outcome)
    except (ValueError, RecursionError):
        return None  # nothing JCS can write: it differs from any hash logged


def _vote_sha256(qid: str, vote: dict[str, Any], record: dict[str, Any]) -> str | None:
    # A vote's own record held these answer fields (to_record): what its leaf hashed.
    fields = {"qid": qid, "state": "answered", "choice": vote.get("choice"), "q_rev": record.get("q_rev")}
    if "subject" in record:
        fields["subject"] = record["subject"]
    return _sha256_or_none(fields)


def _record_problems(qid: str, record: dict[str, Any], receipt: Any, source: dict[str, Any], doc: dict[str, Any],
                     leaves: Sequence[bytes], hashes: list[bytes], signed: int | None,
                     vouching: cp.Checkpoint | None, origin: str, tree: merkle.Tree | None, logged: _Logged,
                     tally: bool) -> list[str]:
    """What is wrong with one record: its receipt against its leaf, and the
    leaf's inclusion under the largest checkpoint the leaves make
    (``vouching``); ``signed``: the latest checkpoint's size."""
    if not isinstance(receipt, dict) or not isinstance(receipt.get("index"), int) or isinstance(
            receipt.get("index"), bool) or not isinstance(receipt.get("leaf"), str):
        return [f"record {qid!r}: the receipt is malformed"]
    index = receipt["index"]
    where = f"record {qid!r} (leaf {index})"
    if receipt.get("log") not in (None, origin):
        return [f"{where}: the receipt is of the log {receipt.get('log')!r}, not {origin!r}"]
    if index < 0:
        return [f"{where}: the receipt points before the tree"]
    if index >= len(leaves):
        # A record the bridge wrote after the export (it goes on answering),
        # or one whose receipt names no leaf at all: nothing here vouches for it.
        return [f"{where}: past the {len(leaves)} leaves of this export (answered after it was taken, or "
                "never logged); export again to check it"]
    problems = []
    if hashes[index].hex() != receipt["leaf"]:
        problems.append(f"{where}: the receipt's leaf hash differs from the log's leaf")
    try:
        leaf = audit_leaf.parse_leaf(leaves[index])
    except audit_leaf.LeafError:
        return problems  # already named by the log's check
    if leaf.get("outcome") != "accepted":
        problems.append(f"{where}: the leaf records {leaf.get('outcome')!r}, not an accepted answer")
    # Where the answer came from is part of what the log vouches for: who sent it, in which room, when.
    for key, words in (("event_id", "answer event"), ("sender", "sender"), ("room_id", "room"), ("ts", "time")):
        if leaf.get(key) != source.get(key):
            problems.append(f"{where}: the record's {words} {source.get(key)!r} differs from the leaf's "
                            f"{leaf.get(key)!r}")
    if leaf.get("set") != doc.get("set"):
        problems.append(f"{where}: the leaf is of the set {leaf.get('set')!r}, not {doc.get('set')!r}")
    question = leaf.get("question") if isinstance(leaf.get("question"), dict) else {}
    if question.get("id") != qid:
        problems.append(f"{where}: the leaf answers question {question.get('id')!r}, not {qid!r}")
    if tally:
        # The receipt names the latest vote (its leaf is checked above); the
        # state and pick are the tally of every vote listed, each checked.
        problems.extend(_tally_problems(where, qid, record, doc, logged))
    else:
        problems.extend(_answer_problems(where, record, leaf))
    if signed is None:
        return problems
    if index >= signed:
        problems.append(f"{where}: not yet under the latest checkpoint (size {signed}): logged after it, "
                        "and signed by none given (the bridge signs every audit.checkpoint_every; check again then)")
        return problems
    if vouching is None or tree is None or index >= vouching.size:
        # Among the leaves that no longer make what was signed (named once,
        # above): no checkpoint given can show this one's leaf as logged.
        problems.append(f"{where}: no checkpoint given vouches for it: the leaves from "
                        f"{vouching.size if vouching else 0} on are not what the checkpoints signed")
        return problems
    try:
        merkle.verify_inclusion(index, vouching.size, hashes[index], tree.inclusion_proof(index), vouching.root)
    except merkle.ProofError as exc:
        problems.append(f"{where}: not included under the checkpoint of size {vouching.size}: {exc}")
    return problems


def _answer_problems(where: str, record: dict[str, Any], leaf: dict[str, Any]) -> list[str]:
    fields = ", ".join(sorted(audit_leaf.answer_fields(record)))
    try:
        wanted = audit_leaf.answer_sha256(record)
    except (ValueError, RecursionError) as exc:
        # A value JCS can't express (an integer past 2^53, a lone surrogate,
        # NaN): the bridge never writes one, so the record was changed.
        return [f"{where}: the record's answer ({fields}) can't be canonicalised ({exc}), so it is not what the "
                "log recorded"]
    if leaf.get("answer_sha256") != wanted:
        return [f"{where}: the record's answer ({fields}) differs from what the log recorded"]
    return []


def _first_lines(note: str) -> str:
    head = note.split("\n")[:2]
    return " ".join(head)[:80] or "(empty)"


def _shown(value: Any) -> str:
    """What a JSON value is, in words (never its text: it may be huge, or deep)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), "something else")
