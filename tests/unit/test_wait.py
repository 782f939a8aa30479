"""``askwright-bridge wait``: returns as soon as the answer is written, prints what read prints, exit 3 on timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge.answers.document import drop_record, put_record
from bridge.answers.file import AnswersFile
from bridge.cli import main
from bridge.commands.wait import UNTIL_ALL, UNTIL_ANSWERED, arrived, as_read

NOW = "2026-11-30T12:00:00.000Z"


def text_q(qid: str, rev: int = 1, status: str = "open") -> dict:
    return {"id": qid, "kind": "text", "title": qid.title(), "question": f"What about {qid}?", "rev": rev,
            "status": status}


@pytest.fixture
def set_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "release"
    folder.mkdir()
    write_questions(folder, [text_q("a"), text_q("b"), text_q("gone", status="closed")])
    return folder


def write_questions(folder: Path, questions: list[dict]) -> None:
    (folder / "questions.json").write_text(json.dumps({"askwright": 1, "id": "release", "title": "T",
                                                       "questions": questions}))


def answer(folder: Path, record: dict) -> None:
    AnswersFile(folder, "release").update(lambda doc, now: put_record(doc, record, now), NOW)


def later(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def read_output(folder: Path, *extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "bridge", "read", str(folder), *extra], capture_output=True,
                          text=True, check=True)
    return done.stdout


# -- the condition (pure) --------------------------------------------------------------


def entry(qid: str, state: str, status: str = "open", stale: bool | None = False) -> dict:
    return {"qid": qid, "state": state, "status": status, "stale": stale}


def view(*entries: dict) -> dict:
    return {"answers": list(entries)}


def test_a_named_question_needs_a_current_pick():
    assert arrived(view(entry("a", "answered")), "a", UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "unsure")), "a", UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "note_only")), "a", UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "unanswered")), "a", UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "answered", stale=True)), "a", UNTIL_ANSWERED)
    assert not arrived(view(entry("b", "answered")), "a", UNTIL_ANSWERED)
    # A named question counts even once closed: its answer is what was asked for.
    assert arrived(view(entry("a", "answered", status="closed")), "a", UNTIL_ANSWERED)
    # questions.json unreadable: stale unknown, the pick taken as it is.
    assert arrived(view(entry("a", "answered", status="unknown", stale=None)), "a", UNTIL_ANSWERED)


def test_without_a_question_any_open_question_with_a_pick_will_do():
    assert arrived(view(entry("a", "unanswered"), entry("b", "answered")), None, UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "unanswered"), entry("b", "unsure")), None, UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "answered", status="closed")), None, UNTIL_ANSWERED)
    # Answered in time, then closed by its deadline: the answer came while it was open.
    assert arrived(view({**entry("a", "answered", status="closed"), "closed_at": "2026-01-01T02:00:00Z"}),
                   None, UNTIL_ANSWERED)
    assert not arrived(view(entry("a", "answered", status="removed", stale=None)), None, UNTIL_ANSWERED)
    assert not arrived(view(), None, UNTIL_ANSWERED)


def test_until_all_needs_every_open_question():
    assert arrived(view(entry("a", "answered"), entry("b", "answered"), entry("c", "unanswered", "closed")),
                   None, UNTIL_ALL)
    assert not arrived(view(entry("a", "answered"), entry("b", "unanswered")), None, UNTIL_ALL)
    assert not arrived(view(entry("a", "answered"), entry("b", "unsure")), None, UNTIL_ALL)
    assert not arrived(view(entry("a", "answered"), entry("b", "answered", stale=True)), None, UNTIL_ALL)
    assert arrived(view(entry("c", "unanswered", "closed")), None, UNTIL_ALL)  # nothing open: nothing to wait for
    assert not arrived(view(entry("a", "answered", status="unknown", stale=None)), None, UNTIL_ALL)


def test_as_read_drops_unanswered_entries_unless_all():
    full = {"ok": True, "count": 1, "answers": [entry("a", "answered"), entry("b", "unanswered")]}
    assert as_read(full, True) is full
    assert as_read(full, False)["answers"] == [entry("a", "answered")]


# -- the command ---------------------------------------------------------------------


def test_already_there_returns_at_once_with_reads_output(set_dir, capsys):
    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "5"]) == 0
    assert time.monotonic() - started < 1
    assert capsys.readouterr().out == read_output(set_dir)


def test_returns_as_soon_as_the_answer_is_written(set_dir, capsys):
    writer = later(0.5, lambda: answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1}))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 0
    elapsed = time.monotonic() - started
    writer.join()
    assert 0.4 < elapsed < 3, elapsed
    out = capsys.readouterr().out
    assert out == read_output(set_dir)
    assert json.loads(out)["answers"][0]["text"] == "yes"


def test_other_answers_do_not_end_a_wait_for_one_question(set_dir, capsys):
    later(0.2, lambda: answer(set_dir, {"qid": "b", "text": "no", "q_rev": 1}))
    later(0.4, lambda: answer(set_dir, {"qid": "a", "choice": "unsure", "q_rev": 1}))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "1.5"]) == 3
    assert time.monotonic() - started >= 1.5
    # On timeout the current state is printed all the same.
    assert capsys.readouterr().out == read_output(set_dir)


def test_every_question_named_must_have_its_answer(set_dir, capsys):
    # argparse kept the last --question only: "--question a --question b"
    # returned on b's answer alone, and an unknown first id was never checked.
    later(0.3, lambda: answer(set_dir, {"qid": "b", "text": "no", "q_rev": 1}))
    assert main(["wait", str(set_dir), "--question", "a", "--question", "b", "--timeout", "1.2"]) == 3
    later(0.3, lambda: answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1}))
    assert main(["wait", str(set_dir), "--question", "a", "--question", "b", "--timeout", "20"]) == 0
    capsys.readouterr()
    assert main(["wait", str(set_dir), "--question", "nope", "--question", "a", "--timeout", "0"]) == 2
    assert "no question 'nope'" in capsys.readouterr().err
    assert main(["wait", str(set_dir), "--question", "a", "--question", "nope", "--timeout", "0"]) == 2
    assert "no question 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("caught", ["cut short", "empty"])
def test_a_questions_file_caught_mid_write_at_the_start_is_waited_for(set_dir, capsys, caught):
    # Exit 2 at once ("not JSON"), where the same file caught once the wait
    # had begun was read again on its next change.
    whole = (set_dir / "questions.json").read_bytes()
    (set_dir / "questions.json").write_bytes(whole[:40] if caught == "cut short" else b"")
    later(0.4, lambda: (set_dir / "questions.json").write_bytes(whole))
    later(0.8, lambda: answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1}))
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["answers"][0]["text"] == "yes"
    (set_dir / "questions.json").write_bytes(b"{")  # never whole again: said as before, at the timeout
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "0.5"]) == 2
    assert "not JSON" in capsys.readouterr().err
    # With no timeout it was waited for for ever, without a word: said within a few seconds.
    started = time.monotonic()
    assert main(["wait", str(set_dir)]) == 2
    assert time.monotonic() - started < 5 and "not JSON" in capsys.readouterr().err


def test_an_answers_file_that_breaks_the_format_is_exit_2_at_once_not_a_wait_for_ever(set_dir, capsys):
    """read said exit 2 at once; wait took it for a file caught mid-write and
    waited (for ever, with no timeout), though answers.json is only ever
    replaced whole: no later look mends it.  A typo'd question id too."""
    newer = json.dumps({"askwright": 2, "set": "release", "rev": 1, "updated": None, "answers": {}})
    (set_dir / "answers.json").write_text(newer)
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 2
    assert main(["wait", str(set_dir), "--question", "typo", "--timeout", "20"]) == 2
    assert time.monotonic() - started < 5
    assert "askwright" in capsys.readouterr().err
    # Replaced by such a file while the wait watches: said as soon as it is seen.
    (set_dir / "answers.json").unlink()
    answer(set_dir, {"qid": "b", "text": "no", "q_rev": 1})
    later(0.5, lambda: os.replace(_written(set_dir / "next.json", newer), set_dir / "answers.json"))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 2
    assert time.monotonic() - started < 5


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_until_all_waits_for_the_last_open_question(set_dir, capsys):
    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    later(0.5, lambda: answer(set_dir, {"qid": "b", "text": "no", "q_rev": 1}))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--until", "all", "--all", "--timeout", "20"]) == 0
    assert 0.4 < time.monotonic() - started < 3
    assert capsys.readouterr().out == read_output(set_dir, "--all")


