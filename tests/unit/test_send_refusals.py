"""Whether a send the homeserver answered with an error is tried again: the
HTTP status decides, not the Matrix errcode alone (which nio names
``status_code``).  A 400 M_UNKNOWN, a request refused, was taken for a
failure for now and sent again for ever; a 502 carrying any other errcode
than M_UNKNOWN (a proxy's, a federation failure's) was given up for good."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from nio import RoomSendError

from bridge.service.transport.matrix import MatrixError, NioTransport

ROOM = "!room:hs"


def answered(http: int, errcode: str, message: str) -> RoomSendError:
    """nio's error for a send, as it builds it from the homeserver's reply."""
    error = RoomSendError.from_dict({"errcode": errcode, "error": message}, ROOM)
    error.transport_response = SimpleNamespace(status=http)
    return error


async def refusal(response: RoomSendError) -> MatrixError:
    class Client:
        user_id = "@bot:hs"

        async def room_send(self, *_args, **_kwargs) -> RoomSendError:
            return response

    with pytest.raises(MatrixError) as caught:
        await NioTransport(Client()).send(ROOM, "m.room.message", {"body": "q"}, "txn1")
    return caught.value


@pytest.mark.parametrize("http, errcode", [(400, "M_UNKNOWN"), (404, "M_UNKNOWN"), (413, "M_TOO_LARGE")])
async def test_a_4xx_is_a_refusal_whatever_its_errcode(http: int, errcode: str) -> None:
    refused = await refusal(answered(http, errcode, "the content was refused"))
    assert not refused.transient and refused.permanent


@pytest.mark.parametrize("http, errcode", [(502, "M_NOT_FOUND"), (500, "M_FORBIDDEN"), (503, "M_UNKNOWN"),
                                           (429, "M_LIMIT_EXCEEDED"), (400, "M_LIMIT_EXCEEDED"), (408, "M_UNKNOWN")])
async def test_a_5xx_or_a_rate_limit_is_tried_again_whatever_its_errcode(http: int, errcode: str) -> None:
    failed = await refusal(answered(http, errcode, "try again later"))
    assert failed.transient and not failed.permanent


async def test_a_refused_token_is_neither_tried_again_nor_a_refusal_of_the_send() -> None:
    # It concerns every room: the operator fixes it (``TokenRefused``).
    refused = await refusal(answered(401, "M_UNKNOWN_TOKEN", "Invalid access token"))
    assert not refused.transient and not refused.permanent


async def test_an_error_nio_made_of_a_2xx_body_is_tried_again_as_before() -> None:
    """Only a 4xx is this request refused: an error nio built from a 200
    whose body it could not read (a proxy's page) was taken for one for good."""
    unread = RoomSendError.from_dict({"error": "unreadable"}, ROOM)
    unread.transport_response = SimpleNamespace(status=200)
    failed = await refusal(unread)
    assert failed.transient and not failed.permanent


@pytest.mark.parametrize("status, reply, transient", [(502, {}, True), (503, {"errcode": "M_NOT_FOUND"}, True),
                                                      (400, {"errcode": "M_UNKNOWN"}, False)])
def test_a_reply_the_bridge_reads_itself_is_judged_by_its_http_status_too(status, reply, transient) -> None:
    """The appservice's own requests (its device's login, its ping) read their
    replies themselves: a 502 with no errcode was no longer tried again once
    the errcode alone was no longer read for the status."""
    from bridge.service.transport.matrix import HttpReply

    assert MatrixError("the login", HttpReply(status, reply)).transient is transient
