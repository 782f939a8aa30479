"""How a read of a room's ``/messages`` goes from page to page.  No I/O of
its own: the caller hands over how a page is fetched.

A page may be empty and still not the last (the spec, and Synapse): every
event of it hidden from the reader (a room whose history members see only
from their join, read across a time the reader was out of it), or left out
by the read's filter.  A read that stopped at the first empty page left
what came after unread.  So a read goes on while the homeserver names a
new ``end`` to go on from, but a server that kept answering empty pages
must not hold a read for ever: at most ``EMPTY_PAGES_AT_MOST`` in a row.
Shared by every read of the kind (the timeline reads of both modes, the
checkpoints ``verify --room`` reads back), so they all stop by one rule."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

EMPTY_PAGES_AT_MOST = 20


class Paged(Protocol):
    """What the rule reads of a page: its events and where to go on from."""

    @property
    def chunk(self) -> Sequence[Any]: ...

    @property
    def end(self) -> str | None: ...


@dataclass(frozen=True)
class Page:
    """A page as a plain ``/messages`` body gives it (``page_of``)."""

    chunk: Sequence[Any]
    end: str | None


def page_of(body: dict[str, Any]) -> Page:
    """A ``/messages`` response body as a page: a ``chunk`` or ``end`` of the wrong type is none."""
    chunk, end = body.get("chunk"), body.get("end")
    return Page(chunk if isinstance(chunk, list) else [], end if isinstance(end, str) else None)


P = TypeVar("P", bound=Paged)


async def pages(fetch: Callable[[str | None], Awaitable[P]], start: str | None,
                gave_up: Callable[[int], None]) -> AsyncIterator[P]:
    """The pages ``fetch`` gives from ``start`` on, each from the last one's
    ``end``, until one names no ``end`` (or the one it was fetched from);
    ``gave_up(n)`` when ``n`` empty pages in a row ended the read instead."""
    empty = 0
    while True:
        page = await fetch(start)
        yield page
        if not page.end or page.end == start:
            return
        empty = 0 if page.chunk else empty + 1
        if empty >= EMPTY_PAGES_AT_MOST:
            gave_up(empty)
            return
        start = page.end
