"""A question's media items: a file that resolves (and plays), or a drawn figure."""

from __future__ import annotations

from typing import Any

from bridge.questionset import media as media_rules
from bridge.questionset.lint import confined
from bridge.questionset.lint.access import blank, list_at, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown


def check_media(ctx: Context, q: QuestionView) -> None:
    for i, item in enumerate(list_at(q.raw, "media") or []):
        if isinstance(item, dict):
            _check_media_item(ctx, item, f"{q.where}.media[{i}]")


def _check_media_item(ctx: Context, item: dict[str, Any], where: str) -> None:
    check_unknown(ctx, item, "media", where)
    src, figure = item.get("src"), item.get("figure")
    if figure is not None:
        if src is not None:
            ctx.error(f"{where}.src", "a drawn figure has no src; keep either the figure or the src")
        elif blank(str_at(item, "alt")):
            # Decided here: a figure is a picture too, so it needs alt like an image.
            ctx.warning(f"{where}.alt", "add alt: a short description of the figure for people who can't see it")
        return
    if src is None:
        ctx.error(where, "give the media item a src (a file) or a figure (a drawn figure)")
        return
    if not isinstance(src, str):
        return  # a type error
    if not src.strip():
        ctx.error(f"{where}.src", "src is empty; name the media file")
        return
    kind = _media_kind(ctx, item, src, where)
    if ctx.confined and (problem := confined.path_problem(src)):
        ctx.error(f"{where}.src", f"{quote(src)} {problem}; {confined.WHY}")
        return
    resolved = media_rules.resolve(src, ctx.media_roots, ctx.fs)
    if resolved.status == "outside" and ctx.confined:
        ctx.error(f"{where}.src", f"{quote(src)} leads outside the set folder (through a symlink); {confined.WHY}")
    elif resolved.status == "outside":
        ctx.error(
            f"{where}.src",
            f"{quote(src)} is outside the set folder and its media roots; "
            "move the file there or add its folder to media_roots",
        )
    elif resolved.status == "missing":
        ctx.error(f"{where}.src", f"{quote(src)} was not found in the set folder or its media roots")
    if kind == "image" and blank(str_at(item, "alt")):
        ctx.warning(f"{where}.alt", "add alt: a short description of the image for people who can't see it")
    if kind == "video" and resolved.ok and resolved.path is not None:
        _check_codecs(ctx, resolved.path, src, where)


def _media_kind(ctx: Context, item: dict[str, Any], src: str, where: str) -> str | None:
    declared = item.get("type")
    if declared is not None:
        return declared if declared in ("video", "audio", "image") else None  # else a type error
    kind = media_rules.media_type(src)
    if kind is None:
        ctx.error(f"{where}.type", f"the type can't be told from {quote(src)}; set type to video, audio or image")
    return kind


def _check_codecs(ctx: Context, path: str, src: str, where: str) -> None:
    if ctx.probe is None:
        return
    try:
        streams = ctx.probe(path)
    except Exception:  # an injected probe runs an outside program; its failure must not stop lint
        streams = None
    if streams is None:
        ctx.warning(f"{where}.src", f"{quote(src)} could not be read by the codec probe; check that it is a playable video")
    elif not media_rules.playable_everywhere(streams):
        found = ", ".join(streams.video + streams.audio) or "no streams"
        ctx.warning(
            f"{where}.src",
            f"{quote(src)} is {found}; re-encode it as H.264 video with AAC or MP3 sound (or none) so every browser plays it",
        )
