"""Which addresses a webhook may be POSTed to (pure).

A callback URL is named by an agent, so the bridge must not be turned into a
way into its own network: loopback, private, link-local, multicast,
unspecified and cloud-metadata addresses are refused, and so is anything
else that is not a public address.  An IPv6 address that carries an IPv4
one (v4-mapped ``::ffff:a.b.c.d``, v4-compatible ``::a.b.c.d``, 6to4
``2002::/16``, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``, Teredo) is
judged by the IPv4 address inside it too: the host or a gateway on the way
turns it into that address.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services of the clouds, by address.  169.254.169.254 is link-local
# anyway; these are named so the refusal says what it is.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",   # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle...
    "169.254.170.2",     # AWS ECS task metadata
    "100.100.100.200",   # Alibaba Cloud
    "192.0.0.192",       # Oracle Cloud (older)
    "fd00:ec2::254",     # AWS over IPv6
))

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: someone's inside


def parse(text: str) -> Address | None:
    """An IP address written as text (brackets, a zone id allowed); None for a name."""
    text = text.strip().strip("[]")
    text = text.split("%", 1)[0]  # fe80::1%eth0: the zone says nothing about where it goes
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def embedded_v4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries, if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address (the server's is public by design)
    packed = address.packed
    if any(address in net for net in _NAT64):
        return ipaddress.IPv4Address(packed[-4:])
    if address in _V4_COMPATIBLE and int(address) > 1:  # :: and ::1 are themselves, not IPv4
        return ipaddress.IPv4Address(packed[-4:])
    return None


def refusal(address: Address) -> str | None:
    """Why a webhook may not go to ``address`` (a few words); None when it may."""
    inner = embedded_v4(address)
    if inner is not None:
        why = refusal(inner)
        return f"{why} (as {inner} inside {address})" if why else None
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and (address in _SHARED or address.is_private):
        return "a private address"
    if isinstance(address, ipaddress.IPv6Address) and (address.is_private or address.is_site_local):
        return "a private address"
    if address.is_reserved or not address.is_global:
        return "not a public address"
    return None


def host_of_url(url: str) -> str | None:
    """The host a URL names (an IPv6 literal without its brackets); None when it names none."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return host or None


_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")


def name_problem(host: str) -> str | None:
    """Why ``host`` (not an address) can be no name DNS holds: a label empty
    or past 63 characters once in IDNA form, a space or a percent sign in it;
    None when it can be one.  No delivery to such a host ever connects (the
    resolver raised before any network was asked), so it is refused where
    it is named."""
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return "is no host name DNS can hold (a label empty or too long)"
    labels = ascii_host.removesuffix(".").split(".")
    if len(ascii_host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "is no host name DNS can hold"
    return None


def refusal_of_name(host: str) -> str | None:
    """What can be said of a host without resolving it: an address judged as
    one, a name that is always this machine refused; None otherwise."""
    address = parse(host)
    if address is not None:
        return refusal(address)
    lowered = host.lower()  # RFC 6761: localhost and its subdomains are this machine
    if lowered in ("localhost", "localhost.") or lowered.endswith((".localhost", ".localhost.")):
        return "a loopback address (localhost)"
    return None
