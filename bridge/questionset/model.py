"""The askwright question-set format (``questions.json``) as typed models.

The models check types and shapes only; the format's rules (what is an error
and what a warning) live in ``lint``, which needs to report every finding
rather than stop at the first.  Unknown fields are kept (``extra="allow"``)
so lint can warn about them instead of the loader crashing.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

KINDS = ("choice", "multi", "compare", "rank", "text", "scale", "confirm")
Kind = Literal["choice", "multi", "compare", "rank", "text", "scale", "confirm"]
Status = Literal["open", "closed", "superseded", "withdrawn"]
Number = Union[StrictInt, float]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=False)

    @property
    def unknown_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class Option(_Model):
    id: StrictStr
    label: StrictStr
    consequence: StrictStr | None = None
    # study mode
    correct: StrictBool | None = None
    why: StrictStr | None = None


class Guess(_Model):
    """One shape for every kind; lint checks the field the kind needs."""

    option: StrictStr | None = None
    options: list[StrictStr] | None = None
    order: list[StrictStr] | None = None
    text: StrictStr | None = None
    why: StrictStr | None = None
    confidence: Literal["high", "low"] | None = None


class MediaItem(_Model):
    src: StrictStr | None = None
    type: Literal["video", "audio", "image"] | None = None
    start: Number | StrictStr | None = None
    label: StrictStr | None = None
    alt: StrictStr | None = None
    caption: StrictStr | None = None
    figure: dict[str, Any] | None = None


class ShowIf(_Model):
    question: StrictStr
    option: list[StrictStr]


class OnePagerBlock(_Model):
    type: Literal["text", "facts", "options_compared", "table", "image", "chart", "video", "audio"]


class Subject(_Model):
    """The bridge's one extension: binds an approval to exactly one thing."""

    id: StrictStr
    digest: StrictStr


class Quorum(_Model):
    """How many people must agree, and the options that decide at once (PROTOCOL 2a)."""

    required: StrictInt
    veto: list[StrictStr] = Field(default_factory=list)


class Escalate(_Model):
    """Who is brought in, and when, if nothing is decided by then."""

    after: StrictStr
    to: list[StrictStr]


class Question(_Model):
    id: StrictStr
    kind: Kind
    title: StrictStr
    question: StrictStr
    why: StrictStr | None = None
    hint: StrictStr | None = None
    look_for: list[StrictStr] | None = None
    options: list[Option] | None = None
    guess: Guess | None = None
    sides: dict[str, StrictStr | StrictBool] | None = None
    media: list[MediaItem] | None = None
    show_if: ShowIf | None = None
    one_pager: list[OnePagerBlock] | None = None
    status: Status = "open"
    superseded_by: StrictStr | None = None
    reason: StrictStr | None = None
    rev: StrictInt = 1
    supersedes: StrictStr | None = None
    # study mode
    topic: StrictStr | None = None
    points: Number | None = None
    bonus: StrictBool | None = None
    shuffle: StrictBool | None = None
    rubric: StrictStr | list[StrictStr] | None = None
    model_answer: StrictStr | None = None
    # bridge extensions
    subject: Subject | None = None
    expires: StrictStr | None = None  # a duration from the first posting, or an RFC 3339 time
    answerers: list[StrictStr] | None = None  # Matrix user ids who may answer it
    quorum: Quorum | None = None
    escalate: Escalate | None = None

    @property
    def is_open(self) -> bool:
        return self.status == "open"

    def option(self, option_id: str) -> Option | None:
        for opt in self.options or ():
            if opt.id == option_id:
                return opt
        return None

    def expires_for(self, qset: "QuestionSet") -> str | None:
        """This question's ``expires``, or the set's default."""
        return self.expires if self.expires is not None else qset.expires

    @property
    def side_map(self) -> dict[str, str]:
        """Option id -> side name, from ``sides`` (``randomized`` left out)."""
        return {v: k for k, v in (self.sides or {}).items() if k != "randomized" and isinstance(v, str)}


class QuestionSet(_Model):
    askwright: StrictInt
    id: StrictStr
    title: StrictStr
    context: StrictStr | None = None
    asked_by: StrictStr | None = None
    mode: Literal["decide", "study"] = "decide"
    media_roots: list[StrictStr] = Field(default_factory=list)
    # bridge extension: the default ``expires`` of its questions
    expires: StrictStr | None = None
    questions: list[Question]

    def question(self, qid: str) -> Question | None:
        for q in self.questions:
            if q.id == qid:
                return q
        return None

    @property
    def open_questions(self) -> list[Question]:
        return [q for q in self.questions if q.is_open]


