"""The smallest valid bridge configuration, for tests that vary one part of it."""

GOOD = {
    "homeserver": {"url": "http://127.0.0.1:8008"},
    "bot": {"user_id": "@askbot:example.org", "access_token": "secret-token"},
    "sets": {"root": "./ask"},
    "rooms": {"default": "!room-id"},
    "store": {"path": "./bridge.sqlite"},
}