def test_a_revised_question_waits_for_an_answer_to_the_new_revision(set_dir, capsys):
    answer(set_dir, {"qid": "a", "text": "old", "q_rev": 1})
    write_questions(set_dir, [text_q("a", rev=2), text_q("b")])
    later(0.5, lambda: answer(set_dir, {"qid": "a", "text": "new", "q_rev": 2}))
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 0
    got = json.loads(capsys.readouterr().out)["answers"][0]
    assert (got["text"], got["stale"]) == ("new", False)


def test_a_changed_questions_file_is_re_read(set_dir, capsys):
    # "b" gets closed by the agent: with "a" answered, every open question now is.
    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    later(0.5, lambda: write_questions(set_dir, [text_q("a"), text_q("b", status="closed")]))
    assert main(["wait", str(set_dir), "--until", "all", "--timeout", "20"]) == 0


def test_a_withdrawn_answer_is_not_arrived(set_dir, capsys):
    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    AnswersFile(set_dir, "release").update(lambda doc, now: drop_record(doc, "a", now), NOW)
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "0.3"]) == 3


def test_timeout_zero_checks_once(set_dir, capsys):
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--timeout", "0"]) == 3
    assert time.monotonic() - started < 1
    assert json.loads(capsys.readouterr().out)["count"] == 0


