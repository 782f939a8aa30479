"""Every rule of the question-set format, as errors and warnings.

``lint`` is pure: the file system and the codec probe come in as callables
(see ``media.Filesystem`` and ``media.Probe``).  Types are checked by the
model (``load.validate_model``); the rules below read the raw dict through
tolerant accessors, so one wrong type never hides the other findings and
never raises.  A rule finding placed at (or under) a place the model already
reported is dropped: the type error is the one thing to fix there.

Where the format is terse, the decisions taken are written beside the rule.
A rule the format states as a requirement ("not empty", "unique", "ends in
?") is an error; only what it calls "a warning" is a warning.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from bridge.questionset import media as media_rules
from bridge.questionset.load import Finding, validate_model
from bridge.questionset.model import (
    BUILTIN_IDS,
    KINDS,
    Guess,
    MediaItem,
    Option,
    Question,
    QuestionSet,
    ShowIf,
    Subject,
)

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SUPERSEDES_PATTERN = re.compile(r"(?P<id>[^@]+)(?:@(?P<rev>[1-9][0-9]*))?")
TITLE_WARN_LENGTH = 80
MAX_SENTENCES = 3
MAX_OPEN = {"decide": 12, "study": 30}
SUBJECT_MAX = 512
SINGLE_PICK_KINDS = ("choice", "compare", "scale", "confirm")
STUDY_KINDS = ("choice", "text")
FIRST_OPTION_GUESS_MIN = 3


@dataclass
class LintResult:
    set_id: str | None
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    model: QuestionSet | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "set": self.set_id,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
        }


# ---------------------------------------------------------------- raw access


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def _str(obj: Any, key: str) -> str | None:
    value = _get(obj, key)
    return value if isinstance(value, str) else None


def _list(obj: Any, key: str) -> list[Any] | None:
    value = _get(obj, key)
    return value if isinstance(value, list) else None


def _dict(obj: Any, key: str) -> dict[str, Any] | None:
    value = _get(obj, key)
    return value if isinstance(value, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _blank(value: str | None) -> bool:
    return value is None or not value.strip()


def _quote(text: str, limit: int = 60) -> str:
    """A user value inside a message, cut short so one huge value can't flood the report."""
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    return f'"{shown}"'


def _label(item: Any, index: int) -> str:
    """How a list item is named in ``where``: by its id when it has one (as the loader does)."""
    ident = _get(item, "id")
    return ident if isinstance(ident, str) and ident else str(index)


# ---------------------------------------------------------------- context


@dataclass
class _Question:
    """One question's raw dict plus what the rules keep asking about it."""

    raw: dict[str, Any]
    where: str
    id: str | None
    kind: str | None
    is_open: bool
    options: list[tuple[str, dict[str, Any]]]  # (where, option dict)
    options_given: bool  # a list of options is there at all

    @property
    def option_ids(self) -> list[str]:
        return [o["id"] for _, o in self.options if isinstance(o.get("id"), str)]


def _question_view(raw: dict[str, Any], index: int) -> _Question:
    where = f"questions[{_label(raw, index)}]"
    kind = _str(raw, "kind")
    status = _get(raw, "status")
    # An invalid status is a type error already; counting it as open (the
    # default) keeps it from also setting off "no open question".
    is_open = status not in ("closed", "superseded", "withdrawn")
    raw_options = _list(raw, "options")
    options = [
        (f"{where}.options[{_label(o, i)}]", o) for i, o in enumerate(raw_options or []) if isinstance(o, dict)
    ]
    return _Question(
        raw=raw,
        where=where,
        id=_str(raw, "id"),
        kind=kind if kind in KINDS else None,
        is_open=is_open,
        options=options,
        options_given=raw_options is not None,
    )


@dataclass
class _Lint:
    raw: dict[str, Any]
    fs: media_rules.Filesystem
    probe: media_rules.Probe | None
    mode: str
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def study(self) -> bool:
        return self.mode == "study"

    def error(self, where: str, message: str) -> None:
        self.errors.append(Finding(where, message))

    def warning(self, where: str, message: str) -> None:
        self.warnings.append(Finding(where, message))

    @property
    def media_roots(self) -> list[str]:
        return [r for r in _list(self.raw, "media_roots") or [] if isinstance(r, str)]


