"""answers.json as a pure document: building, states, parsing, dumping."""

from __future__ import annotations

import json

import pytest

from bridge.answers import document
from bridge.answers.document import AnswersError, UnsupportedVersion

NOW = "2026-11-30T12:00:00.000Z"
LATER = "2026-11-30T12:05:00.000Z"


def rec(qid: str = "arrow", **fields) -> dict:
    return {"qid": qid, "q_rev": 1, **fields}


# --- empty / put / drop -----------------------------------------------------


def test_empty_document():
    assert document.empty("takes") == {"askwright": 1, "set": "takes", "rev": 0, "updated": None, "answers": {}}


def test_put_record_bumps_rev_and_fills_state_rev_updated():
    doc = document.empty("takes")
    new = document.put_record(doc, rec(choice="t2", label="Take 2", side="left"), NOW)
    assert new["rev"] == 1 and new["updated"] == NOW
    record = new["answers"]["arrow"]
    assert record["state"] == "answered"
    assert record["rev"] == 1
    assert record["updated"] == NOW
    # the input document is untouched
    assert doc == document.empty("takes")


def test_put_record_replaces_and_counts_answers():
    doc = document.put_record(document.empty("takes"), rec(choice="t2"), NOW)
    doc = document.put_record(doc, rec(choice="t5"), LATER)
    assert doc["rev"] == 2
    assert doc["answers"]["arrow"]["choice"] == "t5"
    assert doc["answers"]["arrow"]["rev"] == 2
    assert doc["answers"]["arrow"]["updated"] == LATER


def test_put_record_keeps_a_given_rev():
    doc = document.put_record(document.empty("takes"), rec(choice="t2", rev=5), NOW)
    assert doc["answers"]["arrow"]["rev"] == 5


def test_put_record_rounds_timecodes_to_hundredths():
    doc = document.put_record(document.empty("s"), rec(note="n", timecodes=[{"t": 1.23456, "text": "x"}, {"t": 2, "text": ""}]), NOW)
    assert doc["answers"]["arrow"]["timecodes"] == [{"t": 1.23, "text": "x"}, {"t": 2, "text": ""}]


def test_drop_record():
    doc = document.put_record(document.empty("takes"), rec(choice="t2"), NOW)
    dropped = document.drop_record(doc, "arrow", LATER)
    assert dropped["answers"] == {}
    assert dropped["rev"] == 2 and dropped["updated"] == LATER
    assert "arrow" in doc["answers"]


def test_drop_missing_record_changes_nothing():
    doc = document.empty("takes")
    assert document.drop_record(doc, "nope", NOW) is doc


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"q_rev": 1, "choice": "a"}, "qid"),
        (rec(), "no pick"),
        (rec(note="   "), "no pick"),
        (rec(choice="a", text="b"), "more than one pick"),
        (rec(choice="a", state="unsure"), "state"),
        (rec(choice="a", q_rev=0), "q_rev"),
        (rec(choice="a", q_rev=True), "q_rev"),
        (rec(choices=[]), "choices"),
        (rec(order=["a", 1]), "order"),
        (rec(text="t", label="x"), "label belongs with a choice"),
        (rec(note="n", attachments=["/etc/passwd"]), "attachments"),
        (rec(note="n", attachments=["../outside.png"]), "attachments"),
        (rec(note="n", timecodes=[{"t": -1, "text": ""}]), "timecodes"),
        (rec(choice="a", matched_guess="yes"), "matched_guess"),
        (rec(note="n" * 20_001), "20000 characters"),
        (rec(note="n", attachments=[f"attachments/{i}.png" for i in range(21)]), "attachments"),
        (rec(note="n", timecodes=[{"t": i, "text": ""} for i in range(51)]), "timecodes"),
        (rec(note="n", timecodes=[{"t": 1, "text": "x" * 501}]), "500"),
    ],
)
def test_put_record_refuses_bad_records(bad, match):
    with pytest.raises(AnswersError, match=match):
        document.put_record(document.empty("s"), bad, NOW)


def test_put_record_needs_now():
    with pytest.raises(AnswersError, match="now"):
        document.put_record(document.empty("s"), rec(choice="a"), "")