def test_an_unknown_question_or_set_exits_2(set_dir, tmp_path, capsys):
    assert main(["wait", str(set_dir), "--question", "nope", "--timeout", "1"]) == 2
    assert "no question 'nope'" in capsys.readouterr().err
    assert main(["wait", str(tmp_path / "missing"), "--timeout", "1"]) == 2
    assert "no set folder" in capsys.readouterr().err


def test_a_question_removed_from_the_set_is_not_there_to_wait_for(set_dir, capsys):
    """Its record stays in read's view (status removed), but it can get no answer now: exit 2, not 0."""
    answer(set_dir, {"qid": "b", "text": "yes", "q_rev": 1})
    write_questions(set_dir, [text_q("a")])
    assert main(["wait", str(set_dir), "--question", "b", "--timeout", "1"]) == 2
    assert "no question 'b'" in capsys.readouterr().err


def test_a_set_folder_removed_while_waiting_exits_2_and_one_replaced_is_followed(set_dir, tmp_path, capsys):
    import shutil

    later(0.5, lambda: shutil.rmtree(set_dir))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "30"]) == 2  # it waited to its timeout
    assert time.monotonic() - started < 10 and "removed while waiting" in capsys.readouterr().err

    set_dir.mkdir()
    write_questions(set_dir, [text_q("a")])

    def replace() -> None:  # moved away, and another folder of the name moved in, holding the answer
        set_dir.rename(tmp_path / "old")
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        write_questions(fresh, [text_q("a")])
        answer(fresh, {"qid": "a", "text": "yes", "q_rev": 1})
        fresh.rename(set_dir)

    later(0.5, replace)
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 0
    assert json.loads(capsys.readouterr().out)["answers"][0]["text"] == "yes"


