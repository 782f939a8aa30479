"""Whether a message POSTed to ``/mcp`` is a JSON-RPC message at all.  Pure.

The MCP SDK's handshake-era transport read a message whose id is null, a
fraction or ``true`` as a notification (its request model refuses the id,
the notification model ignores one) and answered 202: the client waited for
an answer that never came.  A batch (a JSON array; MCP dropped batches in
2025-06-18) or an object with neither a method nor a result came back as
-32602 with a dump of the SDK's model errors.  JSON-RPC 2.0 calls each an
Invalid Request (-32600); both protocol eras answer it so, with HTTP 400.
An object naming a key twice is refused as ``/v1`` refuses it: Python keeps
the last, another reader the first, and an agent's ``ask`` with two
``questions`` wrote the second without a word.
"""

from __future__ import annotations

import json
from typing import Any

from bridge import strictjson

INVALID_REQUEST = -32600


def read(body: bytes) -> tuple[Any, str | None]:
    """The message, and why it is no JSON-RPC message (None when it is one,
    or when it is no JSON at all: the SDK answers that as a parse error)."""
    try:
        message = strictjson.loads(body, unique_keys=True)
    except strictjson.NotJson as exc:
        return None, str(exc)
    except (ValueError, RecursionError):
        return None, None
    return message, invalid(message)


def invalid(message: Any) -> str | None:
    if isinstance(message, list):
        return "a batch (a JSON array) is not taken: send each message in a request of its own"
    if not isinstance(message, dict):
        return "a JSON-RPC message is a JSON object"
    if message.get("jsonrpc") != "2.0":
        return 'a JSON-RPC message says "jsonrpc": "2.0"'
    if "id" in message and not good_id(message["id"]):
        return "an id is a string or an integer, never null, a fraction or true/false (a notification has none)"
    if "method" in message:
        return None if isinstance(message["method"], str) else "a method is a string"
    if "id" in message and ("result" in message or "error" in message):
        return None
    return "a message has a method (a request or a notification), or an id and a result or an error (a response)"


def good_id(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def is_request(message: Any) -> bool:
    """A request, which an answer follows (a notification or a response gets a bare 202)."""
    return isinstance(message, dict) and "method" in message and "id" in message


def refusal(message: Any, problem: str) -> bytes:
    """The Invalid Request error's body, answering the message's id when it has a good one."""
    found = message.get("id") if isinstance(message, dict) else None
    return json.dumps({"jsonrpc": "2.0", "id": found if good_id(found) else None,
                       "error": {"code": INVALID_REQUEST, "message": f"Invalid Request: {problem}"}}).encode()
