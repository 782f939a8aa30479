"""``make demo``: an address a client can keep, and example media a person can see."""

from __future__ import annotations

import socket
import struct

from bridge.devserver import first_free_port, free_port
from bridge.resources import examples_dir


def test_the_preferred_port_when_free_else_the_next_free_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        got = first_free_port(busy)
        assert got != busy and busy < got <= busy + 50
    free = free_port()
    assert first_free_port(free) == free


def test_the_example_image_is_large_enough_to_see():
    data = (examples_dir() / "release-decisions" / "media" / "latency.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 480 and height >= 270, (width, height)


def test_the_demo_says_which_question_shows_a_one_pager_of_every_block_and_a_captioned_clip():
    from bridge.demo import showcase

    shown = "\n".join(showcase(examples_dir()))
    assert ("Release 2.4 decisions \u00b7 1. Database migration: choice, a one-pager in its thread "
            "(text, facts, options_compared, table, image, chart), an image") in shown
    assert "Release 2.4 decisions \u00b7 3. Splash animation: compare, a clip with captions" in shown
    assert "8. Publish the release candidate: confirm, an approval bound to a subject" in shown
    assert ("Release 2.4 approval \u00b7 1. Roll out 2.4: confirm, an approval bound to a subject, a deadline (2h), "
            "a 2-of-3 approval, veto block, escalation after 30m") in shown


def test_a_port_the_last_run_closed_connections_on_is_free_again():
    """Ctrl-C, then `make demo` again: the last homeserver's connections
    wait a minute in TIME_WAIT on its port, which a plain bind takes for
    taken; the demo moved to another port, saying the first was taken, and
    the client set up for it found nothing there."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side waits in TIME_WAIT
        client.close()
    assert first_free_port(port) == port