def test_question_and_until_all_do_not_go_together(set_dir, capsys):
    assert main(["wait", str(set_dir), "--question", "a", "--until", "all"]) == 2
    assert "leave out --question" in capsys.readouterr().err


def test_a_negative_timeout_is_a_usage_error(set_dir):
    with pytest.raises(SystemExit) as caught:
        main(["wait", str(set_dir), "--timeout", "-1"])
    assert caught.value.code == 2


def test_the_help_says_what_counts_as_arrived(capsys):
    with pytest.raises(SystemExit):
        main(["wait", "--help"])
    text = capsys.readouterr().out
    for words in ("--question QID", "--until", "answered", "unsure", "exit 3", "read"):
        assert words in text


def test_as_a_process_it_exits_3_on_timeout(set_dir):
    # subprocess's own timeout is the bound: a wait that ignored --timeout would hang past it.
    done = subprocess.run([sys.executable, "-m", "bridge", "wait", str(set_dir), "--timeout", "0.5"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == read_output(set_dir)


def test_the_top_help_opens_with_what_the_bridge_does_for_a_user_and_examples(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    opening = out.split("\n\n")[1]
    assert opening.startswith("Post an agent's askwright questions into a Matrix room")
    assert "bridge.commands" not in out and "add_parser" not in out
    assert "examples:\n  askwright-bridge lint " in out and "askwright-bridge run --config" in out


def test_with_no_file_watch_left_the_wait_looks_at_the_folder_and_still_returns(set_dir, capsys, monkeypatch):
    # 160 waits on one machine: past the user's 128 inotify instances, each
    # further wait died with a traceback and exit 1 (no code of wait's).
    import bridge.commands.wait as wait_command
    from watchfiles import watch as real_watch
    from watchfiles._rust_notify import WatchfilesRustInternalError

    def no_inotify_left(*args, **kwargs):
        if not kwargs.get("force_polling"):
            raise WatchfilesRustInternalError("Error creating watcher: Too many open files (os error 24)")
        return real_watch(*args, **kwargs)

    monkeypatch.setattr(wait_command, "watch", no_inotify_left)
    writer = later(0.5, lambda: answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1}))
    assert main(["wait", str(set_dir), "--question", "a", "--timeout", "20"]) == 0
    writer.join()
    captured = capsys.readouterr()
    assert json.loads(captured.out)["answers"][0]["text"] == "yes"
    assert "no file watch left" in captured.err


def test_a_question_that_can_get_no_answer_ends_the_wait_with_exit_2(set_dir, capsys):
    """Closed, withdrawn or superseded (at the start or while waiting), or no
    question of the set open: the wait hung for ever (with no timeout)."""
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "gone"]) == 2
    assert time.monotonic() - started < 2
    said = capsys.readouterr()
    assert "question 'gone' is closed: it can get no answer now" in said.err and json.loads(said.out)["set"]
    later(0.5, lambda: write_questions(set_dir, [text_q("a", status="withdrawn"), text_q("b")]))
    started = time.monotonic()
    assert main(["wait", str(set_dir), "--question", "a"]) == 2
    assert 0.4 < time.monotonic() - started < 5
    assert "question 'a' is withdrawn" in capsys.readouterr().err
    later(0.5, lambda: write_questions(set_dir, [text_q("a", status="closed"), text_q("b", status="closed")]))
    assert main(["wait", str(set_dir)]) == 2
    assert "no question of the set is open" in capsys.readouterr().err
    # An answer given before the close still arrives.
    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    assert main(["wait", str(set_dir), "--question", "a"]) == 0