# --- states -----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, state",
    [
        ({"choice": "t2"}, "answered"),
        ({"choice": "other", "note": "a third take"}, "answered"),
        ({"choices": ["a", "c"]}, "answered"),
        ({"order": ["b", "a"]}, "answered"),
        ({"text": "make it blue"}, "answered"),
        ({"choice": "unsure"}, "unsure"),
        ({"choice": "unsure", "note": "ask Ana"}, "unsure"),
        ({"note": "only a note"}, "note_only"),
        ({"attachments": ["attachments/a.png"]}, "note_only"),
        ({"timecodes": [{"t": 1.0, "text": "here"}]}, "note_only"),
    ],
)
def test_state_of(fields, state):
    assert document.state_of(rec(**fields)) == state


def test_state_of_nothing_is_an_error():
    with pytest.raises(AnswersError):
        document.state_of(rec(note=""))


# --- dumps / parse ----------------------------------------------------------


def test_dumps_is_stable_ordered_utf8():
    doc = document.empty("takes")
    doc = document.put_record(doc, rec("zeta", text="ça va"), NOW)
    doc = document.put_record(doc, {"q_rev": 2, "note": "n", "qid": "alpha", "source": {"via": "matrix"}}, NOW)
    data = document.dumps(doc)
    assert data.endswith(b"\n")
    assert "ça va".encode() in data  # not \u escaped
    parsed = json.loads(data)
    assert list(parsed) == ["askwright", "set", "rev", "updated", "answers"]
    assert list(parsed["answers"]) == ["alpha", "zeta"]
    assert list(parsed["answers"]["alpha"]) == ["qid", "state", "note", "q_rev", "rev", "updated", "source"]
    assert document.dumps(document.parse(data)) == data
    assert b'\n  "set": "takes"' in data  # indented


def test_dumps_refuses_nan():
    doc = document.empty("s")
    doc["answers"]["a"] = {"qid": "a", "state": "note_only", "note": "n", "timecodes": [{"t": float("nan"), "text": ""}], "q_rev": 1, "rev": 1, "updated": NOW}
    with pytest.raises(ValueError):
        document.dumps(doc)


def test_parse_round_trip_of_architecture_example():
    example = {
        "askwright": 1,
        "set": "takes",
        "rev": 7,
        "updated": NOW,
        "answers": {
            "arrow": {
                "qid": "arrow",
                "state": "answered",
                "choice": "t2",
                "label": "Take 2",
                "side": "left",
                "matched_guess": False,
                "guess_revealed_before_pick": False,
                "note": "keep the shaft thin",
                "attachments": ["attachments/arrow-1.png"],
                "timecodes": [{"t": 1.4, "text": ""}],
                "q_rev": 1,
                "rev": 1,
                "updated": NOW,
                "source": {"via": "matrix", "how": "reply", "room_id": "!r", "event_id": "$e", "sender": "@p:hs", "ts": 1764500000000},
            }
        },
    }
    data = json.dumps(example).encode()
    assert document.parse(data) == example


def test_parse_keeps_unknown_fields():
    doc = document.empty("s")
    doc["extra"] = {"x": 1}
    doc = document.put_record(doc, rec("q", choice="a", future_field=3), NOW)
    parsed = document.parse(document.dumps(doc))
    assert parsed["extra"] == {"x": 1}
    assert parsed["answers"]["q"]["future_field"] == 3


