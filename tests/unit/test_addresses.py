"""Which addresses a webhook may go to: every inward kind refused, in each
of the forms an IPv6 address can carry an IPv4 one; public ones let through."""

from __future__ import annotations

import pytest

from bridge.agents.addresses import embedded_v4, host_of_url, parse, refusal, refusal_of_name


@pytest.mark.parametrize(("text", "why"), [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.5.4", "private"),
    ("192.168.1.20", "private"),
    ("100.64.0.1", "private"),            # carrier-grade NAT
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.169.254", "metadata"),
    ("169.254.170.2", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("100.100.100.200", "metadata"),
    ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"),      # v4-mapped
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "metadata"),
    ("::127.0.0.1", "loopback"),           # v4-compatible
    ("2002:7f00:1::1", "loopback"),        # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::", "metadata"),      # 6to4 of 169.254.169.254
    ("64:ff9b::7f00:1", "loopback"),       # NAT64 of 127.0.0.1
    ("64:ff9b::a00:1", "private"),         # NAT64 of 10.0.0.1
    ("[::1]", "loopback"),                 # as a URL writes it
    ("240.0.0.1", ""),                     # reserved: refused, whatever it is called
    ("192.0.2.10", ""),                    # documentation
    ("255.255.255.255", ""),
])
def test_inward_addresses_are_refused_and_say_why(text: str, why: str) -> None:
    address = parse(text)
    assert address is not None
    reason = refusal(address)
    assert reason is not None and why in reason


@pytest.mark.parametrize("text", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111",
                                  "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808"])
def test_public_addresses_are_let_through(text: str) -> None:
    address = parse(text)
    assert address is not None and refusal(address) is None


def test_the_ipv4_inside_an_ipv6_address_is_found() -> None:
    assert str(embedded_v4(parse("::ffff:192.168.0.1"))) == "192.168.0.1"
    assert str(embedded_v4(parse("2002:c0a8:1::"))) == "192.168.0.1"
    assert str(embedded_v4(parse("64:ff9b::c0a8:1"))) == "192.168.0.1"
    assert embedded_v4(parse("2606:4700::1")) is None
    assert embedded_v4(parse("::1")) is None and embedded_v4(parse("8.8.8.8")) is None


@pytest.mark.parametrize(("url", "host"), [
    ("http://127.0.0.1:8080/hook", "127.0.0.1"),
    ("https://[::ffff:127.0.0.1]/h", "::ffff:127.0.0.1"),
    ("https://user:pw@Hooks.Example.org:8443/x?y=1", "hooks.example.org"),
    ("http:///nohost", None),
])
def test_the_host_of_a_url(url: str, host: str | None) -> None:
    assert host_of_url(url) == host


def test_names_are_judged_without_resolving_only_when_they_are_always_this_machine() -> None:
    assert "loopback" in refusal_of_name("localhost")
    assert "loopback" in refusal_of_name("LOCALHOST.")
    assert "loopback" in refusal_of_name("hooks.localhost")
    assert "private" in refusal_of_name("10.9.8.7")
    assert refusal_of_name("hooks.example.org") is None
    assert refusal_of_name("localhost.example.org") is None
    assert parse("hooks.example.org") is None