@pytest.mark.parametrize("how", [[], ["--until", "all"], ["--question", "a"]])
def test_a_questions_file_mid_edit_is_no_arrival_and_no_reason_to_stop(set_dir, capsys, how):
    """questions.json that is JSON but not the format (an id typed as a
    number mid-edit): which questions are open is not known.  ``--until all``
    said every answer had arrived (exit 0, none there); the others said the
    question was not in the set.  The wait waits, and ends when the file is
    whole again and the answer comes."""
    broken = json.loads((set_dir / "questions.json").read_text())
    broken["questions"][0]["id"] = 5
    (set_dir / "questions.json").write_text(json.dumps(broken))
    assert main(["wait", str(set_dir), *how, "--timeout", "0.5"]) == 3
    later(0.5, lambda: write_questions(set_dir, [text_q("a")]))
    later(1.0, lambda: answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1}))
    assert main(["wait", str(set_dir), *how, "--timeout", "20"]) == 0
    assert '"text": "yes"' in capsys.readouterr().out


def test_an_answer_written_in_the_same_millisecond_as_the_last_is_later_than_it(set_dir):
    """An agent waits for answers ``after`` the last one's time: a second
    answer written in the same millisecond had the same ``updated``, and
    that wait (and every one after it) missed it until a third came."""
    from bridge.answers.arrival import parse_time
    from bridge.answers.view import load_view

    answer(set_dir, {"qid": "a", "text": "yes", "q_rev": 1})
    first = json.loads((set_dir / "answers.json").read_text())["answers"]["a"]["updated"]
    answer(set_dir, {"qid": "b", "text": "no", "q_rev": 1})  # the same clock reading (NOW)
    second = json.loads((set_dir / "answers.json").read_text())["answers"]["b"]["updated"]
    assert parse_time(second) > parse_time(first)
    assert arrived(load_view(set_dir, include_all=True), None, UNTIL_ANSWERED, after=parse_time(first))


def choice_q(qid: str, options: list[str], show_if: dict | None = None, status: str = "open") -> dict:
    question = {"id": qid, "kind": "choice", "title": qid.title(), "question": f"Which {qid}?", "status": status,
                "options": [{"id": o, "label": o.title()} for o in options]}
    return {**question, "show_if": show_if} if show_if else question


def test_until_all_does_not_wait_for_a_question_its_show_if_answer_ruled_out(set_dir, capsys):
    """host -> region (show_if host=cloud) -> zone (show_if region=eu): the
    person answered onprem, and the room told them region and zone are only
    needed for the cloud; --until all timed out waiting for them (and waited
    for ever without a timeout)."""
    write_questions(set_dir, [choice_q("host", ["cloud", "onprem"]),
                              choice_q("region", ["eu", "us"], {"question": "host", "option": ["cloud"]}),
                              choice_q("zone", ["one", "three"], {"question": "region", "option": ["eu"]})])
    answer(set_dir, {"qid": "host", "choice": "onprem", "q_rev": 1})
    assert main(["wait", str(set_dir), "--until", "all", "--timeout", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [e["qid"] for e in out["answers"]] == ["host"]
    # read --all shows the condition, so the agent can tell why those need no answer.
    assert json.loads(read_output(set_dir, "--all"))["answers"][1]["show_if"] == {"question": "host",
                                                                                  "option": ["cloud"]}
    # The cloud: both may be needed, and --until all waits for them, the chain followed.
    answer(set_dir, {"qid": "host", "choice": "cloud", "q_rev": 1})
    assert main(["wait", str(set_dir), "--until", "all", "--timeout", "0.5"]) == 3
    answer(set_dir, {"qid": "region", "choice": "us", "q_rev": 1})
    assert main(["wait", str(set_dir), "--until", "all", "--timeout", "5"]) == 0
    # A condition on a question withdrawn unanswered can never be met.
    write_questions(set_dir, [choice_q("host", ["cloud", "onprem"]), choice_q("gone", ["x", "y"], status="withdrawn"),
                              choice_q("extra", ["p", "q"], {"question": "gone", "option": ["x"]})])
    assert main(["wait", str(set_dir), "--until", "all", "--timeout", "5"]) == 0