# ---------------------------------------------------------------- entry point


def lint(raw: dict[str, Any], fs: media_rules.Filesystem, *, probe: media_rules.Probe | None = None) -> LintResult:
    """Check a parsed ``questions.json`` against every rule of the format.

    ``fs`` answers file questions relative to the set folder; ``probe``
    (optional) reads a video's codecs; without it the codec check is skipped.
    """
    if not isinstance(raw, dict):
        return LintResult(None, [Finding("set", "questions.json must hold a JSON object")])
    model, type_findings = validate_model(raw)
    type_errors = _merge_type_findings(type_findings)

    mode = raw.get("mode")
    # An unknown mode is a type error; the rules then read the set as the default.
    ctx = _Lint(raw, fs, probe, mode if mode in ("decide", "study") else "decide")
    _check_set(ctx)
    questions = [_question_view(q, i) for i, q in enumerate(_list(raw, "questions") or []) if isinstance(q, dict)]
    by_id: dict[str, _Question] = {}
    for q in questions:
        if q.id is not None:
            by_id.setdefault(q.id, q)
    for q in questions:
        _check_question(ctx, q, by_id)
    _check_across_questions(ctx, questions)

    typed = [f.where for f in type_errors]
    set_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    return LintResult(
        set_id=set_id,
        errors=type_errors + [f for f in ctx.errors if not _under_any(f.where, typed)],
        warnings=[f for f in ctx.warnings if not _under_any(f.where, typed)],
        model=model,
    )


def _under_any(where: str, places: list[str]) -> bool:
    return any(where == p or where.startswith(p + ".") or where.startswith(p + "[") for p in places)


_TYPE_WORDS = (
    (re.compile(r" or instance of \w+"), ""),
    (re.compile(r"a valid dictionary"), "an object"),
    (re.compile(r"a valid list"), "a list"),
    (re.compile(r"a valid string"), "a string"),
    (re.compile(r"a valid integer"), "an integer"),
    (re.compile(r"a valid boolean"), "true or false"),
    (re.compile(r"a valid number"), "a number"),
)


