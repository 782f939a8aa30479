"""Callbacks judged where an agent names them and where an operator
configures them: refused naming the field, allowed with
agent_api.allow_private_callbacks."""

from __future__ import annotations

import socket

import pytest

from bridge.agents.callbacks import check_callbacks, check_configured, url_refusal
from bridge.agents.errors import CallbackRefused
from bridge.service.config import Agent, ConfigError, parse_config
from helpers.config import GOOD

AGENT = {"token": "a-token-long-enough", "webhook_secret": "s"}


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/h", "https://10.0.0.8/h", "http://169.254.169.254/",
                                 "http://[::1]:9/h", "http://[::ffff:127.0.0.1]/h", "http://localhost/h",
                                 "http://[fe80::1]/h", "http://0.0.0.0:80/h"])
def test_an_inward_webhook_url_is_refused_in_the_config_naming_the_key(tmp_path, url):
    with pytest.raises(ConfigError, match=r"agents\.a\.webhook_url") as caught:
        parse_config({**GOOD, "agents": {"a": {**AGENT, "webhook_url": url}}}, base_dir=tmp_path, environ={})
    assert "allow_private_callbacks" in str(caught.value)
    allowed = parse_config({**GOOD, "agents": {"a": {**AGENT, "webhook_url": url}},
                            "agent_api": {"allow_private_callbacks": True}}, base_dir=tmp_path, environ={})
    assert allowed.agents["a"].webhook_url == url and allowed.agent_api.allow_private_callbacks is True


def test_a_public_webhook_url_and_the_default_are_taken(tmp_path):
    config = parse_config({**GOOD, "agents": {"a": {**AGENT, "webhook_url": "https://8.8.8.8/h"}}},
                          base_dir=tmp_path, environ={})
    assert config.agent_api.allow_private_callbacks is False


async def test_ask_refuses_each_inward_callback_by_its_index():
    with pytest.raises(CallbackRefused) as caught:
        await check_callbacks(["https://8.8.8.8/ok", "http://192.168.0.1/x", "http://[::ffff:10.0.0.1]/y"],
                              allow_private=False)
    error = caught.value
    assert error.status == 422 and error.code == "callback_refused"
    assert [f["where"] for f in error.findings] == ["callbacks[1]", "callbacks[2]"]
    assert "private" in error.findings[0]["message"] and "callbacks[1]" in error.message
    await check_callbacks(["http://127.0.0.1/x"], allow_private=True)
    await check_callbacks(["https://8.8.8.8/ok"], allow_private=False)
    await check_callbacks("not a list: the set service says what is wrong", allow_private=False)


async def test_a_name_is_resolved_and_judged_by_every_address_it_has():
    name = socket.gethostname()  # this machine's own name: one of its own addresses
    why = await url_refusal(f"http://{name}:8080/h")
    assert why is not None and name in why
    assert await url_refusal("http://name-that-does-not-resolve.invalid/h") is None  # checked at delivery
    with pytest.raises(ConfigError, match=r"agents\.a\.webhook_url"):
        await check_configured({"a": Agent(token="a-token-long-enough", webhook_url=f"http://{name}/h",
                                           webhook_secret="s")}, allow_private=False)
    await check_configured({"a": Agent(token="a-token-long-enough", webhook_url=f"http://{name}/h",
                                       webhook_secret="s")}, allow_private=True)


async def test_a_callback_whose_port_is_no_port_is_refused_at_ask():
    # Taken before, then every delivery failed, retried for a day.
    from bridge.agents.errors import CallbackRefused

    for url in ("https://hooks.example.org:99999/x", "https://hooks.example.org:0/x", "http://h.example:port/x"):
        with pytest.raises(CallbackRefused) as caught:
            await check_callbacks(["https://hooks.example.org/ok", url], allow_private=False)
        assert caught.value.findings == [{"where": "callbacks[1]", "message":
                                          "the callback names no port a connection can be made to (1 to 65535)"}]


@pytest.mark.parametrize("allow_private", [False, True])
async def test_a_callback_whose_host_no_dns_name_can_be_is_refused_at_ask(allow_private):
    # Taken before (the resolver's UnicodeError read as "does not resolve
    # now"); every delivery then died in a traceback, never counted or retried.
    from bridge.agents.errors import CallbackRefused

    for url in ("http://" + "a" * 70 + ".example.com/hook", "http://\u2488.com/", "http://a b/", "http://%zz/"):
        with pytest.raises(CallbackRefused) as caught:
            await check_callbacks(["https://hooks.example.org/ok", url], allow_private=allow_private)
        (finding,) = caught.value.findings
        assert finding["where"] == "callbacks[1]" and "no host name DNS can hold" in finding["message"], finding
    await check_callbacks(["http://b\u00fccher.example/h", "http://x_y.example:8080/h"], allow_private=allow_private)


@pytest.mark.parametrize("allow_private", [False, True])
async def test_a_callback_naming_no_host_is_refused_at_ask_even_with_private_callbacks_allowed(allow_private):
    # agents.md: one no connection can ever be made to is refused the same
    # way, even with allow_private_callbacks; that setting took these.
    from bridge.agents.errors import CallbackRefused

    for url in ("http://", "http:///hook", "https://:443/x", "http://?x"):
        with pytest.raises(CallbackRefused) as caught:
            await check_callbacks([url], allow_private=allow_private)
        assert caught.value.findings == [{"where": "callbacks[0]", "message": "the callback names no host"}], url


async def test_a_configured_webhook_naming_no_host_is_refused_at_start_whatever_is_allowed():
    from bridge.agents.callbacks import check_configured
    from bridge.service.config import Agent, ConfigError

    for allow_private in (False, True):
        with pytest.raises(ConfigError, match=r"^agents.a.webhook_url: the URL names no host$"):
            await check_configured({"a": Agent(token="token-of-a-0123456789", webhook_url="https:///in")},
                                   allow_private=allow_private)


def test_the_log_names_a_webhook_by_its_host_never_its_user_and_password():
    from bridge.agents.webhooks import host_of

    assert host_of("https://agent:S3CRET@hooks.example.org:8443/hook?token=t") == "hooks.example.org:8443"
    assert host_of("http://agent:S3CRET@[::1]:9/h") == "[::1]:9"
    assert host_of("https://hooks.example.org/h") == "hooks.example.org"
