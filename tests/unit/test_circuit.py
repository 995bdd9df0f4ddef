"""The circuit breaker: a run of outage errors opens it; one probe at a time; an answer closes it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.circuit import Admit, CircuitBreaker, is_outage
from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    MalformedResponse,
    Overloaded,
    RateLimited,
    Rejected,
    RequestTimeout,
    ServerError,
)

DOWN = ConnectionFailed("connection refused")


def test_outage_errors_are_the_ones_that_say_the_provider_is_down() -> None:
    for error in (ConnectionFailed("x"), RequestTimeout("x"), ServerError("x"), Overloaded("x")):
        assert is_outage(error)
    for error in (Rejected("x"), AuthFailed("x"), RateLimited("x"), MalformedResponse("x")):
        assert not is_outage(error)


def test_a_run_of_failures_opens_and_an_answer_in_between_resets_it() -> None:
    c = CircuitBreaker(failures=3, probe_s=1.0, probe_max_s=8.0)
    assert c.on_outage(DOWN, 0.0) is None and c.on_outage(DOWN, 0.1) is None
    c.on_answer(0.2)  # a 400 or any answer: the provider is there
    assert c.on_outage(DOWN, 0.3) is None and c.on_outage(DOWN, 0.4) is None
    change = c.on_outage(DOWN, 0.5)
    assert change is not None and change.opened and change.error is DOWN
    assert c.open and c.admit(0.6) == (Admit.WAIT, pytest.approx(0.9))


def test_one_probe_at_a_time_and_the_wait_doubles_to_the_cap() -> None:
    c = CircuitBreaker(failures=1, probe_s=1.0, probe_max_s=4.0)
    c.on_outage(DOWN, 0.0)
    now, waits = 0.0, []
    for _ in range(5):
        verdict, wait_s = c.admit(now)
        assert verdict is Admit.WAIT
        now += wait_s
        assert c.admit(now)[0] is Admit.PROBE
        assert c.admit(now)[0] is Admit.WAIT, "a second caller waits while the probe is out"
        assert c.on_outage(DOWN, now, probe=True) is None
        waits.append(wait_s)
    assert waits == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert c.holds(DOWN) and not c.holds(Rejected("bad request"))
    change = c.on_answer(now + 1)
    assert change is not None and not change.opened and change.outage_s == pytest.approx(now + 1)
    assert c.admit(now + 1) == (Admit.SEND, 0.0) and not c.holds(DOWN)


def test_an_abandoned_probe_lets_another_go() -> None:
    c = CircuitBreaker(failures=1, probe_s=1.0)
    c.on_outage(DOWN, 0.0)
    assert c.admit(1.0)[0] is Admit.PROBE
    c.probe_abandoned()
    assert c.admit(1.0)[0] is Admit.PROBE


Event = st.one_of(
    st.tuples(st.just("outage"), st.floats(0, 5)),
    st.tuples(st.just("answer"), st.floats(0, 5)),
    st.tuples(st.just("admit"), st.floats(0, 5)),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.lists(Event, max_size=80))
def test_properties_over_any_sequence(failures: int, events: list[tuple[str, float]]) -> None:
    """Whatever happens: closed admits everything; open admits at most one probe until it
    reports; it opens only after `failures` outage errors in a row; an answer always closes."""
    c = CircuitBreaker(failures=failures, probe_s=0.5, probe_max_s=4.0)
    now, run, probe_out = 0.0, 0, False
    for kind, dt in events:
        now += dt
        was_open = c.open
        if kind == "outage":
            change = c.on_outage(DOWN, now, probe=probe_out)
            probe_out = False
            if not was_open:
                run += 1
                assert (change is not None) == (run >= failures) == c.open
                if c.open:
                    run = 0
            else:
                assert change is None and c.open
        elif kind == "answer":
            change = c.on_answer(now)
            probe_out, run = False, 0
            assert not c.open and ((change is not None) == was_open)
        else:
            verdict, wait_s = c.admit(now)
            assert wait_s >= 0
            if not c.open:
                assert verdict is Admit.SEND
            elif probe_out:
                assert verdict is Admit.WAIT
            elif verdict is Admit.PROBE:
                probe_out = True
        assert c.outage_s(now) >= 0 and (c.outage_s(now) == 0 or c.open)


def test_an_outage_of_refused_connections_is_probed_by_a_listing_and_says_when() -> None:
    circuit = CircuitBreaker(failures=1, probe_s=1.0, probe_max_s=4.0)
    assert circuit.probe_wait_s(0.0) == 0.0 and not circuit.listing_probes
    circuit.on_outage(DOWN, 10.0)
    assert circuit.listing_probes
    assert circuit.probe_wait_s(10.25) == 0.75
    assert circuit.admit(11.0)[0] is Admit.PROBE
    assert circuit.probe_wait_s(11.0) == 1.0, "a probe is out: the current wait"
    circuit.on_outage(DOWN, 11.5, probe=True)
    assert circuit.probe_wait_s(11.5) == 2.0, "the wait doubled"
    # an outage the server answered itself is probed by a request, not a listing
    circuit.on_outage(ServerError("502"), 12.0)
    assert not circuit.listing_probes