def _merge_type_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per place: a union type fails once per member ("a string" / "a list")."""
    merged: dict[str, list[str]] = {}
    for f in findings:
        message = f.message
        for pattern, replacement in _TYPE_WORDS:
            message = pattern.sub(replacement, message)
        messages = merged.setdefault(f.where, [])
        if message not in messages:
            messages.append(message)
    return [Finding(where, ", or ".join(messages)) for where, messages in merged.items()]


# ---------------------------------------------------------------- unknown fields


def _known(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(model.model_fields)


_KNOWN = {
    "set": _known(QuestionSet),
    "question": _known(Question),
    "option": _known(Option),
    "guess": _known(Guess),
    "media": _known(MediaItem),
    "show_if": _known(ShowIf),
    "subject": _known(Subject),
}


_LEVEL_NAMES = {
    "set": "the set",
    "question": "a question",
    "option": "an option",
    "guess": "a guess",
    "media": "a media item",
    "show_if": "show_if",
    "subject": "subject",
}


def _check_unknown(ctx: _Lint, obj: Any, level: str, where: str) -> None:
    if not isinstance(obj, dict):
        return
    for name in obj:
        if name not in _KNOWN[level]:
            place = f"{where}.{name}" if where else str(name)
            ctx.warning(place, f"{_quote(str(name))} is not a field of {_LEVEL_NAMES[level]}; remove it or fix its spelling")


# ---------------------------------------------------------------- the set


def _id_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if value.startswith("_"):
        return "must not start with _ (such ids are reserved); start it with a letter or digit"
    if len(value) > 64:
        return f"is {len(value)} characters long; shorten it to 64 at most"
    if not ID_PATTERN.fullmatch(value):
        return "may hold only letters, digits, _, . and -, and must start with a letter or digit"
    return None


def _check_set(ctx: _Lint) -> None:
    raw = ctx.raw
    _check_unknown(ctx, raw, "set", "")
    version = raw.get("askwright")
    if _is_int(version) and version != 1:
        ctx.error("askwright", f"is {version}; this format is version 1, so set it to 1")
    set_id = _str(raw, "id")
    if set_id is not None and (problem := _id_problem(set_id)):
        ctx.error("id", f"the set id {problem}")
    title = _str(raw, "title")
    if title is not None and _blank(title):
        ctx.error("title", "the set needs a title: it is shown in the page's top bar")
    for i, root in enumerate(_list(raw, "media_roots") or []):
        if isinstance(root, str) and not ctx.fs.is_dir(root):
            ctx.error(f"media_roots[{i}]", f"the folder {_quote(root)} does not exist; create it or remove it from media_roots")


# ---------------------------------------------------------------- one question


def _check_question(ctx: _Lint, q: _Question, by_id: dict[str, _Question]) -> None:
    _check_unknown(ctx, q.raw, "question", q.where)
    _check_question_id(ctx, q, by_id)
    _check_title(ctx, q)
    _check_question_text(ctx, q)
    _check_why_and_hint(ctx, q)
    _check_look_for(ctx, q)
    _check_options(ctx, q)
    _check_guess(ctx, q)
    _check_sides(ctx, q)
    _check_media(ctx, q)
    _check_show_if(ctx, q, by_id)
    _check_status(ctx, q, by_id)
    _check_rev_and_supersedes(ctx, q)
    _check_subject(ctx, q)
    if ctx.study:
        _check_study(ctx, q)


def _check_question_id(ctx: _Lint, q: _Question, by_id: dict[str, _Question]) -> None:
    if q.id is None:
        return
    if problem := _id_problem(q.id):
        ctx.error(f"{q.where}.id", f"the question id {problem}")
    elif by_id.get(q.id) is not q:
        ctx.error(f"{q.where}.id", f"another question already has the id {_quote(q.id)}; give each question its own id")


def _check_title(ctx: _Lint, q: _Question) -> None:
    title = _str(q.raw, "title")
    if title is None:
        return
    if _blank(title):
        ctx.error(f"{q.where}.title", "give the question a title")
    elif len(title.strip()) > TITLE_WARN_LENGTH:
        ctx.warning(f"{q.where}.title", f"the title is {len(title.strip())} characters long; keep it to {TITLE_WARN_LENGTH} at most")


def _check_question_text(ctx: _Lint, q: _Question) -> None:
    text = _str(q.raw, "question")
    if text is None:
        return
    # Trailing spaces are forgiven: "Which one? " still ends in ?.
    if ctx.study:
        if "?" not in text:
            ctx.error(f"{q.where}.question", "a quiz question must contain a ? (it may quote its sentence after the ask)")
    elif not text.rstrip().endswith("?"):
        ctx.error(f"{q.where}.question", "end the question with ?: it must ask something")


def sentence_count(text: str) -> int:
    """Sentences end in . ! or ? followed by a space or the end ("1.0 s" is not two)."""
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return sum(1 for part in parts if re.search(r"\w", part))


def _check_why_and_hint(ctx: _Lint, q: _Question) -> None:
    why = _str(q.raw, "why")
    if not ctx.study and _blank(why):  # a why of the wrong type is the model's finding at the same place
        ctx.error(f"{q.where}.why", "say why you are asking: what the answer changes")
    for name in ("why", "hint"):
        value = _str(q.raw, name)
        if value is not None and (n := sentence_count(value)) > MAX_SENTENCES:
            ctx.warning(f"{q.where}.{name}", f"{name} has {n} sentences; cut it to {MAX_SENTENCES} at most")


# Words that name no particular thing to look at: an item made only of them
# (ignoring filler words) is as vague as "quality" or "overall".
_VAGUE_WORDS = frozenset(
    "quality overall general generally everything anything all look looks feel feels vibe vibes good bad "
    "better best nice fine ok okay style aesthetic aesthetics appearance impression polish polished "
    "things stuff details detail whole".split()
)
_FILLER_WORDS = frozenset("the a an of and or in on is it its how does do what this that to for at".split())


def is_vague(item: str) -> bool:
    words = re.findall(r"[a-z0-9']+", item.lower())
    content = [w for w in words if w not in _FILLER_WORDS]
    return not content or all(w in _VAGUE_WORDS for w in content)


def _has_media(q: _Question) -> bool:
    return bool(_list(q.raw, "media"))


def _check_look_for(ctx: _Lint, q: _Question) -> None:
    items = _list(q.raw, "look_for")
    needed = not ctx.study and (q.kind == "compare" or _has_media(q))
    # An empty list is as good as none: there is still nothing to look for.
    if needed and not items and q.raw.get("look_for") in (None, []):
        reason = "a compare question" if q.kind == "compare" else "a question with media"
        ctx.error(f"{q.where}.look_for", f"{reason} needs look_for: list what to watch or listen for")
    for i, item in enumerate(items or []):
        if not isinstance(item, str):
            continue
        if len(item.split()) < 3:
            ctx.warning(f"{q.where}.look_for[{i}]", f"{_quote(item)} is too short; say in a few words what exactly to look for")
        elif is_vague(item):
            ctx.warning(f"{q.where}.look_for[{i}]", f"{_quote(item)} is vague; name the moment or detail to look at")


# ---------------------------------------------------------------- options


def _norm_label(label: str) -> str:
    return " ".join(label.strip().strip(".,:;!?()[]\"'").split()).lower()


_BARE_WORDS = frozenset(
    "left right top bottom middle center centre first second third fourth fifth last "
    "yes no ok okay y n yep nope yeah sure true false".split()
)
_BARE_PATTERNS = (
    re.compile(r"[a-z0-9]"),  # "B", "2"
    re.compile(r"#?\d+"),  # "12", "#3"
    re.compile(r"(option|choice|answer|number|item|no\.?|#)\s*[a-z0-9]{1,2}"),  # "Option 2", "Choice B"
    re.compile(r"(the )?(left|right|top|bottom|first|second|third|last)( one| option| side| take)?"),
)


def is_bare_label(label: str, *, kind: str | None = None) -> bool:
    """A label that names only a position or a yes/no, not what the person chooses."""
    norm = _norm_label(label)
    # On a scale the number is the value itself ("3" of 1..5), not a position.
    if kind == "scale" and re.fullmatch(r"-?\d+", norm):
        return False
    return norm in _BARE_WORDS or any(p.fullmatch(norm) for p in _BARE_PATTERNS)


_YES_NO_START = re.compile(r"(yes|no)\b", re.IGNORECASE)


def _option_id_problem(value: str) -> str | None:
    # Not in the format; decided here because replies name option ids and a
    # multi or rank answer lists them comma-separated, so an id must be
    # something a person can type back.
    if not value.strip():
        return "must not be empty"
    if len(value) > 64:
        return "is longer than 64 characters; shorten it"
    if re.search(r"[,\s]", value) or not value.isprintable():
        return "must not hold commas, spaces or control characters; use letters, digits, _, . or -"
    return None


def _check_options(ctx: _Lint, q: _Question) -> None:
    raw_options = q.raw.get("options")
    if q.kind == "text":
        # An empty list offers nothing either, so only a non-empty one fails.
        if isinstance(raw_options, list) and raw_options:
            ctx.error(f"{q.where}.options", "a text question takes no options; remove them (the person writes the answer)")
        return
    if q.kind is None and raw_options is None:
        return  # the kind is a type error; nothing tells whether options are needed
    if raw_options is None:
        ctx.error(f"{q.where}.options", "add the options the person picks from (at least two)")
        return
    if not q.options_given:
        return  # a type error
    _check_option_count(ctx, q)
    seen_ids: set[str] = set()
    seen_labels: set[str] = set()
    for where, option in q.options:
        _check_unknown(ctx, option, "option", where)
        _check_option_id(ctx, where, option, seen_ids)
        _check_option_label(ctx, q, where, option, seen_labels)


def _check_option_count(ctx: _Lint, q: _Question) -> None:
    count = len(q.raw["options"])
    if q.kind == "confirm":
        if count not in (2, 3):
            ctx.error(f"{q.where}.options", f"a confirm question offers two or three actions, not {count}")
    elif count < 2:
        ctx.error(f"{q.where}.options", f"offer at least two options, not {count}")


def _check_option_id(ctx: _Lint, where: str, option: dict[str, Any], seen: set[str]) -> None:
    oid = _str(option, "id")
    if oid is None:
        return
    if oid in BUILTIN_IDS:
        ctx.error(f"{where}.id", f"{_quote(oid)} is a built-in answer every question offers; give this option another id")
    elif problem := _option_id_problem(oid):
        ctx.error(f"{where}.id", f"the option id {problem}")
    elif oid in seen:
        ctx.error(f"{where}.id", f"two options have the id {_quote(oid)}; give each its own id")
    seen.add(oid)


def _check_option_label(ctx: _Lint, q: _Question, where: str, option: dict[str, Any], seen: set[str]) -> None:
    label = _str(option, "label")
    if label is None:
        return
    if _blank(label):
        ctx.error(f"{where}.label", "give the option a label: the words the person picks")
        return
    # A quiz may offer "We" and "we" as different answers; elsewhere case is ignored.
    key = label.strip() if ctx.study else label.strip().casefold()
    if key in seen:
        ctx.error(f"{where}.label", f"another option is also labelled {_quote(label)}; make each label distinct")
    seen.add(key)
    if q.kind == "confirm" and _YES_NO_START.match(label.strip()):
        ctx.error(f"{where}.label", f"{_quote(label)} starts with Yes or No; name the action instead (\"Ship it\", \"Hold the release\")")
    elif not ctx.study and is_bare_label(label, kind=q.kind):
        # In a quiz "Left", "B" or "Yes" can be the answer itself, so the rule is off there.
        ctx.error(f"{where}.label", f"{_quote(label)} is a bare position or yes/no; say what choosing it means")


# ---------------------------------------------------------------- guess


def _check_guess(ctx: _Lint, q: _Question) -> None:
    guess = q.raw.get("guess")
    if guess is None:
        if not ctx.study:
            ctx.error(f"{q.where}.guess", "add your guess (with a why and a confidence of high or low)")
        return
    if not isinstance(guess, dict):
        return  # a type error
    where = f"{q.where}.guess"
    _check_unknown(ctx, guess, "guess", where)
    _check_guess_pick(ctx, q, guess, where)
    if _blank(_str(guess, "why")):
        ctx.error(f"{where}.why", "say why you guess this")
    if "confidence" not in guess or guess.get("confidence") is None:
        ctx.error(f"{where}.confidence", "set confidence to high or low")


def _check_guess_pick(ctx: _Lint, q: _Question, guess: dict[str, Any], where: str) -> None:
    # Membership is only checked against a usable list of options: when the
    # options themselves are missing, that is the one thing reported.
    ids = q.option_ids
    checkable = q.options_given and bool(ids)
    if q.kind in SINGLE_PICK_KINDS:
        pick = guess.get("option")
        if pick is None:
            ctx.error(f"{where}.option", "name the option you guess (its id) in option")
        elif isinstance(pick, str) and checkable and pick not in ids:
            ctx.error(f"{where}.option", f"{_quote(pick)} is not one of this question's option ids")
    elif q.kind == "multi":
        _check_guess_multi(ctx, guess, where, ids if checkable else None)
    elif q.kind == "rank":
        _check_guess_rank(ctx, guess, where, ids if checkable else None)
    elif q.kind == "text":
        text = guess.get("text")
        if text is None or (isinstance(text, str) and not text.strip()):
            ctx.error(f"{where}.text", "write the answer you guess in text")


def _check_guess_multi(ctx: _Lint, guess: dict[str, Any], where: str, ids: list[str] | None) -> None:
    picks = guess.get("options")
    if picks is None:
        ctx.error(f"{where}.options", "list the option ids you guess in options")
        return
    if not isinstance(picks, list) or not all(isinstance(p, str) for p in picks):
        return  # a type error
    # A multi answer needs at least one pick (the answer event's rule), so a guess does too.
    if not picks:
        ctx.error(f"{where}.options", "guess at least one option")
    elif len(set(picks)) != len(picks):
        ctx.error(f"{where}.options", "an option is listed twice; list each guessed option once")
    elif ids is not None and (unknown := [p for p in picks if p not in ids]):
        ctx.error(f"{where}.options", f"{', '.join(_quote(p) for p in unknown)} not among this question's option ids")


def _check_guess_rank(ctx: _Lint, guess: dict[str, Any], where: str, ids: list[str] | None) -> None:
    order = guess.get("order")
    if order is None:
        ctx.error(f"{where}.order", "give the order you guess: every option id once")
        return
    if not isinstance(order, list) or not all(isinstance(p, str) for p in order) or ids is None:
        return
    if sorted(order) != sorted(ids):
        missing = [i for i in ids if i not in order]
        extra = sorted({p for p in order if p not in ids})
        twice = sorted({p for p in order if p in ids and order.count(p) > 1})
        parts = []
        if missing:
            parts.append("missing " + ", ".join(_quote(i) for i in missing))
        if twice:
            parts.append("listed twice: " + ", ".join(_quote(p) for p in twice))
        if extra:
            parts.append("not option ids: " + ", ".join(_quote(p) for p in extra))
        if not parts:  # only when the options themselves repeat an id
            parts.append("the options repeat an id")
        ctx.error(f"{where}.order", f"the order must hold every option id exactly once ({'; '.join(parts)})")


# ---------------------------------------------------------------- sides


def _check_sides(ctx: _Lint, q: _Question) -> None:
    sides = q.raw.get("sides")
    if sides is None or q.kind is None:
        return
    where = f"{q.where}.sides"
    if q.kind != "compare":
        ctx.error(where, "sides only belong on a compare question; remove them")
        return
    if not isinstance(sides, dict):
        return
    _check_randomized(ctx, sides, where)
    names = {name: value for name, value in sides.items() if name != "randomized"}
    ids = q.option_ids
    for name, value in names.items():
        if not isinstance(value, str):
            ctx.error(f"{where}.{name}", "a side must name one of this question's option ids")
        elif q.options_given and ids and value not in ids:
            ctx.error(f"{where}.{name}", f"{_quote(value)} is not one of this question's option ids")
    # Decided here: side by side means at least two sides, each a different take.
    if len(names) < 2:
        ctx.error(where, "map at least two sides (e.g. left and right) to option ids")
    elif len(set(v for v in names.values() if isinstance(v, str))) < sum(isinstance(v, str) for v in names.values()):
        ctx.error(where, "two sides name the same option; each side shows a different take")


def _check_randomized(ctx: _Lint, sides: dict[str, Any], where: str) -> None:
    randomized = sides.get("randomized")
    message = (
        "the sides are not marked as drawn at random, so the person may learn which side is which; "
        "set randomized to true only when a pair tool drew them at random (a fixed order keeps this warning)"
    )
    if "randomized" not in sides:
        ctx.warning(f"{where}.randomized", message)
    elif not isinstance(randomized, bool):
        ctx.error(f"{where}.randomized", "randomized must be true or false")
    elif randomized is False:
        ctx.warning(f"{where}.randomized", message)


# ---------------------------------------------------------------- media


def _check_media(ctx: _Lint, q: _Question) -> None:
    for i, item in enumerate(_list(q.raw, "media") or []):
        if isinstance(item, dict):
            _check_media_item(ctx, item, f"{q.where}.media[{i}]")


def _check_media_item(ctx: _Lint, item: dict[str, Any], where: str) -> None:
    _check_unknown(ctx, item, "media", where)
    src, figure = item.get("src"), item.get("figure")
    if figure is not None:
        if src is not None:
            ctx.error(f"{where}.src", "a drawn figure has no src; keep either the figure or the src")
        elif _blank(_str(item, "alt")):
            # Decided here: a figure is a picture too, so it needs alt like an image.
            ctx.warning(f"{where}.alt", "add alt: a short description of the figure for people who can't see it")
        return
    if src is None:
        ctx.error(where, "give the media item a src (a file) or a figure (a drawn figure)")
        return
    if not isinstance(src, str):
        return  # a type error
    if not src.strip():
        ctx.error(f"{where}.src", "src is empty; name the media file")
        return
    kind = _media_kind(ctx, item, src, where)
    resolved = media_rules.resolve(src, ctx.media_roots, ctx.fs)
    if resolved.status == "outside":
        ctx.error(
            f"{where}.src",
            f"{_quote(src)} is outside the set folder and its media roots; "
            "move the file there or add its folder to media_roots",
        )
    elif resolved.status == "missing":
        ctx.error(f"{where}.src", f"{_quote(src)} was not found in the set folder or its media roots")
    if kind == "image" and _blank(_str(item, "alt")):
        ctx.warning(f"{where}.alt", "add alt: a short description of the image for people who can't see it")
    if kind == "video" and resolved.ok and resolved.path is not None:
        _check_codecs(ctx, resolved.path, src, where)


def _media_kind(ctx: _Lint, item: dict[str, Any], src: str, where: str) -> str | None:
    declared = item.get("type")
    if declared is not None:
        return declared if declared in ("video", "audio", "image") else None  # else a type error
    kind = media_rules.media_type(src)
    if kind is None:
        ctx.error(f"{where}.type", f"the type can't be told from {_quote(src)}; set type to video, audio or image")
    return kind


def _check_codecs(ctx: _Lint, path: str, src: str, where: str) -> None:
    if ctx.probe is None:
        return
    try:
        streams = ctx.probe(path)
    except Exception:  # an injected probe runs an outside program; its failure must not stop lint
        streams = None
    if streams is None:
        ctx.warning(f"{where}.src", f"{_quote(src)} could not be read by the codec probe; check that it is a playable video")
    elif not media_rules.playable_everywhere(streams):
        found = ", ".join(streams.video + streams.audio) or "no streams"
        ctx.warning(
            f"{where}.src",
            f"{_quote(src)} is {found}; re-encode it as H.264 video with AAC or MP3 sound (or none) so every browser plays it",
        )


# ---------------------------------------------------------------- show_if, status, rev


def _check_show_if(ctx: _Lint, q: _Question, by_id: dict[str, _Question]) -> None:
    show_if = _dict(q.raw, "show_if")
    if show_if is None:
        return
    where = f"{q.where}.show_if"
    _check_unknown(ctx, show_if, "show_if", where)
    target_id = _str(show_if, "question")
    if target_id is None:
        return
    if target_id == q.id:
        ctx.error(f"{where}.question", "a question can't depend on its own answer; name another question")
        return
    target = by_id.get(target_id)
    if target is None:
        ctx.error(f"{where}.question", f"{_quote(target_id)} is not a question in this set")
        return
    picks = _list(show_if, "option")
    if picks is None or not all(isinstance(p, str) for p in picks):
        return
    if not picks:
        ctx.error(f"{where}.option", f"name at least one option of {_quote(target_id)} that shows this question")
    elif unknown := [p for p in picks if p not in target.option_ids]:
        ctx.error(f"{where}.option", f"{', '.join(_quote(p) for p in unknown)} not among the option ids of {_quote(target_id)}")


def _check_status(ctx: _Lint, q: _Question, by_id: dict[str, _Question]) -> None:
    status = q.raw.get("status")
    if status == "superseded":
        by = q.raw.get("superseded_by")
        if by is None or (isinstance(by, str) and not by.strip()):
            ctx.error(f"{q.where}.superseded_by", "a superseded question needs superseded_by: the id of the question that replaces it")
        elif isinstance(by, str) and (by not in by_id or by == q.id):
            ctx.error(f"{q.where}.superseded_by", f"{_quote(by)} must name another question in this set")
    elif status == "withdrawn":
        reason = q.raw.get("reason")
        if reason is None or (isinstance(reason, str) and not reason.strip()):
            ctx.error(f"{q.where}.reason", "a withdrawn question needs a reason")


def _check_rev_and_supersedes(ctx: _Lint, q: _Question) -> None:
    rev = q.raw.get("rev")
    if _is_int(rev) and rev < 1:
        ctx.error(f"{q.where}.rev", f"rev is {rev}; revisions start at 1")
    supersedes = _str(q.raw, "supersedes")
    if supersedes is None:
        return
    match = SUPERSEDES_PATTERN.fullmatch(supersedes)
    if match is None or _id_problem(match["id"]) is not None:
        ctx.error(f"{q.where}.supersedes", 'write it as "<old id>" or "<old id>@<rev>" (rev a whole number from 1)')
    elif match["id"] == q.id:
        # Decided here: a question replaces another one; its own new revision just raises rev.
        ctx.error(f"{q.where}.supersedes", "a question can't supersede itself; raise its rev instead")


# ---------------------------------------------------------------- subject


def _check_subject(ctx: _Lint, q: _Question) -> None:
    subject = _dict(q.raw, "subject")
    if subject is None:
        return
    where = f"{q.where}.subject"
    _check_unknown(ctx, subject, "subject", where)
    for key in ("id", "digest"):
        value = _str(subject, key)
        if value is None:
            continue
        if not value.strip():
            ctx.error(f"{where}.{key}", f"subject {key} must not be empty: it names exactly what is approved")
        elif len(value) > SUBJECT_MAX:
            ctx.error(f"{where}.{key}", f"subject {key} is {len(value)} characters long; {SUBJECT_MAX} at most")


# ---------------------------------------------------------------- study mode


def _check_study(ctx: _Lint, q: _Question) -> None:
    if q.kind is not None and q.kind not in STUDY_KINDS:
        ctx.error(f"{q.where}.kind", f"a study set asks choice or text questions only, not {q.kind}")
    if _blank(_str(q.raw, "topic")):
        ctx.warning(f"{q.where}.topic", "add a topic: the review scores the question under it")
    points = q.raw.get("points")
    if points is not None and not (_is_number(points) and math.isfinite(points) and points > 0):
        ctx.error(f"{q.where}.points", "points must be a number above 0")
    if q.kind == "choice" and q.options_given:
        _check_study_options(ctx, q)
    if q.kind == "text" and not _has_grading(q.raw):
        ctx.error(f"{q.where}.rubric", "a quiz text question needs a rubric or a model_answer for the grader")


def _check_study_options(ctx: _Lint, q: _Question) -> None:
    correct = sum(1 for _, o in q.options if o.get("correct") is True)
    if correct != 1:
        ctx.error(f"{q.where}.options", f"mark exactly one option correct: true (now {correct})")
    for where, option in q.options:
        why = option.get("why")
        if why is None or (isinstance(why, str) and not why.strip()):
            ctx.error(f"{where}.why", "say why this option is right, or the mistake it stands for")


def _has_grading(raw: dict[str, Any]) -> bool:
    rubric, model_answer = raw.get("rubric"), raw.get("model_answer")
    if rubric is not None and not (isinstance(rubric, str) and not rubric.strip()) and rubric != []:
        return True
    return model_answer is not None and not (isinstance(model_answer, str) and not model_answer.strip())


# ---------------------------------------------------------------- across questions


def _check_across_questions(ctx: _Lint, questions: list[_Question]) -> None:
    open_questions = [q for q in questions if q.is_open]
    if isinstance(ctx.raw.get("questions"), list) and not open_questions:
        ctx.error("questions", "at least one question must be open")
    limit = MAX_OPEN[ctx.mode]
    if len(open_questions) > limit:
        ctx.warning("questions", f"{len(open_questions)} open questions; keep it to {limit} or split the set")
    _check_unique_among_open(ctx, open_questions, "title", "title")
    _check_unique_among_open(ctx, open_questions, "question", "question")
    _check_first_option_guesses(ctx, open_questions)


def _check_unique_among_open(ctx: _Lint, open_questions: list[_Question], key: str, noun: str) -> None:
    seen: dict[str, _Question] = {}
    for q in open_questions:
        value = _str(q.raw, key)
        if value is None or not value.strip():
            continue
        norm = " ".join(value.split()).casefold()
        if norm in seen:
            other = seen[norm].id or "another question"
            ctx.error(f"{q.where}.{key}", f"the open question {_quote(other)} has the same {noun}; make each {noun} distinct")
        else:
            seen[norm] = q


def _check_first_option_guesses(ctx: _Lint, open_questions: list[_Question]) -> None:
    # Read as: among the open questions whose guess names one option, there
    # are three or more and every one of them guesses its first option; a
    # pattern that teaches the person to pick the top answer.
    guessed = [q for q in open_questions if q.kind in SINGLE_PICK_KINDS and isinstance(_str(_get(q.raw, "guess"), "option"), str)]
    if len(guessed) < FIRST_OPTION_GUESS_MIN:
        return
    if all(q.option_ids and q.raw["guess"]["option"] == q.option_ids[0] for q in guessed):
        ctx.warning("questions", "every guess is the first option; put the options in an order that does not give the guess away")
