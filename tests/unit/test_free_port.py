"""Ports for servers the suite starts: two set up before either listens never
share one, and none is one the kernel may hand an outgoing connection meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

from bridge.devserver import free_port


def ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_handed_out_in_one_process_are_all_different_and_outside_the_ephemeral_range():
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]


def test_a_port_handed_out_can_be_listened_on():
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
