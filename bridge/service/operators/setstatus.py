"""How each set stands: what was posted, answered, is still pending or stale.

Shared by ``askwright-bridge status`` and the ``!ask status`` command.  The
answer side is computed from ``read``'s own view (bridge/answers/view.py) (answers.json checked
against the current questions.json), never re-derived, so ``status`` and
``read`` can't disagree; what was posted comes from the store.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bridge.answers.document import ANSWERED, EXPIRED, NOTE_ONLY, PENDING, UNSURE
from bridge.answers.read import UNANSWERED
from bridge.answers.view import ReadError, load_view
from bridge.questionset.lint.posted import revs_went_back
from bridge.questionset.load import LoadError
from bridge.questionset.setdir import QUESTIONS_FILE, read_questions
from bridge.service.posting.sets import discover, duplicate_set_message, load_set

COLUMNS = ("posted", "open", "answered", "unsure", "notes", "pending", "expired", "stale")


@dataclass(frozen=True)
class SetStatus:
    set_id: str
    set_dir: str
    posted: int = 0    # distinct questions the bridge ever posted for this set
    open: int = 0      # questions open in questions.json now
    answered: int = 0  # records with a pick
    unsure: int = 0    # records whose pick is "unsure"
    notes: int = 0     # records with a note or files but no pick
    pending: int = 0   # open questions still waiting: no record at all, or votes short of the quorum
    expired: int = 0   # questions whose deadline passed undecided (never an approval)
    stale: int = 0     # records answering an older revision of their question
    problem: str | None = None  # why the set could not be read; the counts are then 0
    warnings: tuple[str, ...] = ()  # what lint would warn of against the store (a rev that went back)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_view(view: dict[str, Any]) -> dict[str, int]:
    """The answer-side counts of a ``read --all`` view."""
    entries = view["answers"]
    return {
        "open": sum(1 for e in entries if e["status"] == "open"),
        "answered": sum(1 for e in entries if e["state"] == ANSWERED),
        "unsure": sum(1 for e in entries if e["state"] == UNSURE),
        "notes": sum(1 for e in entries if e["state"] == NOTE_ONLY),
        "pending": sum(1 for e in entries if e["state"] in (UNANSWERED, PENDING) and e["status"] == "open"),
        "expired": sum(1 for e in entries if e["state"] == EXPIRED),
        "stale": sum(1 for e in entries if e["stale"] is True),
    }


def set_status(set_dir: Path, posted: Mapping[str, int],
               revs: Mapping[str, Mapping[str, int]] | None = None) -> SetStatus:
    """``posted``: set folder (resolved) -> distinct questions it posted;
    ``revs``: set folder (resolved) -> question id -> highest rev posted."""
    count = _of_folder(posted, set_dir, 0)
    try:
        view = load_view(set_dir, include_all=True)
    except ReadError as exc:
        # The questions already posted stay open: an agent's half-written or
        # broken file is no reason to take them from the people answering.
        kept = f"; its {count} posted questions stay open" if count else ""
        return SetStatus(set_id_of(set_dir), str(set_dir), posted=count, problem=exc.message + kept)
    posted_revs = _of_folder(revs or {}, set_dir, {})
    skipped = lint_problem(set_dir, posted_revs)
    return SetStatus(view["set"], str(set_dir), posted=count, **count_view(view),
                     warnings=(*((skipped,) if skipped else ()),
                               *went_back(set_dir, posted_revs)))


def lint_problem(set_dir: Path, revs: Mapping[str, int]) -> str | None:
    """Why the bridge skips the set (read by its own rule: a posted revision
    whose fixed deadline passed, a set whose every question is closed, are
    no mistake), said under its row (the questions it posted before stay
    open, and are counted): it showed as a healthy set waiting for answers,
    its agent's ``wait`` hung for ever."""
    qset, errors = load_set(set_dir, posted_revs_of=lambda _resolved: revs)
    if qset is not None:
        return None
    more = f" (and {len(errors) - 1} more; `askwright-bridge lint` lists them)" if len(errors) > 1 else ""
    return f"not posted: {errors[0]}{more}"


