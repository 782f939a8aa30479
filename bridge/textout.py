"""Standard output and error that can't write every character (``LC_ALL=C``
without Python's UTF-8 coercion, ``PYTHONIOENCODING=ascii``, a Latin-1
terminal): a character they can't write goes out as JSON's own escape
(``\\u00ef``, a surrogate pair beyond the first plane), not as a traceback.

JSON is what ``read``, ``wait`` and ``status --json`` print, and every
character outside ASCII in it stands inside a string, so what they print
stays JSON meaning exactly the same; in a message the escape still says
which character it was.
"""

from __future__ import annotations

import codecs
import sys

ERRORS = "askwright-json-escape"


def _json_escape(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    escaped = []
    for char in exc.object[exc.start:exc.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            escaped.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            escaped.append(f"\\u{code:04x}")
    return "".join(escaped), exc.end


codecs.register_error(ERRORS, _json_escape)


def escape_what_cannot_be_written() -> None:
    """Set the standard streams' error handler unless they write UTF."""
    for stream in (sys.stdout, sys.stderr):
        encoding = codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name
        if not encoding.startswith("utf") and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=ERRORS)
