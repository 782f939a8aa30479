"""The background (one_pager) as thread messages: readable, escaped, small enough."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.protocol.one_pager import MAX_MESSAGES, MESSAGE_MAX_BYTES, Part, render_one_pager
from bridge.protocol.question_event import content_size
from bridge.protocol.render import ALLOWED_TAGS, TABLE_TAGS
from helpers.html import parse

LABELS = {"pg": "PostgreSQL", "sqlite": "SQLite"}


def render(blocks: list[dict[str, Any]], title: str = "The database") -> list[Part]:
    return render_one_pager(blocks, title=title, labels=LABELS)


def only_text(parts: list[Part]) -> dict[str, Any]:
    assert len(parts) == 1 and parts[0].media is None
    return parts[0].content


def test_text_and_facts_read_as_paragraphs_and_a_list() -> None:
    content = only_text(render([
        {"type": "text", "title": "Where we are", "text": "Background: the change touches <b>three</b> services.\n\nSecond part."},
        {"type": "facts", "items": [{"label": "Risk", "value": "low"}, {"label": "Owner", "value": "@alice:example.org"}]},
    ]))
    assert content["msgtype"] == "m.notice" and content["format"] == "org.matrix.custom.html"
    html = content["formatted_body"]
    assert html.startswith("<p><em>Background: The database</em></p>\n")
    assert "<p><strong>Where we are</strong></p>" in html
    assert "<p>Background: the change touches &lt;b&gt;three&lt;/b&gt; services.</p>\n<p>Second part.</p>" in html
    assert "<li><strong>Risk:</strong> low</li>" in html
    # A Matrix id is code, not a pill Element makes of it.
    assert "<li><strong>Owner:</strong> <code>@alice:example.org</code></li>" in html
    body = content["body"]
    assert body.startswith("Background: The database\n\n")
    assert "the change touches <b>three</b> services." in body and "- Risk: low" in body


def test_facts_as_a_mapping_and_as_pairs() -> None:
    html = only_text(render([{"type": "facts", "facts": {"Downtime": "40 min"}}, {"type": "facts", "items": [["Cost", "2 days"]]}]))["formatted_body"]
    assert "<li><strong>Downtime:</strong> 40 min</li>" in html and "<li><strong>Cost:</strong> 2 days</li>" in html


def test_table_is_a_real_table() -> None:
    html = only_text(render([{"type": "table", "columns": ["Path", "Downtime"], "rows": [["Online", "0"], ["Offline", "40 min"]]}]))["formatted_body"]
    assert ("<table><thead><tr><th>Path</th><th>Downtime</th></tr></thead><tbody>\n"
            "<tr><td>Online</td><td>0</td></tr>\n<tr><td>Offline</td><td>40 min</td></tr>\n</tbody></table>") in html


def test_table_rows_as_objects_take_their_keys_as_columns() -> None:
    content = only_text(render([{"type": "table", "rows": [{"path": "Online", "p95": "310 ms"}, {"path": "Offline"}]}]))
    assert "<th>path</th><th>p95</th>" in content["formatted_body"]
    assert "<tr><td>Offline</td><td></td></tr>" in content["formatted_body"]
    assert "path | p95\nOnline | 310 ms" in content["body"]


def test_options_compared_name_options_by_label() -> None:
    html = only_text(render([{"type": "options_compared", "options": [
        {"option": "pg", "pros": ["Fast", "Known"], "cons": "One more service"},
        {"option": "sqlite", "summary": "Simple"},
    ]}]))["formatted_body"]
    assert "<p><strong>PostgreSQL</strong></p>" in html and "<p><strong>SQLite</strong></p>" in html
    assert "<li><em>pros:</em> Fast, Known</li>" in html and "<li><em>cons:</em> One more service</li>" in html


def test_chart_as_data_is_a_table_and_with_a_file_is_media() -> None:
    data = only_text(render([{"type": "chart", "title": "p95", "data": [{"day": "Mon", "ms": 310}, {"day": "Tue", "ms": 420}]}]))
    assert "<tr><td>Mon</td><td>310</td></tr>" in data["formatted_body"]
    parts = render([{"type": "chart", "src": "charts/p95.png", "caption": "p95 by day"}])
    assert parts[0].media is not None and parts[0].media.type == "image" and parts[0].media.src == "charts/p95.png"


def test_media_blocks_are_parts_of_their_own_with_a_fallback_naming_them() -> None:
    parts = render([
        {"type": "text", "text": "Before."},
        {"type": "image", "src": "shots/latency.png", "alt": "p95 latency", "caption": "staging"},
        {"type": "video", "src": "clip.mp4", "label": "The clip", "start": 1.5},
        {"type": "audio", "src": "take.ogg"},
        {"type": "text", "text": "After."},
    ])
    assert [p.media.type if p.media else None for p in parts] == [None, "image", "video", "audio", None]
    image = parts[1]
    assert image.media is not None and image.media.alt == "p95 latency" and image.media.caption == "staging"
    assert "Image: latency.png \u2014 staging (the file could not be sent)" in image.content["body"]
    assert parts[2].media is not None and parts[2].media.start == 1.5 and parts[2].media.label == "The clip"
    # Several messages: each says which part of the background it is.
    assert [p.content["body"].split("\n")[0] for p in parts] == [
        f"Background: The database ({n} of 5)" for n in range(1, 6)
    ]


def test_a_block_of_unknown_fields_still_shows_them() -> None:
    content = only_text(render([{"type": "text", "paragraphs": ["one", "two"], "style": "note"}]))
    assert "paragraphs: one, two" in content["body"] and "style: note" in content["body"]


@pytest.mark.parametrize("hostile", ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "&amp;", "[a](javascript:x)"])
def test_everything_from_the_set_is_escaped(hostile: str) -> None:
    parts = render([
        {"type": "text", "title": hostile, "text": hostile},
        {"type": "facts", "items": [{"label": hostile, "value": hostile}]},
        {"type": "table", "columns": [hostile], "rows": [[hostile]]},
        {"type": "options_compared", "options": [{"label": hostile, hostile: hostile}]},
        {"type": "image", "src": f"{hostile}.png", "caption": hostile},
    ], title=hostile)
    for part in parts:
        html = part.content["formatted_body"]
        parsed = parse(html)
        for tag, attrs in parsed.tags:
            assert tag in ALLOWED_TAGS | TABLE_TAGS, tag
            assert attrs == [], attrs
        assert hostile in "".join(parsed.text)


def test_long_background_is_split_under_the_limit_in_order() -> None:
    paragraphs = [f"Paragraph {n}: " + "word " * 400 for n in range(120)]
    rows = [[f"row {n}", "x" * 300, "\u00e9\"<>" * 50] for n in range(400)]
    parts = render([
        {"type": "text", "text": "\n\n".join(paragraphs)},
        {"type": "table", "columns": ["a", "b", "c"], "rows": rows},
        {"type": "text", "text": "\u201c" * 200_000},  # one paragraph, no break anywhere
    ])
    assert len(parts) > 3
    for part in parts:
        assert content_size(part.content) < MESSAGE_MAX_BYTES
        # Every piece of a split table is a whole table.
        html = part.content["formatted_body"]
        assert html.count("<table>") == html.count("</table>")
    bodies = "\n".join(p.content["body"] for p in parts)
    assert bodies.index("Paragraph 0:") < bodies.index("Paragraph 119:") < bodies.index("row 0 |") < bodies.index("row 399 |")


def test_a_huge_background_is_cut_with_a_word_saying_so() -> None:
    parts = render([{"type": "text", "text": "\n\n".join("x" * 1900 for _ in range(3000))}])
    assert len(parts) == MAX_MESSAGES
    assert "too long to post here" in parts[-1].content["body"]


def test_rendering_is_deterministic() -> None:
    blocks = [{"type": "text", "text": "a"}, {"type": "image", "src": "b.png"}]
    first = render(blocks)
    assert json.dumps([p.content for p in first]) == json.dumps([p.content for p in render(blocks)])