def went_back(set_dir: Path, revs: Mapping[str, int]) -> tuple[str, ...]:
    """Lint's "rev went back" warnings for the set, as lines ("where: message")."""
    if not revs:
        return ()
    try:
        raw = read_questions(str(set_dir / QUESTIONS_FILE))
    except LoadError:
        return ()  # read a moment ago by the view: changed since, and said at the next look
    return tuple(f"{f.where}: {f.message}" for f in revs_went_back(raw, revs))


def collect(root: Path, posted: Mapping[str, int],
            revs: Mapping[str, Mapping[str, int]] | None = None) -> list[SetStatus]:
    """Every set under ``root``, in the order the bridge scans them.  A second
    folder under a set id already taken (the folder that has posted keeps it,
    else the first found) is a row saying so, as the bridge refuses it."""
    unreadable: list[OSError] = []
    folders = discover(root, unreadable)
    ids = [set_id_of(folder) for folder in folders]
    owner: dict[str, Path] = {}
    for folder, set_id in sorted(zip(folders, ids), key=lambda pair: not set_status_posted(pair[0], posted)):
        owner.setdefault(set_id, folder)
    rows = []
    for folder, set_id in zip(folders, ids):
        first = owner[set_id]
        if first != folder:
            rows.append(SetStatus(set_id, str(folder), problem=duplicate_set_message(set_id, str(first), str(folder))))
        else:
            rows.append(set_status(folder, posted, revs))
    # A folder that posted and is still there, its questions.json gone (or
    # never a set's to discover again): its questions stay open, taking
    # answers, so it has its row, saying why, rather than none at all.
    seen = {os.path.realpath(folder) for folder in folders}
    top = os.path.realpath(root)
    for folder in sorted(posted):
        if posted[folder] and folder not in seen and os.path.dirname(folder) == top and os.path.isdir(folder):
            rows.append(set_status(Path(folder), posted, revs))
    # A folder status could not look into may hold sets: a row saying so,
    # not a table that silently leaves them out ("No sets" for a root it
    # can't read, run as the wrong user).
    for exc in unreadable:
        where = str(exc.filename or root)
        rows.append(SetStatus("?", where, problem=f"can't be read: {exc.strerror or exc}"))
    return rows


def set_status_posted(set_dir: Path, posted: Mapping[str, int]) -> bool:
    return bool(_of_folder(posted, set_dir, 0))


def _of_folder(by_folder: Mapping[str, Any], set_dir: Path, default: Any) -> Any:
    """The store keys a set by its resolved folder; the folder as named is tried too."""
    return by_folder.get(os.path.realpath(set_dir), by_folder.get(str(set_dir), default))


def set_id_of(set_dir: Path) -> str:
    """The id in questions.json, or the folder's name when it has none readable."""
    try:
        raw = read_questions(str(set_dir / QUESTIONS_FILE))
    except LoadError:
        return set_dir.name
    value = raw.get("id")
    return value if isinstance(value, str) and value else set_dir.name


def find_set(root: Path, set_id: str, posted: Collection[str] = ()) -> Path | None:
    """The folder under ``root`` of the set with this id (or folder name).
    Two folders under one id: the one that posted (``posted``: the folders
    that posted under it, as the store keeps them), as ``collect`` and the
    poster decide; a command went to the first found, which the bridge refuses."""
    found, by_name = [], None
    for set_dir in discover(root):
        if set_id_of(set_dir) == set_id:
            found.append(set_dir)
        elif by_name is None and set_dir.name == set_id:
            by_name = set_dir
    posters = dict.fromkeys(posted, 1)
    return next((d for d in found if set_status_posted(d, posters)), found[0] if found else by_name)


def format_table(rows: list[SetStatus]) -> str:
    """A plain-text table, one line per set, a problem spelled out in place of counts."""
    if not rows:
        return "no sets\n"
    header = ("SET", *(c.upper() for c in COLUMNS))
    lines = [[row.set_id, *(str(getattr(row, c)) for c in COLUMNS)] if row.problem is None
             else [row.set_id, str(row.posted), *("-" for _ in COLUMNS[1:])] for row in rows]
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]

    def join(cells: list[str] | tuple[str, ...]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])

    out = [join(header)]
    for row, line in zip(rows, lines):
        out.append(join(line) + (f"  ({' '.join(row.problem.split())})" if row.problem else ""))
        out.extend(f"  warning: {' '.join(warning.split())}" for warning in row.warnings)
    return "\n".join(out) + "\n"
