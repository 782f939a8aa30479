"""The word back on an answer: picks in the person's words, HTML that Element
does not linkify into pills."""

from __future__ import annotations

from bridge.protocol.outcome import describe_record, notice, recorded_notice, refused_notice

LABELS = {"login": "Crash on login", "sync": "Crash when sync resumes", "upload": "Crash on uploads"}


def test_rank_and_multi_are_described_by_label() -> None:
    assert describe_record({"state": "answered", "order": ["login", "sync", "upload"]}, LABELS) == (
        "Crash on login > Crash when sync resumes > Crash on uploads"
    )
    assert describe_record({"state": "answered", "choices": ["sync", "gone"]}, LABELS) == "Crash when sync resumes, gone"
    # Without labels (an old caller) the ids are all there is.
    assert describe_record({"state": "answered", "order": ["login", "sync"]}) == "login > sync"


def test_recorded_notice_uses_the_labels() -> None:
    content = recorded_notice(answer_event_id="$a", question_event_id="$q", title="Crash fix order", via="reply",
                              record={"qid": "fixes", "state": "answered", "order": ["sync", "login", "upload"],
                                      "rev": 1, "q_rev": 1}, labels=LABELS)
    assert content["body"] == "Recorded for “Crash fix order”: Crash when sync resumes > Crash on login > Crash on uploads."


def test_notice_html_escapes_and_puts_ids_and_urls_in_code() -> None:
    content = recorded_notice(answer_event_id="$a", question_event_id="$q", title="Spot the <room> id", via="reply",
                              record={"qid": "room", "state": "answered", "choice": "a", "label": "!xKqwUzWhNdAyYhPLcE:example.org",
                                      "rev": 1})
    assert content["format"] == "org.matrix.custom.html"
    assert content["formatted_body"] == (
        "Recorded for “Spot the &lt;room&gt; id”: <code>!xKqwUzWhNdAyYhPLcE:example.org</code>."
    )
    refused = refused_notice(answer_event_id="$a", question_event_id="$q", qid="q", layer="recorded",
                             reason="option_not_offered", message="“https://evil.example/x” is not an option", via="reply")
    assert refused["formatted_body"] == "Not recorded: “<code>https://evil.example/x</code>” is not an option."
    assert notice("@alice:example.org & @room", "$a", {})["formatted_body"] == "<code>@alice:example.org</code> &amp; @room"


NUMBERS = {"login": 1, "sync": 2, "upload": 3, "unsure": 4, "other": 5}


def test_a_reply_or_an_edit_is_named_by_the_numbers_read() -> None:
    # Element quotes the person's message as its latest edit: under a quoted
    # "3" the earlier word back says it read option 2, not that it misread.
    def said(record: dict, via: str = "reply") -> str:
        return recorded_notice(answer_event_id="$a", question_event_id="$q", title="Crashes", via=via,
                               record={"qid": "c", "state": "answered", "rev": 1, **record}, labels=LABELS,
                               numbers=NUMBERS)["body"]

    assert said({"choice": "sync", "label": "x"}) == "Recorded for “Crashes”: Crash when sync resumes (option 2)."
    assert said({"choice": "upload", "label": "x"}, via="edit") == (
        "Changed your answer to “Crashes”: now Crash on uploads (option 3).")
    assert said({"choices": ["login", "upload"]}) == "Recorded for “Crashes”: Crash on login, Crash on uploads (options 1, 3)."
    assert said({"order": ["upload", "login", "sync"]}) == (
        "Recorded for “Crashes”: Crash on uploads > Crash on login > Crash when sync resumes (order 3, 1, 2).")
    assert said({"choice": "sync", "label": "x", "note": "flaky"}) == (
        "Recorded for “Crashes”: Crash when sync resumes (option 2, with a note).")
    # A built-in or a text was not a number; a vote or a reaction has no quote above its word back.
    assert said({"choice": "other", "label": "Something else", "text": "disk"}) == "Recorded for “Crashes”: Something else."
    assert said({"text": "disk"}) == "Recorded for “Crashes”: “disk”."
    assert said({"choice": "sync", "label": "x"}, via="poll") == "Recorded for “Crashes”: Crash when sync resumes."
