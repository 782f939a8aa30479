"""Which of the checkpoint events the rooms hold ``verify --room`` takes.  Pure.

A room's state is open to more than the bridge: any member with the power
to send state can put an event of the checkpoint type there, under any
state key.  So a signature decides, never the event: an event the bridge's
own user sent for the log is taken whatever it holds (one that does not
open is a problem of the log); one sent by anyone else is taken only when
the log's key signed it (a member relaying a real checkpoint), and ignored,
with a note, otherwise: a member could not otherwise make every later audit
fail for good.  Checkpoints the bridge's user signed as another log are
named: the same account signing as two logs is what an auditor handed the
wrong key (``key.txt`` swapped for a new one) would not otherwise see.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bridge.protocol import checkpoint as cp


@dataclass(frozen=True)
class RoomNote:
    room: str
    sender: str
    origin: str  # the event's state key
    note: str
    key: str  # the verifier key the event names ("" when none)


@dataclass
class Taken:
    later: list[str] = field(default_factory=list)  # the notes to check with the export's
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def take(events: list[RoomNote], bridge_user: str, origin: str, public: bytes) -> Taken:
    taken = Taken()
    ignored: Counter[str] = Counter()
    other_logs: dict[tuple[str, str], int] = {}
    for event in events:
        if event.sender == bridge_user and event.origin == origin:
            taken.later.append(event.note)
        elif event.sender == bridge_user:
            other_logs[(event.origin, event.key)] = other_logs.get((event.origin, event.key), 0) + 1
        elif event.origin == origin:
            if _opens(event.note, public, origin):
                taken.later.append(event.note)
            else:
                ignored[event.sender] += 1
    if not taken.later:
        taken.problems.append(f"the rooms hold no checkpoint of the log {origin!r} signed by the key given: "
                              "nothing outside the bridge vouches for it (--room)")
    for (other, key), count in sorted(other_logs.items()):
        taken.notes.append(f"the rooms hold {count} checkpoint(s) the bridge ({bridge_user}) signed as another "
                           f"log, {other!r} (key {key or 'not named'}), not checked here: if the answers were "
                           "given under that log, verify with --key naming its key")
    for sender, count in sorted(ignored.items()):
        taken.notes.append(f"{count} checkpoint event(s) sent by {sender}, not the bridge, are not signed by the "
                           "log's key: ignored")
    return taken


def _opens(note: str, public: bytes, origin: str) -> bool:
    try:
        cp.open_checkpoint(note, public, origin)
    except cp.NoteError:
        return False
    return True
