"""What a person is told about a file of theirs the bridge did not keep:
the file by the name they sent it under, and the reason.  Pure."""

from __future__ import annotations

import unicodedata

from bridge.protocol.annotate import MAX_ATTACHMENTS
from bridge.protocol.graphemes import shorten

_NAME_CHARS = 60
MIB = 1024 * 1024


def size_words(limit: int) -> str:
    """``20 MB`` for 20 MiB (people say MB), ``12.5 MB``, ``512 KB``,
    ``1.95 KB``; never a figure below the limit's own (a 2000-byte limit
    was "1 KB": a 1.5 KB file, told it is larger, would be within it)."""
    if limit >= MIB:
        return f"{limit // MIB} MB" if limit % MIB == 0 else f"{limit / MIB:.1f} MB"
    if limit < 1024:
        return f"{limit} bytes"
    return f"{limit // 1024} KB" if limit % 1024 == 0 else f"{limit / 1024:.2f} KB"


def shown_name(filename: object) -> str | None:
    """The sent name as it can be shown: no control or direction marks, clipped."""
    if not isinstance(filename, str):
        return None
    name = "".join(c for c in filename if unicodedata.category(c)[0] != "C").strip()
    if not name:
        return None
    return shorten(name, _NAME_CHARS)


def file_problem(reason: str, filename: object = None, limit: int = 20 * MIB) -> str:
    """The sentence for a file not kept for ``reason`` (a reason code of docs/reason-codes.md)."""
    name = shown_name(filename)
    the_file = f"The file “{name}”" if name else "The file"
    if reason == "attachment_too_large":
        return f"{the_file} is larger than the {size_words(limit)} an answer may carry."
    if reason == "too_many_attachments":
        return f"{the_file} was not kept: an answer holds at most {MAX_ATTACHMENTS} files."
    if reason == "attachment_encrypted":
        return f"{the_file} could not be decrypted (what arrived does not match its key and hash). " \
               "Please send it again."
    if reason == "attachment_not_fetched":
        return f"{the_file} could not be downloaded whole. Please send it again."
    if reason == "attachment_unreachable":
        return f"{the_file} could not be downloaded: the homeserver holding it could not be reached for half " \
               "a minute. Please send it again once it is back."
    if reason == "attachment_rate_limited":
        return f"{the_file} could not be downloaded: the homeserver kept asking the bridge to wait, for five " \
               "minutes. Please send it again a little later."
    if reason == "attachment_download_failed":
        return f"{the_file} could not be downloaded: the homeserver does not have it. Please send it again."
    if reason == "attachment_misplaced":
        return f"{the_file} was not kept: files are taken when sent as a reply to the question itself " \
               "(or to its poll, or in its thread). Please send it there."
    if reason == "attachment_not_saved":
        return f"{the_file} could not be saved beside the answers. Please tell the people who run the bridge."
    return f"{the_file} could not be kept."
