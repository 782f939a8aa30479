"""A question's background (askwright's ``one_pager``) as thread messages.

Pure.  The question message only says the background is in its thread (it
never rides in the event, which must stay under Matrix's size limit); this
turns the blocks into the messages the poster sends there:

* text-like blocks (``text``, ``facts``, ``options_compared``, ``table``, a
  ``chart`` given as data) become ``m.notice`` messages with readable HTML,
  tables as ``<table>`` (Element's sanitiser keeps ``table``/``thead``/
  ``tbody``/``tr``/``th``/``td``), packed in order into as few messages as
  fit, each under ``MESSAGE_MAX_BYTES``;
* a block with a file (``image``, ``video``, ``audio``, a ``chart`` with a
  ``src``) becomes a ``Part`` carrying a ``MediaItem``: the poster resolves
  and uploads it like a question's media, and sends the part's own notice
  (which names the file) when it can't.

The format names the block types but not their fields, so the reading is
tolerant: the usual field names are looked for, and a block in which none is
found shows all its fields rather than nothing.  Everything from the set is
escaped; timecodes and link-like runs are shown as code (``esc_timecodes``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bridge.protocol.render import HTML_FORMAT, esc, esc_timecodes, shorten
from bridge.questionset.model import MediaItem

# Each message stays well under the 65,536-byte event limit (the envelope,
# and encryption in an encrypted room, add to the content).
MESSAGE_MAX_BYTES = 60_000
# ... and in an encrypted room, where the ciphertext is about 4/3 of it: a
# 60 KB message went out past the limit once encrypted (M_TOO_LARGE), and the
# background never appeared.
ENCRYPTED_MESSAGE_MAX_BYTES = 44_000
# Room kept in every message for the heading and the message's own keys.
_HEADING_RESERVE = 4_000
_BUDGET = MESSAGE_MAX_BYTES - _HEADING_RESERVE
# A piece of free text never longer than this: even all escapes and code
# marks it stays far under the budget, so one piece always fits a message.
_PIECE_CHARS = 2_000
# A background longer than this many messages is cut with a word saying so:
# the thread is for talking about the question, not for a book.
MAX_MESSAGES = 30
_TITLE_MAX = 200

_FILE_TYPES = {"image": "image", "video": "video", "audio": "audio", "chart": "image"}
_TYPE_NAMES = {"image": "Image", "video": "Video", "audio": "Audio", "chart": "Chart"}
# Fields read as the block's heading and as its caption, whatever the type.
_TITLE_FIELDS = ("title", "heading", "label", "name")
_CAPTION_FIELDS = ("caption", "note", "source")


@dataclass(frozen=True)
class Part:
    """One thread message of the background.

    ``content`` is ready to send (without ``m.relates_to``).  When ``media``
    is set, ``content`` is the fallback that names the file; the poster sends
    the file itself instead when ``media.src`` resolves and uploads.
    """

    content: dict[str, Any]
    media: MediaItem | None = None


@dataclass(frozen=True)
class _Unit:
    """A piece of one block: HTML and plain text, never split further."""

    html: str
    text: str

    @property
    def size(self) -> int:
        return _json_bytes(self.html) + _json_bytes(self.text)


def render_one_pager(
    blocks: Sequence[Mapping[str, Any]], *, title: str, labels: Mapping[str, str] | None = None,
    message_max: int = MESSAGE_MAX_BYTES,
) -> list[Part]:
    """The background of the question titled ``title`` as thread messages, in
    order, each at most ``message_max`` bytes (``ENCRYPTED_MESSAGE_MAX_BYTES``
    in an encrypted room).

    ``labels`` maps the question's option ids to their labels, so an
    ``options_compared`` block that names options by id reads as the message
    does.
    """
    names = dict(labels or {})
    pending: list[_Unit] = []
    # (units of one text message) or (a media block and its fallback unit)
    sections: list[list[_Unit] | tuple[MediaItem, _Unit]] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        media = _media_of(block)
        if media is not None:
            if pending:
                sections.append(pending)
                pending = []
            sections.append((media, _media_unit(block, media)))
            continue
        pending.extend(_block_units(block, names))
    if pending:
        sections.append(pending)
    return _messages(sections, title, message_max - _HEADING_RESERVE)


# ---------------------------------------------------------------- blocks


def _block_units(block: Mapping[str, Any], names: Mapping[str, str]) -> list[_Unit]:
    kind = str(block.get("type", ""))
    units = _heading_units(block)
    if kind == "facts":
        body = _facts_units(block)
    elif kind == "options_compared":
        body = _compared_units(block, names)
    elif kind in ("table", "chart"):
        body = _table_units(block)
    else:
        body = _text_units(block)
    if not body:
        body = _leftover_units(block)
    units.extend(body)
    caption = _first_str(block, _CAPTION_FIELDS)
    if caption:
        units.extend(_paragraph_units(caption, em=True))
    return units


def _heading_units(block: Mapping[str, Any]) -> list[_Unit]:
    heading = _first_str(block, _TITLE_FIELDS)
    if not heading:
        return []
    heading = shorten(heading, _PIECE_CHARS)
    return [_Unit(f"<p><strong>{esc_timecodes(heading)}</strong></p>", heading)]


def _text_units(block: Mapping[str, Any]) -> list[_Unit]:
    text = _first_str(block, ("text", "body", "content", "markdown", "summary"))
    units = _paragraph_units(text) if text else []
    items = block.get("items") or block.get("points") or block.get("bullets")
    if isinstance(items, list):
        units.extend(_list_units([_plain(i) for i in items]))
    return units


def _facts_units(block: Mapping[str, Any]) -> list[_Unit]:
    raw = block.get("items", block.get("facts", block.get("rows")))
    pairs: list[tuple[str | None, str]] = []
    if isinstance(raw, Mapping):
        pairs = [(str(k), _plain(v)) for k, v in raw.items()]
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping):
                label = _first_str(item, ("label", "name", "key", "title", "fact"))
                value = item.get("value", item.get("text", item.get("detail")))
                if value is None and label is None:
                    pairs.append((None, _plain(item)))
                else:
                    pairs.append((label, _plain(value) if value is not None else ""))
            elif isinstance(item, list) and len(item) == 2:
                pairs.append((_plain(item[0]), _plain(item[1])))
            else:
                pairs.append((None, _plain(item)))
    if not pairs:
        return []
    return _list_units(
        [(f"{label}: {value}" if label is not None else value) for label, value in pairs],
        html_items=[
            (f"<strong>{esc_timecodes(shorten(label, _PIECE_CHARS))}:</strong> " if label is not None else "")
            + esc_timecodes(shorten(value, _PIECE_CHARS))
            for label, value in pairs
        ],
    )


def _compared_units(block: Mapping[str, Any], names: Mapping[str, str]) -> list[_Unit]:
    if isinstance(block.get("rows"), list):
        return _table_units(block)
    raw = block.get("options", block.get("items", block.get("compare")))
    if isinstance(raw, Mapping):
        raw = [{"option": k, **(v if isinstance(v, Mapping) else {"text": v})} for k, v in raw.items()]
    if not isinstance(raw, list):
        return []
    units: list[_Unit] = []
    for entry in raw:
        if not isinstance(entry, Mapping):
            units.extend(_paragraph_units(_plain(entry)))
            continue
        oid = entry.get("option", entry.get("id"))
        name = _first_str(entry, ("label", "title", "name")) or (names.get(str(oid), str(oid)) if oid is not None else "")
        if name:
            shown = shorten(name, _PIECE_CHARS)
            units.append(_Unit(f"<p><strong>{esc_timecodes(shown)}</strong></p>", shown))
        details = [(str(k), v) for k, v in entry.items() if k not in ("option", "id", "label", "title", "name")]
        units.extend(_list_units(
            [f"{k}: {_plain(v)}" for k, v in details],
            html_items=[f"<em>{esc(_field_name(k))}:</em> {esc_timecodes(shorten(_plain(v), _PIECE_CHARS))}"
                        for k, v in details],
        ))
    return units


def _table_units(block: Mapping[str, Any]) -> list[_Unit]:
    """A table (or a chart's data) as ``<table>``s of a few rows each.

    Each piece repeats the header, so a table split over two messages still
    reads as a table in each.
    """
    rows_raw = block.get("rows", block.get("data", block.get("values")))
    header = block.get("columns", block.get("headers", block.get("header")))
    if not isinstance(rows_raw, list) or not rows_raw:
        return _text_units(block)
    columns: list[str] = [_plain(c) for c in header] if isinstance(header, list) else []
    if not columns and all(isinstance(r, Mapping) for r in rows_raw):
        columns = list(dict.fromkeys(str(k) for r in rows_raw for k in r))
    rows: list[list[str]] = []
    for row in rows_raw:
        if isinstance(row, Mapping):
            rows.append([_plain(row.get(c, "")) for c in columns])
        elif isinstance(row, list):
            rows.append([_plain(c) for c in row])
        else:
            rows.append([_plain(row)])
    return _table_pieces(columns, rows)


def _table_pieces(columns: list[str], rows: list[list[str]]) -> list[_Unit]:
    def cell(tag: str, value: str) -> str:
        return f"<{tag}>{esc_timecodes(shorten(value, _PIECE_CHARS))}</{tag}>"

    head_html = "<thead><tr>" + "".join(cell("th", c) for c in columns) + "</tr></thead>" if columns else ""
    head_text = " | ".join(columns)
    units: list[_Unit] = []
    rows_html: list[str] = []
    rows_text: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal rows_html, rows_text, size
        if rows_html:
            html = f"<table>{head_html}<tbody>\n" + "\n".join(rows_html) + "\n</tbody></table>"
            text = "\n".join(([head_text] if head_text else []) + rows_text)
            units.append(_Unit(html, text))
        rows_html, rows_text, size = [], [], 0

    for row in rows:
        row_html = "<tr>" + "".join(cell("td", c) for c in row) + "</tr>"
        row_text = " | ".join(row)
        row_size = _json_bytes(row_html) + _json_bytes(row_text)
        if rows_html and size + row_size > _BUDGET // 2:
            flush()
        rows_html.append(row_html)
        rows_text.append(row_text)
        size += row_size
    flush()
    return units


def _leftover_units(block: Mapping[str, Any]) -> list[_Unit]:
    """Every field of a block read as nothing known, so its content still shows."""
    details = [(str(k), v) for k, v in block.items() if k not in ("type", *_TITLE_FIELDS, *_CAPTION_FIELDS)]
    return _list_units(
        [f"{k}: {_plain(v)}" for k, v in details],
        html_items=[f"<em>{esc(_field_name(k))}:</em> {esc_timecodes(shorten(_plain(v), _PIECE_CHARS))}"
                    for k, v in details],
    )


# ---------------------------------------------------------------- media blocks


def _media_of(block: Mapping[str, Any]) -> MediaItem | None:
    """The file a block shows, or None (a chart given as data has none)."""
    kind = _FILE_TYPES.get(str(block.get("type", "")))
    src = block.get("src", block.get("file", block.get("path")))
    if kind is None or not isinstance(src, str) or not src.strip():
        return None
    label = _first_str(block, _TITLE_FIELDS)
    caption = _first_str(block, ("caption",))
    alt = _first_str(block, ("alt",))
    start = block.get("start")
    if isinstance(start, bool) or not isinstance(start, (int, float, str)):
        start = None
    return MediaItem(src=src, type=kind, label=label, caption=caption, alt=alt, start=start)


def _media_unit(block: Mapping[str, Any], media: MediaItem) -> _Unit:
    """The words that name a media block, sent when its file can't be."""
    what = _TYPE_NAMES.get(str(block.get("type", "")), "File")
    name = (media.src or "").replace("\\", "/").rsplit("/", 1)[-1]
    described = " \u2014 ".join(s for s in (media.label, media.caption or media.alt) if s)
    text = f"{what}: {name}" + (f" \u2014 {described}" if described else "") + " (the file could not be sent)"
    text = shorten(text, _PIECE_CHARS)
    return _Unit(f"<p>{esc_timecodes(text)}</p>", text)


# ---------------------------------------------------------------- messages


def _messages(sections: list[list[_Unit] | tuple[MediaItem, _Unit]], title: str, budget: int) -> list[Part]:
    """Pack the units into messages of ``budget`` bytes; then head each one, numbered when there are several."""
    drafts: list[tuple[list[_Unit], MediaItem | None]] = []
    for section in sections:
        if isinstance(section, tuple):
            media, unit = section
            drafts.append(([unit], media))
            continue
        current: list[_Unit] = []
        size = 0
        for unit in _fitting(section, budget):
            if current and size + unit.size > budget:
                drafts.append((current, None))
                current, size = [], 0
            current.append(unit)
            size += unit.size
        if current:
            drafts.append((current, None))
    cut = len(drafts) - MAX_MESSAGES
    if cut > 0:
        drafts = drafts[: MAX_MESSAGES - 1]
        more = f"The rest of the background ({cut + 1} more messages) is too long to post here."
        drafts.append(([_Unit(f"<p><em>{esc(more)}</em></p>", more)], None))
    shown = shorten(title, _TITLE_MAX)
    parts: list[Part] = []
    for index, (units, media) in enumerate(drafts, start=1):
        heading = f"Background: {shown}" if len(drafts) == 1 else f"Background: {shown} ({index} of {len(drafts)})"
        html = "\n".join([f"<p><em>{esc_timecodes(heading)}</em></p>", *(u.html for u in units)])
        text = "\n\n".join([heading, *(u.text for u in units)])
        content = {"msgtype": "m.notice", "body": text, "format": HTML_FORMAT, "formatted_body": html}
        parts.append(Part(content=content, media=media))
    return parts


def _fitting(units: Iterable[_Unit], budget: int) -> Iterable[_Unit]:
    """Each unit, or when one alone is over the budget its text in plain pieces."""
    for unit in units:
        if unit.size <= budget:
            yield unit
        else:
            yield from _paragraph_units(unit.text)


def _paragraph_units(text: str, *, em: bool = False) -> list[_Unit]:
    """Free text as paragraphs (blank lines part them), long ones in pieces."""
    units: list[_Unit] = []
    for paragraph in _paragraphs(text):
        for start in range(0, len(paragraph), _PIECE_CHARS):
            piece = paragraph[start : start + _PIECE_CHARS]
            inner = esc_timecodes(piece)
            units.append(_Unit(f"<p><em>{inner}</em></p>" if em else f"<p>{inner}</p>", piece))
    return units


def _list_units(items: list[str], *, html_items: list[str] | None = None) -> list[_Unit]:
    """A bulleted list, in pieces of a few items when it is long."""
    shown = html_items if html_items is not None else [esc_timecodes(shorten(i, _PIECE_CHARS)) for i in items]
    units: list[_Unit] = []
    batch_html: list[str] = []
    batch_text: list[str] = []
    size = 0
    for html, text in zip(shown, items, strict=True):
        item_html = f"<li>{html}</li>"
        item_text = f"- {shorten(text, _PIECE_CHARS)}"
        item_size = _json_bytes(item_html) + _json_bytes(item_text)
        if batch_html and size + item_size > _BUDGET // 2:
            units.append(_Unit("<ul>\n" + "\n".join(batch_html) + "\n</ul>", "\n".join(batch_text)))
            batch_html, batch_text, size = [], [], 0
        batch_html.append(item_html)
        batch_text.append(item_text)
        size += item_size
    if batch_html:
        units.append(_Unit("<ul>\n" + "\n".join(batch_html) + "\n</ul>", "\n".join(batch_text)))
    return units


# ---------------------------------------------------------------- helpers


def _paragraphs(text: str) -> list[str]:
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    return [p.strip("\n") for p in normalized.split("\n\n") if p.strip()]


def _first_str(mapping: Mapping[str, Any], names: Iterable[str]) -> str | None:
    for name in names:
        value = mapping.get(name)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _plain(value: Any) -> str:
    """Any JSON value as one readable line of text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _field_name(key: str) -> str:
    return key.replace("_", " ")


def _json_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8"))
