"""``askwright-bridge lint``: exit codes, the --json shape, bad input, and the bundled examples."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import main
from bridge.questionset.load import LoadError
from bridge.questionset.media import LocalFilesystem, Streams, captions_for, resolve
from bridge.questionset.setdir import find_probe, load_set_dir
from bridge.resources import examples_dir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in examples_dir().iterdir() if (p / "questions.json").is_file())

CLEAN = {
    "askwright": 1,
    "id": "tiny",
    "title": "Tiny",
    "questions": [
        {
            "id": "lunch",
            "kind": "choice",
            "title": "Lunch",
            "question": "Where should the team have lunch on Friday?",
            "why": "The booking closes on Thursday.",
            "options": [{"id": "pizza", "label": "The pizza place"}, {"id": "thai", "label": "The Thai place"}],
            "guess": {"option": "thai", "why": "Last time was pizza.", "confidence": "low"},
        }
    ],
}


def write_set(folder: Path, content: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = content if isinstance(content, bytes) else json.dumps(content).encode()
    (folder / "questions.json").write_bytes(data)
    return folder


def lint_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["lint", "--json", "--no-probe", *args])
    return code, json.loads(capsys.readouterr().out)


def test_clean_set_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = lint_json(capsys, str(write_set(tmp_path / "s", CLEAN)))
    assert code == 0
    assert out == {"ok": True, "set": "tiny", "errors": [], "warnings": []}


def test_warnings_alone_still_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content = json.loads(json.dumps(CLEAN))
    content["questions"][0]["title"] = "L" * 81
    code, out = lint_json(capsys, str(write_set(tmp_path / "s", content)))
    assert code == 0 and out["ok"] is True
    assert [w["where"] for w in out["warnings"]] == ["questions[lunch].title"]


def test_errors_exit_1_with_the_json_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content = json.loads(json.dumps(CLEAN))
    content["questions"][0]["options"][1]["label"] = "B"
    content["extra"] = True
    code, out = lint_json(capsys, str(write_set(tmp_path / "s", content)))
    assert code == 1
    assert set(out) == {"ok", "set", "errors", "warnings"}
    assert out["ok"] is False and out["set"] == "tiny"
    assert [set(e) for e in out["errors"]] == [{"where", "message"}]
    assert out["errors"][0]["where"] == "questions[lunch].options[thai].label"
    assert out["warnings"][0]["where"] == "extra"


def test_readable_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content = json.loads(json.dumps(CLEAN))
    content["questions"][0]["question"] = "Lunch\nplace"
    code = main(["lint", "--no-probe", str(write_set(tmp_path / "s", content))])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[0] == "tiny: 1 error, 0 warnings"
    assert "questions[lunch].question:" in out.splitlines()[1]


def test_readable_listing_when_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--no-probe", str(write_set(tmp_path / "s", CLEAN))]) == 0
    assert capsys.readouterr().out == "tiny: ok, no errors and no warnings\n"


def test_the_questions_file_itself_may_be_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_set(tmp_path / "s", CLEAN)
    code, out = lint_json(capsys, str(folder / "questions.json"))
    assert code == 0 and out["set"] == "tiny"


DEEP = b"[" * 100_000 + b"]" * 100_000

UNREADABLE = {
    "not-json": b"{nope",
    "not-utf8": b'{"id": "\xff\xfe"}',
    "array": b"[1, 2]",
    "string": b'"questions"',
    "empty": b"",
    "deep-nesting": DEEP,
    "deep-nesting-in-object": b'{"questions": ' + DEEP + b"}",
    "huge-integer": b'{"askwright": ' + b"9" * 5000 + b"}",
    # Python's parser takes these; JSON (and the agents' door) does not.
    "nan": b'{"askwright": 1, "id": "tiny", "questions": [], "score": NaN}',
    "infinity": b'{"askwright": 1, "id": "tiny", "questions": [], "score": -Infinity}',
    # Read as infinity, which the set would be written back with.
    "past-a-double": b'{"askwright": 1, "id": "tiny", "questions": [], "score": 1e400}',
}


@pytest.mark.parametrize("content", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    folder = write_set(tmp_path / "s", content)
    code, out = lint_json(capsys, str(folder))
    assert code == 2
    assert out["ok"] is False and out["set"] is None and out["warnings"] == []
    assert out["errors"][0]["where"] == "questions.json"
    assert main(["lint", str(folder)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("askwright-bridge lint: ")


def test_missing_folder_or_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", str(tmp_path / "nowhere")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["lint", str(tmp_path / "empty")]) == 2
    (tmp_path / "dir" / "questions.json").mkdir(parents=True)
    assert main(["lint", str(tmp_path / "dir")]) == 2
    err = capsys.readouterr().err
    assert err.count("askwright-bridge lint: ") == 3 and "Traceback" not in err


def test_unreadable_questions_file_exits_2(tmp_path: Path) -> None:
    # A directory where the file should be can't be read, even by root.
    folder = tmp_path / "s"
    (folder / "questions.json").mkdir(parents=True)
    assert main(["lint", str(folder)]) == 2


NASTY = [
    {"askwright": 1, "id": "x", "title": "T", "questions": [{"id": "\u202e", "kind": "text", "title": "\u202e\x1b[31m", "question": "a\nb"}]},
    {"askwright": 1.5, "id": None, "title": {}, "mode": [], "media_roots": "r", "questions": [None, "q", 3, [], {"media": [{"src": "/etc/passwd"}]}]},
    {"questions": [{"figure": json.loads("[" * 500 + "]" * 500), "media": [{"figure": json.loads('{"a":' * 500 + "1" + "}" * 500)}]}]},
    # (NaN and Infinity are no JSON: UNREADABLE above.)
    {"askwright": 1e308, "id": "y", "title": "T", "questions": [{"id": "q", "kind": "choice", "points": -1e308}]},
]


def test_half_a_surrogate_pair_is_named_not_linted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON's escapes can spell "\ud800" and UTF-8 can't write it: the set
    could never be posted (the homeserver refuses it), nor its answers written."""
    folder = write_set(tmp_path / "s", {"askwright": 1, "id": "x", "title": "T \ud800", "questions": []})
    assert main(["lint", "--no-probe", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "half a surrogate pair ('\\ud800')" in err and "Traceback" not in err


@pytest.mark.parametrize("content", NASTY)
def test_wrong_types_and_odd_strings_never_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any) -> None:
    folder = write_set(tmp_path / "s", content)
    assert main(["lint", "--no-probe", str(folder)]) == 1
    readable = capsys.readouterr().out
    assert "\x1b" not in readable
    code, out = lint_json(capsys, str(folder))
    assert code == 1 and out["errors"]


def test_python_dash_m_bridge(tmp_path: Path) -> None:
    folder = write_set(tmp_path / "s", CLEAN)
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "lint", "--json", "--no-probe", str(folder)],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    bad = subprocess.run(
        [sys.executable, "-m", "bridge", "lint", str(tmp_path / "nowhere")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- the bundled examples


def h264_aac(path: str) -> Streams:
    return Streams(video=("h264",), audio=("aac",))


def test_there_are_bundled_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"release-decisions", "study-basics", "release-approval"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_lints_with_no_error_and_no_warning(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = load_set_dir(example, probe=h264_aac)
    assert result.errors == [] and result.warnings == []
    code, out = lint_json(capsys, str(example))
    assert code == 0 and out["errors"] == [] and out["warnings"] == []


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_lints_clean_with_whatever_probe_the_machine_has(example: Path) -> None:
    # With ffprobe on the PATH this runs the real codec check; without it the
    # check is skipped by lint itself, as the format says.
    result = load_set_dir(example, probe=True)
    assert result.errors == [] and result.warnings == []


def test_examples_cover_what_they_promise() -> None:
    decide = load_set_dir(examples_dir() / "release-decisions", probe=False).model
    assert decide is not None
    assert {q.kind for q in decide.questions} == {"choice", "multi", "compare", "rank", "text", "scale", "confirm"}
    media = [m for q in decide.questions for m in q.media or []]
    assert any(m.src and m.src.endswith(".png") and m.alt for m in media)
    compare = next(q for q in decide.questions if q.kind == "compare")
    assert compare.sides and compare.sides["randomized"] is True
    folder = examples_dir() / "release-decisions"
    fs = LocalFilesystem(str(folder))
    clip = resolve(compare.media[0].src or "", decide.media_roots, fs)  # type: ignore[index]
    assert clip.ok and captions_for(clip, decide.media_roots, fs) is not None
    assert any(q.subject is not None for q in decide.questions)
    study = load_set_dir(examples_dir() / "study-basics", probe=False).model
    assert study is not None and study.mode == "study"
    assert {q.kind for q in study.questions} == {"choice", "text"}


def test_example_media_is_small_and_genuine() -> None:
    files = [p for p in examples_dir().rglob("*") if p.is_file() and p.name != "questions.json"]
    assert sum(p.stat().st_size for p in files) < 50_000
    video = next(p for p in files if p.suffix == ".mp4").read_bytes()
    assert video[4:8] == b"ftyp" and b"avc1" in video and b"mp4a" in video
    image = next(p for p in files if p.suffix == ".png").read_bytes()
    assert image.startswith(b"\x89PNG\r\n\x1a\n")


def test_load_set_dir_raises_load_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError):
        load_set_dir(tmp_path / "nowhere")
    with pytest.raises(LoadError):
        load_set_dir(write_set(tmp_path / "s", b"[]"))


def test_find_probe_uses_the_path() -> None:
    assert find_probe(lambda name: None) is None
    assert callable(find_probe(lambda name: "/opt/bin/ffprobe"))


@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe is not on the PATH")
def test_ffprobe_reports_nothing_for_a_file_that_is_not_media(tmp_path: Path) -> None:
    (tmp_path / "fake.mp4").write_bytes(b"not a video")
    probe = find_probe()
    assert probe is not None and probe(str(tmp_path / "fake.mp4")) is None


def test_a_sets_root_is_linted_set_by_set_and_a_second_folder_under_one_id_is_an_error(tmp_path, capsys):
    for name in ("a-release", "b-release"):
        shutil.copytree(examples_dir() / "release-decisions", tmp_path / name)
    code = main(["lint", str(tmp_path), "--json", "--no-probe"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["ok"] is False
    first, second = out["sets"]
    assert first["ok"] is True
    message = second["errors"][-1]["message"]
    assert str((tmp_path / "a-release").resolve()) in message and str((tmp_path / "b-release").resolve()) in message


def test_a_byte_order_mark_some_editors_write_is_passed_over(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # PowerShell 5's Out-File writes one; the agents' door took such a set, lint refused it.
    folder = write_set(tmp_path / "s", b"\xef\xbb\xbf" + json.dumps(CLEAN).encode())
    code, out = lint_json(capsys, str(folder))
    assert (code, out["ok"], out["set"]) == (0, True, "tiny")


def test_a_questions_json_that_is_a_fifo_is_refused_at_once_not_waited_on(tmp_path, capsys):
    # `!ask status` read it with a plain open() on the event loop: the whole
    # bridge froze until someone wrote into the FIFO; the CLI hung too.
    import os
    import threading

    from bridge.cli import main

    folder = tmp_path / "set"
    folder.mkdir()
    os.mkfifo(folder / "questions.json")
    done: list[int] = []
    reader = threading.Thread(target=lambda: done.append(main(["lint", str(folder)])), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the stuck reader so the suite goes on, then fail
        with open(folder / "questions.json", "wb") as fifo:
            fifo.write(b"{}")
        reader.join(10)
        raise AssertionError("lint waited on a FIFO named questions.json")
    assert done == [2] and "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["questions.json", "answers.json"])
def test_read_wait_and_the_poster_never_wait_on_a_fifo_in_a_set_folder(tmp_path, capsys, name):
    # lint was mended, but read, wait, status and the bridge's own poster
    # still opened the name as a file: each hung until someone wrote into it
    # (the bridge's event loop with it: no set posted, SIGTERM ignored).
    import asyncio
    import os
    import threading

    from bridge.cli import main
    from bridge.service.posting.poster import _fingerprint

    folder = tmp_path / "set"
    folder.mkdir()
    if name == "answers.json":
        (folder / "questions.json").write_text(json.dumps(CLEAN))
    os.mkfifo(folder / name)
    calls = {"read": lambda: main(["read", str(folder)]),
             "wait": lambda: main(["wait", str(folder), "--timeout", "1"]),
             "fingerprint": lambda: asyncio.run(asyncio.to_thread(_fingerprint, folder))}
    for what, call in calls.items():
        done: list[object] = []
        reader = threading.Thread(target=lambda: done.append(call()), daemon=True)
        reader.start()
        reader.join(10)
        if reader.is_alive():
            with open(folder / name, "wb") as fifo:
                fifo.write(b"{}")
            reader.join(10)
            raise AssertionError(f"{what} waited on a FIFO named {name}")
        capsys.readouterr()
