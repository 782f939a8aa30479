"""One URL's circuit breaker: a fill in flight while closed, opened by
failures in a row, one probe when half-open, closed by a success, and
open for longer each time the probe fails."""

from __future__ import annotations

from bridge.agents.circuit import CLOSED, HALF_OPEN, OPEN, OPEN_AFTER, PER_URL, Circuit


def test_closed_lets_a_fill_through_and_a_success_keeps_it_closed() -> None:
    circuit = Circuit()
    assert circuit.state(0) == CLOSED
    assert circuit.room(0, 0) == PER_URL and circuit.room(0, PER_URL) == 0
    circuit.failed(0)
    circuit.taken()
    for _ in range(OPEN_AFTER - 1):
        circuit.failed(0)
    assert circuit.state(0) == CLOSED  # failures must come in a row


def test_failures_in_a_row_open_it_then_one_probe_goes_and_its_failure_opens_it_for_longer() -> None:
    circuit = Circuit()
    for _ in range(OPEN_AFTER):
        circuit.failed(10.0)
    assert circuit.state(10.0) == OPEN and circuit.room(10.0, 0) == 0
    first = circuit.reopens_at(10.0)
    assert first is not None and first > 10.0
    circuit.failed(10.1)  # a delivery already in flight when it opened: no longer open for it
    assert circuit.reopens_at(10.1) == first
    assert circuit.state(first) == HALF_OPEN and circuit.room(first, 0) == 1
    assert circuit.room(first, 1) == 0  # the probe goes alone
    circuit.started(first)
    assert circuit.room(first, 0) == 0 and circuit.reopens_at(first) is None  # waiting on the probe, not the time
    circuit.failed(first + 2)
    second = circuit.reopens_at(first + 2)
    assert second is not None and second - (first + 2) > first - 10.0  # backed off further


def test_a_probe_taken_closes_it() -> None:
    circuit = Circuit()
    for _ in range(OPEN_AFTER):
        circuit.failed(0)
    later = circuit.open_until
    circuit.started(later)
    circuit.taken()
    assert circuit.state(later) == CLOSED and circuit.room(later, 0) == PER_URL


def test_the_time_open_doubles_up_to_five_minutes() -> None:
    circuit = Circuit()
    now, opened_for = 0.0, []
    for _ in range(40):
        circuit.failed(now)
        if circuit.open_until > now:
            opened_for.append(circuit.open_until - now)
            now = circuit.open_until
    assert opened_for[:3] == [1.0, 2.0, 4.0]
    assert max(opened_for) == 300.0 and opened_for == sorted(opened_for)


def test_a_success_ends_the_count_of_failures_but_not_a_hold_the_url_asked_for() -> None:
    circuit = Circuit()
    circuit.failed(10.0, hold=120.0)  # a 429 asking for two minutes
    circuit.taken()                   # a delivery sent before it answers 2xx
    assert circuit.failures == 0
    assert circuit.state(11.0) == OPEN and circuit.room(11.0, 0) == 0 and circuit.reopens_at(11.0) == 130.0
    assert circuit.state(130.0) == CLOSED and circuit.room(130.0, 0) == PER_URL


def test_a_url_failing_for_days_is_still_left_alone_five_minutes_at_a_time() -> None:
    """Each opening doubled the time as a float: the 1,024th (a URL down
    three and a half days while its agent still asked) overflowed, raised
    before the circuit was opened again, and left it half-open: a probe
    every pass of the deliverer, each a traceback, for as long as it stayed down."""
    from bridge.agents.circuit import MAX_OPEN

    circuit, now = Circuit(), 0.0
    for _ in range(2000):  # a week of probes, each failed
        circuit.failed(now)
        now = circuit.reopens_at(now) or now
    assert circuit.state(now - 1) == OPEN
    circuit.failed(now)
    assert circuit.reopens_at(now) == now + MAX_OPEN
