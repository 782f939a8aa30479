"""Which Host and Origin /mcp serves (bridge/agents/origin.py), and the
config key naming the bridge's public address."""

from __future__ import annotations

import pytest

from bridge.agents.origin import refusal, served_names
from bridge.service.config import ConfigError, parse_config
from helpers.config import GOOD

PUBLIC = served_names("https://bridge.example.org", "127.0.0.1:9464")


@pytest.mark.parametrize("host, origin", [
    ("bridge.example.org", None),
    ("Bridge.Example.org:443", "https://bridge.example.org"),
    ("127.0.0.1:9464", None),                      # a proxy that passes its upstream on as Host
    ("127.0.0.1:9464", "http://127.0.0.1:9464"),
    ("localhost:9464", "http://localhost:9464"),
    ("[::1]:9464", "http://[::1]:9464"),
    ("10.1.2.3:9464", None),                       # an address: no DNS answer put it there
])
def test_the_bridges_own_names_and_addresses_are_served(host, origin):
    assert refusal(host, origin, PUBLIC) is None


@pytest.mark.parametrize("host, origin, status", [
    ("evil.example.com", "http://evil.example.com", 403),   # a rebinding page: its own name in both
    ("bridge.example.org", "http://evil.example.com", 403),
    ("bridge.example.org", "null", 403),
    ("bridge.example.org", "file://bridge.example.org", 403),
    ("bridge.example.org", "http://bridge.example.org:notaport", 403),
    ("evil.example.com", None, 421),
    ("bridge.example.org.evil.example.com", None, 421),
    (None, None, 421),
    ("bridge.example.org/path", None, 421),
])
def test_a_foreign_origin_is_403_and_a_foreign_host_421(host, origin, status):
    refused = refusal(host, origin, PUBLIC)
    assert refused is not None and refused[0] == status


def test_without_a_public_url_the_listeners_name_and_localhost_are_served():
    names = served_names(None, "bridge.internal:9464")
    assert refusal("bridge.internal:9464", "http://bridge.internal:9464", names) is None
    assert refusal("localhost", None, names) is None
    assert refusal("bridge.example.org", None, names)[0] == 421
    assert served_names(None, "0.0.0.0:9464") == frozenset({"localhost"})


def test_public_url_must_be_an_http_url_with_a_host(tmp_path):
    config = parse_config({**GOOD, "agent_api": {"public_url": "https://bridge.example.org"}},
                          base_dir=tmp_path, environ={})
    assert config.agent_api.public_url == "https://bridge.example.org"
    with pytest.raises(ConfigError, match="agent_api.public_url"):
        parse_config({**GOOD, "agent_api": {"public_url": "bridge.example.org"}}, base_dir=tmp_path, environ={})
