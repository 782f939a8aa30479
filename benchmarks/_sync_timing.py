"""The homeserver's side of each long poll: when Synapse received a /sync
request and when it finished answering it, from its access log.

    latency.py --hs-timing

turns Synapse's access log on (``synapse.access``, one line per request
answered, with the wall-clock time it finished and how long it took) and,
for every answer, finds the /sync request that delivered it to the bridge
and the one that delivered it to the observer (the last one to finish
before each noted the answer).  Whether the bridge's request was already
waiting when the answer was sent, and how much later than the observer's
it was answered, say where the bridge's delivery time goes.
"""

from __future__ import annotations

import bisect
import re
import time
from pathlib import Path
from typing import Any

import yaml

from _world import percentile

# 2026-.. "1733094000.123456 synapse.access.http.8008 127.0.0.1 - 8008 - {@bot:localhost} Processed request:
# 0.012sec/0.000sec ... "GET /_matrix/client/v3/sync?... HTTP/1.1" ..."
LINE = re.compile(r'^(?P<at>\d+\.\d+) \S+ .*? - \{(?P<user>[^}]*)\} Processed request: '
                  r'(?P<took>[\d.]+)sec/(?P<send>-?[\d.]+)sec .*?"GET (?P<path>\S*/sync\S*) ')


def enable_access_log() -> None:
    """Every Synapse started after this logs each request it answers to
    ``access.log`` in its data folder (the time as seconds since the epoch)."""
    from bridge import devserver

    if getattr(devserver.Synapse, "_access_logged", False):
        return
    write = devserver.Synapse._write_log_config

    def with_access_log(self: Any) -> Path:
        path = write(self)
        config = yaml.safe_load(path.read_text())
        config["formatters"]["timed"] = {"format": "%(created).6f %(name)s %(message)s"}
        config["handlers"]["access"] = {"class": "logging.FileHandler", "formatter": "timed",
                                        "filename": str(self.data_dir / "access.log")}
        config["loggers"] = {"synapse.access": {"level": "INFO", "handlers": ["access"], "propagate": False}}
        path.write_text(yaml.safe_dump(config))
        return path

    devserver.Synapse._write_log_config = with_access_log  # type: ignore[method-assign]
    devserver.Synapse._access_logged = True  # type: ignore[attr-defined]


def wall_minus_perf() -> float:
    """time.time() - time.perf_counter(): the access log's clock from the bench's."""
    return time.time() - time.perf_counter()


def sync_requests(path: Path) -> dict[str, list[tuple[float, float]]]:
    """user id -> (received, finished) of each /sync answered, by finish, in perf_counter time."""
    offset = wall_minus_perf()
    found: dict[str, list[tuple[float, float]]] = {}
    if not path.exists():
        return found
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        finished = float(m["at"]) - offset
        received = finished - float(m["took"]) - max(0.0, float(m["send"]))
        user = m["user"].rpartition("|")[2]
        found.setdefault(user, []).append((received, finished))
    for requests in found.values():
        requests.sort(key=lambda r: r[1])
    return found


def delivering(requests: list[tuple[float, float]], noted: float) -> tuple[float, float] | None:
    """The request that delivered what was noted at ``noted``: the last to finish before it."""
    finishes = [f for _r, f in requests]
    i = bisect.bisect_right(finishes, noted) - 1
    return requests[i] if i >= 0 else None


def explain(answers: list[tuple[float, float, float, str]], bridge_user: str,
            requests: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """``answers``: (sent, bridge received, observer saw, observer's user id), perf_counter seconds.

    Per answer, the bridge's overhead in delivery split at the homeserver:
    its finish of the bridge's request minus its finish of the observer's
    (the wake order, and a request that came late), then each client's time
    from that finish to holding the parsed response.  And whether the
    bridge's request was already at the homeserver when the observer's was
    answered (else the homeserver could not answer it with the observer's)."""
    finish_gap, bridge_read, observer_read, asked_late_by = [], [], [], []
    waiting = 0
    for sent, bridge_at, observer_at, observer in answers:
        mine = delivering(requests.get(bridge_user, []), bridge_at)
        theirs = delivering(requests.get(observer, []), observer_at)
        if mine is None or theirs is None:
            continue
        finish_gap.append((mine[1] - theirs[1]) * 1000)
        bridge_read.append((bridge_at - mine[1]) * 1000)
        observer_read.append((observer_at - theirs[1]) * 1000)
        if mine[0] <= theirs[1]:
            waiting += 1
        else:
            asked_late_by.append((mine[0] - theirs[1]) * 1000)
    out: dict[str, Any] = {"matched": len(finish_gap), "bridge_asking_when_observer_answered": waiting}
    if finish_gap:
        for name, values in (("finish_after_observer", finish_gap), ("bridge_read", bridge_read),
                             ("observer_read", observer_read)):
            out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = (round(percentile(values, p), 2) for p in (50, 99))
    if asked_late_by:
        out["asked_after_observer_answered_p50_ms"] = round(percentile(asked_late_by, 50), 2)
    return out


def print_explanation(mode: str, label: str, e: dict[str, Any]) -> None:
    if not e["matched"]:
        print(f"{mode} {label}: homeserver side: no request matched (no access log?)")
        return
    late = (f"; the others arrived {e['asked_after_observer_answered_p50_ms']} ms after it at p50"
            if "asked_after_observer_answered_p50_ms" in e else "")
    print(f"{mode} {label}: homeserver side, {e['matched']} answers: the bridge's /sync was at the homeserver "
          f"when the observer's was answered for {e['bridge_asking_when_observer_answered']}{late}; "
          f"the homeserver finished the bridge's {e['finish_after_observer_p50_ms']:+} ms "
          f"(p99 {e['finish_after_observer_p99_ms']:+}) after the observer's; from that finish to the parsed "
          f"response: bridge {e['bridge_read_p50_ms']} ms (p99 {e['bridge_read_p99_ms']}), "
          f"observer {e['observer_read_p50_ms']} ms (p99 {e['observer_read_p99_ms']})")