def test_parse_refuses_a_future_version_clearly():
    data = json.dumps({"askwright": 2, "set": "s", "rev": 0, "updated": None, "answers": {}}).encode()
    with pytest.raises(UnsupportedVersion, match="version 2"):
        document.parse(data)
    assert issubclass(UnsupportedVersion, AnswersError)


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{", "not JSON"),
        (b'{"askwright": 1, "set": "s", "rev": NaN, "updated": null, "answers": {}}', "NaN"),
        (b"[]", "object"),
        (b'{"set": "s", "rev": 0, "answers": {}}', "askwright"),
        (b'{"askwright": "1", "set": "s", "rev": 0, "answers": {}}', "askwright"),
        (b'{"askwright": 0, "set": "s", "rev": 0, "answers": {}}', "askwright"),
        (b'{"askwright": 1, "set": "", "rev": 0, "answers": {}}', "set"),
        (b'{"askwright": 1, "set": "s", "rev": -1, "answers": {}}', "rev"),
        (b'{"askwright": 1, "set": "s", "rev": 0, "updated": 5, "answers": {}}', "updated"),
        (b'{"askwright": 1, "set": "s", "rev": 0, "answers": []}', "answers"),
        (b'{"askwright": 1, "set": "s", "rev": 1, "answers": {"a": 1}}', "answers.a"),
        (b'{"askwright": 1, "set": "s", "rev": 1, "answers": {"a": {"qid": "b", "state": "answered", "choice": "x", "q_rev": 1, "rev": 1, "updated": "t"}}}', "qid"),
        (b'{"askwright": 1, "set": "s", "rev": 1, "answers": {"a": {"qid": "a", "state": "bogus", "choice": "x", "q_rev": 1, "rev": 1, "updated": "t"}}}', "state"),
        (b'{"askwright": 1, "set": "s", "rev": 1, "answers": {"a": {"qid": "a", "state": "note_only", "choice": "x", "q_rev": 1, "rev": 1, "updated": "t"}}}', "does not match"),
        (b'{"askwright": 1, "set": "s", "rev": 1, "answers": {"a": {"qid": "a", "state": "answered", "choice": "x", "q_rev": 1, "rev": 1}}}', "updated"),
    ],
)
def test_parse_refuses_bad_files(data, match):
    with pytest.raises(AnswersError, match=match):
        document.parse(data)


def test_parse_accepts_records_over_the_write_limits():
    # Another writer's file over a limit is still readable: hiding the
    # person's answers would be worse than a long note.
    doc = document.empty("s")
    doc["rev"] = 1
    doc["answers"]["a"] = {"qid": "a", "state": "note_only", "note": "n" * 30_000, "q_rev": 1, "rev": 1, "updated": NOW}
    assert document.parse(json.dumps(doc).encode())["answers"]["a"]["note"] == "n" * 30_000


# ---------------------------------------------------------------- other writers


def _other(rev: int) -> dict:
    return {"qid": "arrow", "state": "answered", "choice": "t5", "q_rev": 1, "rev": rev, "updated": "t",
            "source": {"via": "page"}}


def _bridge(rev: int, choice: str = "t2") -> dict:
    return {"qid": "arrow", "state": "answered", "choice": choice, "q_rev": 1, "rev": rev, "updated": "t",
            "source": {"via": "matrix", "event_id": "$e"}}


def test_a_newer_record_another_writer_put_there_is_kept():
    from bridge.answers.document import empty, mirror_records, put_records
    doc = put_records(empty("takes"), {"arrow": _other(3)}, "2026-01-01T00:00:00Z")
    kept_doc, kept = mirror_records(doc, {"arrow": _bridge(2)}, "2026-01-01T00:00:01Z")
    assert kept_doc["answers"]["arrow"]["choice"] == "t5" and kept and "page" in kept[0]
    dropped_doc, kept = mirror_records(doc, {"arrow": None}, "2026-01-01T00:00:01Z")
    assert "arrow" in dropped_doc["answers"] and kept


def test_the_bridges_newer_record_replaces_another_writers_older_one():
    from bridge.answers.document import empty, mirror_records, put_records
    doc = put_records(empty("takes"), {"arrow": _other(1)}, "2026-01-01T00:00:00Z")
    new_doc, kept = mirror_records(doc, {"arrow": _bridge(2)}, "2026-01-01T00:00:01Z")
    assert new_doc["answers"]["arrow"]["choice"] == "t2" and kept == []
    own = put_records(empty("takes"), {"arrow": _bridge(5)}, "2026-01-01T00:00:00Z")
    again, kept = mirror_records(own, {"arrow": _bridge(1, "t5")}, "2026-01-01T00:00:01Z")
    assert again["answers"]["arrow"]["choice"] == "t5" and kept == []  # its own record: the log decides
