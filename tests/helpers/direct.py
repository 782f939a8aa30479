"""An admin's direct message with the bridge, as the admin sees it: the
bridge joined, and it answers ``!ask status`` there."""

from __future__ import annotations

from typing import Any

from helpers.waiting import until


async def bridge_answers_in_direct(admin: Any, bot_user_id: str, direct: str) -> None:
    """Waits for the bridge in ``direct`` (60 s) and for its reply to ``!ask status`` (30 s)."""

    async def in_direct() -> bool:
        members = await admin.client.joined_members(direct)
        return bot_user_id in {member.user_id for member in getattr(members, "members", [])}

    await until(in_direct, timeout=60, what="the bridge in the admin's direct message", every=0.3)
    status = await admin.send(direct, {"msgtype": "m.text", "body": "!ask status"})

    async def replied() -> bool:
        return any(event.get("content", {}).get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id")
                   == status and event["sender"] == bot_user_id for event in await admin.messages(direct))

    await until(replied, timeout=30, what="a reply to !ask status in the direct message", every=0.3)
