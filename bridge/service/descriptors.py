"""The process's descriptor limit, raised at start to what the system allows.

A service manager's default soft limit is 1024, and every listener
connection, download, set folder watch and database connection takes one:
hundreds of agents' long polls, or a few hundred silent connections, used
to exhaust it (accept() failing, a file the bridge writes refused).  The
hard limit is the operator's word on what the bridge may hold; the soft one
is only a default."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def raise_to_hard_limit() -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.info("descriptor limit left at %d (%s)", soft, exc)
