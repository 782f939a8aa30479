"""Appservice mode: whether the homeserver still answers.

Bot mode hears from its homeserver at least every 30 s (a long poll comes
back), so ``homeserver_silent_seconds`` tells monitoring when it goes away.
An appservice only listens: a homeserver gone while the bridge ran left
/health saying nothing at all for as long.  So what the homeserver pushes
counts as hearing from it, and when nothing came for ``ASK_AFTER``
seconds the bridge asks it something cheap and harmless (its
``/versions``), so the silence a down homeserver leaves grows as in bot
mode, and a quiet but healthy one stays within about 30 s."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from bridge.service.logs import why as said
from bridge.service.eventwait import set_within

log = logging.getLogger(__name__)

ASK_AFTER = 15.0  # seconds without a push before the homeserver is asked
ANSWER_WITHIN = 10.0  # seconds the question may take; more is no answer


async def keep_hearing(client: Any, metrics: Any, stop: asyncio.Event) -> None:
    """Ask the homeserver whenever it has been quiet ``ASK_AFTER`` seconds;
    each answer is heard (``metrics.heard``)."""
    metrics.listening()
    failing = False
    while not await set_within(stop, ASK_AFTER / 3):
        silent = metrics.silent_seconds
        if silent is not None and silent < ASK_AFTER:
            continue
        try:
            response = await asyncio.wait_for(client.send("GET", "/_matrix/client/versions"), ANSWER_WITHIN)
            try:
                answered = response.status == 200
            finally:
                response.release()
            why = f"HTTP {response.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            answered, why = False, said(exc)
        if answered:
            metrics.heard()
            if failing:
                log.info("the homeserver answers again")
            failing = False
        elif not failing:
            failing = True
            log.warning("the homeserver does not answer (%s); /health counts its silence", why)
