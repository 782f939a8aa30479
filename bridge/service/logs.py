"""Logging set-up: plain lines or JSON lines, and never a secret."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

# Anything after a key that names a secret (quoted whole, or up to a
# separator), after "Bearer", and the tokens Matrix servers hand out, which
# say what they are by their prefix (Synapse's syt_, the authentication
# service's mat_ and mct_).
_KEYS = r"access_token|as_token|hs_token|password|webhook_secret|secret|token"
_SECRET = re.compile(rf"((?:{_KEYS})[\"']?\s*[:=]\s*|\bBearer\s+)(\"[^\"]*\"|'[^']*'|[^\s\"'&,}}]+)"
                     r"|\b((?:syt|mat|mct)_[A-Za-z0-9_]+)", re.IGNORECASE)


def why(exc: BaseException) -> str:
    """An exception in a log line's words: its message, or its kind when it
    has none (a timeout's is empty: "not handled ()" told nothing)."""
    return str(exc) or type(exc).__name__


def in_a_line(exc: BaseException, limit: int = 300) -> str:
    """``why``, on one line and at most ``limit`` characters (a driver's
    message runs over lines: "connection refused\\n\\tIs the server running?")."""
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


def redact(text: str) -> str:
    return _SECRET.sub(lambda m: m.group(3)[:4] + "…" if m.group(3) else m.group(1) + "[redacted]", text)


class _Redacting(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # Redacted before JSON escapes its quotes, where the patterns look for them.
        line = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + "Z",
                "level": record.levelname.lower(), "logger": record.name, "message": redact(record.getMessage())}
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Json() if fmt == "json" else _Redacting("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # nio logs every request at INFO; keep its warnings (429s, retries) only.
    logging.getLogger("nio").setLevel(logging.WARNING)
    # nio's key store logs every SQL statement at DEBUG, pickled keys and sessions included.
    logging.getLogger("peewee").setLevel(logging.WARNING)
