"""``agent_api.media_quota``: the bytes one agent's set folders may hold.

``media_max`` bounds one file only: one agent sending 100 MB after 100 MB
filled the disk, and then every other agent's uploads and people's
attachments in every set failed to save.  An upload is counted against
every file in the agent's set folders (its media, its sets' own files, the
files people sent with their answers) as they are on disk, plus what its
other uploads under way have received so far: many at once are refused as
one would be."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

from bridge.agents.errors import QuotaExceeded
from bridge.agents.owner import read_owner
from bridge.wholefile import writer_of

# agent_api.media_quota's default (the config's own): far past what a set's
# media take, so only an agent filling the disk meets it.
DEFAULT_MEDIA_QUOTA = 10 * 1024 ** 3


class MediaQuota:
    def __init__(self, root: Path, limit: int = DEFAULT_MEDIA_QUOTA):
        self.root = Path(root)
        self.limit = limit
        # Agent -> its uploads under way (on the event loop only).
        self._under_way: dict[str, set[Charge]] = {}

    @contextlib.asynccontextmanager
    async def charge(self, agent: str, final: Path, expected: int | None) -> AsyncIterator[Charge]:
        """An upload into ``final`` counted while it runs: QuotaExceeded at
        once when ``expected`` bytes would pass the quota, else as the bytes
        come (``Charge.take``)."""
        under_way = self._under_way.setdefault(agent, set())
        charge = Charge(self.limit, under_way)
        # Counted before the walk: a file landing meanwhile is counted (maybe
        # twice, seen on disk too), never missed.
        under_way.add(charge)
        try:
            charge.held, charge.replaced = await asyncio.to_thread(held_by, self.root, agent, final)
            charge.check(expected or 0)
            yield charge
        finally:
            under_way.discard(charge)
            if not under_way and self._under_way.get(agent) is under_way:
                del self._under_way[agent]


class Charge:
    """One upload's view of its agent's bytes."""

    def __init__(self, limit: int, under_way: set[Charge]):
        self.limit = limit
        self._under_way = under_way
        self.held = 0  # the agent's bytes on disk when the upload began
        self.replaced = 0  # the file of the same name's, which this one replaces
        self.landed = 0  # what the agent's other uploads stored since (each one's difference)
        self.received = 0

    def take(self, size: int) -> None:
        """``size`` more bytes received; QuotaExceeded once past the quota."""
        self.received += size
        self.check(0)

    def check(self, more: int) -> None:
        used = self.held + self.landed + sum(c.received for c in self._under_way if c is not self)
        size = self.received + more
        # Only a difference counts: a file no larger than the one it replaces
        # is taken even from an agent already past the quota.
        if size > self.replaced and used - self.replaced + size > self.limit:
            instead = f" in place of one of {self.replaced} bytes" if self.replaced else ""
            raise QuotaExceeded(
                f"over this agent's media quota (agent_api.media_quota, {self.limit} bytes): its sets hold "
                f"{used} bytes, and this file {'of' if more else 'at'} {size} bytes{instead} would take them "
                f"to {used - self.replaced + size}", used=max(used, 0), limit=self.limit)

    def stored(self) -> None:
        """The file is under its name: the agent's other uploads under way
        count its difference from now on (their walk may have missed it)."""
        for other in self._under_way:
            if other is not self:
                other.landed += self.received - self.replaced


def held_by(root: Path, agent: str, final: Path) -> tuple[int, int]:
    """(the bytes of every file in ``agent``'s set folders, those of
    ``final``), symlinks passed over and never followed; read on a thread:
    an agent's thousands of files take a while."""
    total = 0
    try:
        with os.scandir(root) as entries:
            folders = [e.path for e in entries if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    except OSError:
        folders = []
    for folder in folders:
        owner = read_owner(folder)
        if owner is not None and owner.agent == agent:
            total += folder_bytes(folder)
    return total, file_bytes(final)


def folder_bytes(folder: str) -> int:
    """The bytes of the regular files in ``folder`` and its subfolders; a
    temporary file being written is no file yet (an upload under way is
    counted by what it received)."""
    total = 0
    for parent, _folders, names in os.walk(folder, followlinks=False):
        for name in names:
            if writer_of(name) is None:
                total += file_bytes(Path(parent) / name)
    return total


def file_bytes(path: Path) -> int:
    """A regular file's size; 0 for anything else or nothing (a symlink counts as nothing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0
