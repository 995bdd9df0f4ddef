"""Broker outages: the pure tracker on a fake clock, and the aiokafka log handler built on it
(fed hand-made records, so no broker is needed)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

import aiokafka.conn
import pytest
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
)
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.broker_outage import BrokersReachable, BrokersUnreachable, OutageTracker
from consumer.kafka.client_logs import (
    CONNECTION_LOGGER,
    KafkaLogHandler,
    install_kafka_log_handler,
    is_broker_response,
)


# ---------------------------------------------------------------- tracker
def test_one_unreachable_for_many_failures_then_one_reachable() -> None:
    t = OutageTracker(settle_s=2.0)
    assert not t.down
    assert t.failure(10.0, "connect refused") == BrokersUnreachable(reason="connect refused", since_s=10.0)
    assert t.down
    for i in range(1, 200):
        assert t.failure(10.0 + i * 0.05, "connect refused again") is None
    last_failure = 10.0 + 199 * 0.05
    # answers while failures still come (or within settle_s of the last) do not end it
    assert t.success(last_failure + 1.9) is None
    assert t.down
    verdict = t.success(last_failure + 2.0)
    assert isinstance(verdict, BrokersReachable) and verdict.failures == 200
    assert verdict.down_s == pytest.approx(last_failure + 2.0 - 10.0)
    assert not t.down
    assert t.success(last_failure + 3.0) is None  # up: nothing to say


def test_a_failure_after_recovery_is_a_new_outage() -> None:
    t = OutageTracker(settle_s=0.5)
    assert t.failure(0.0, "a") is not None
    assert t.success(1.0) == BrokersReachable(down_s=1.0, failures=1)
    assert t.failure(5.0, "b") == BrokersUnreachable(reason="b", since_s=5.0)
    assert t.success(5.2) is None
    assert t.failure(5.3, "c") is None  # the same outage: the broker answered once, then failed
    verdict = t.success(6.0)
    assert isinstance(verdict, BrokersReachable) and verdict.failures == 2
    assert verdict.down_s == pytest.approx(1.0)


def test_success_while_up_says_nothing_and_settle_must_not_be_negative() -> None:
    assert OutageTracker().success(123.0) is None
    with pytest.raises(ValueError):
        OutageTracker(settle_s=-1)


@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=5.0, allow_nan=False)),
        max_size=60,
    )
)
def test_announcements_alternate_starting_with_unreachable(events: list[tuple[bool, float]]) -> None:
    t = OutageTracker(settle_s=1.0)
    now = 0.0
    said: list[BrokersUnreachable | BrokersReachable] = []
    for is_failure, step in events:
        now += step
        verdict: BrokersUnreachable | BrokersReachable | None = (
            t.failure(now, "x") if is_failure else t.success(now)
        )
        if verdict is not None:
            said.append(verdict)
    for i, verdict in enumerate(said):
        assert isinstance(verdict, BrokersUnreachable if i % 2 == 0 else BrokersReachable)
    assert t.down == (len(said) % 2 == 1)


# ---------------------------------------------------------------- handler
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def refused() -> logging.LogRecord:
    err = OSError(111, "Connect call failed ('127.0.0.1', 29092)")
    return record("aiokafka", logging.ERROR, "Unable connect to node with id %s: %s", 1, err)


def response() -> logging.LogRecord:
    return record(CONNECTION_LOGGER, logging.DEBUG, "Response from %s:%d %d: %s", "127.0.0.1", 29092, 7, "r")


@pytest.fixture
def conn_level() -> Iterator[None]:
    """The handler moves aiokafka.conn's level during an outage; put it back after the test."""
    logger = logging.getLogger(CONNECTION_LOGGER)
    saved = logger.level
    yield
    logger.setLevel(saved)


def make_handler(clock: FakeClock, **kwargs: Any) -> tuple[KafkaLogHandler, list[logging.LogRecord]]:
    passed: list[logging.LogRecord] = []
    handler = KafkaLogHandler(OutageTracker(settle_s=2.0), clock=clock, forward=passed.append, **kwargs)
    return handler, passed


def test_an_outage_is_one_warning_and_one_info(caplog: pytest.LogCaptureFixture, conn_level: None) -> None:
    clock = FakeClock()
    handler, passed = make_handler(clock)
    caplog.set_level(logging.DEBUG, logger="consumer.kafka.client_logs")
    for _ in range(100):
        handler.handle(refused())
        handler.handle(record("aiokafka", logging.ERROR, "Unable to update metadata from %s", [1]))
        handler.handle(
            record(
                "aiokafka.consumer.fetcher",
                logging.ERROR,
                "Failed fetch messages from %s: %s",
                1,
                NodeNotReadyError("node 1"),
            )
        )
        handler.handle(
            record("aiokafka.consumer.group_coordinator", logging.ERROR, "Heartbeat session expired")
        )
        clock.now += 0.1
    assert logging.getLogger(CONNECTION_LOGGER).getEffectiveLevel() == logging.DEBUG
    clock.now += 2.5
    handler.handle(response())
    handler.handle(response())
    assert passed == []  # every aiokafka record was folded (demoted below the ERROR passthrough)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "WARNING",
            "Kafka broker(s) unreachable: Unable connect to node with id 1: "
            "[Errno 111] Connect call failed ('127.0.0.1', 29092)",
        ),
        ("INFO", "Kafka broker(s) reachable again after 12 s (400 failed attempts)"),
    ]
    assert logging.getLogger(CONNECTION_LOGGER).level == logging.NOTSET


def test_hiccups_are_kept_for_debug_and_other_errors_pass(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    handler, passed = make_handler(clock)
    caplog.set_level(logging.DEBUG, logger="consumer.kafka.client_logs")
    hiccup = record(
        "aiokafka.consumer.group_coordinator",
        logging.ERROR,
        "Group Coordinator Request failed: %s",
        GroupCoordinatorNotAvailableError(),
    )
    handler.handle(hiccup)
    other = record(
        "aiokafka.consumer.consumer", logging.ERROR, "something else went wrong: %s", ValueError("x")
    )
    handler.handle(other)
    assert hiccup.levelno == logging.DEBUG and passed == [other]
    assert caplog.records == []  # neither is an outage
    # with DEBUG passthrough (--log-level DEBUG) the demoted records are shown too
    debug_handler, debug_passed = make_handler(clock, passthrough_level=logging.DEBUG)
    failed = refused()
    debug_handler.handle(failed)
    assert debug_passed == [failed] and failed.levelname == "DEBUG"


def test_a_refused_login_is_an_unreachable_broker_and_no_summary_when_not_announcing(
    caplog: pytest.LogCaptureFixture, conn_level: None
) -> None:
    clock = FakeClock()
    handler, passed = make_handler(clock, announce=False)
    caplog.set_level(logging.DEBUG, logger="consumer.kafka.client_logs")
    auth = SaslAuthenticationFailed("Authentication failed due to invalid credentials")
    handler.handle(record("aiokafka", logging.ERROR, 'Unable connect to "%s:%s": %s', "127.0.0.1", 1, auth))
    assert handler.tracker.down and passed == [] and caplog.records == []


def test_install_replaces_the_handler_and_stops_propagation(conn_level: None) -> None:
    kafka = logging.getLogger("aiokafka")
    saved = (kafka.level, kafka.propagate, list(kafka.handlers))
    try:
        first = install_kafka_log_handler(passthrough_level=logging.CRITICAL, announce=False)
        second = install_kafka_log_handler()
        assert first not in kafka.handlers and second in kafka.handlers
        assert kafka.propagate is False and kafka.level == logging.WARNING
    finally:
        kafka.setLevel(saved[0])
        kafka.propagate = saved[1]
        kafka.handlers[:] = saved[2]


def test_aiokafka_still_logs_the_response_record_the_handler_listens_for() -> None:
    """The reachable signal is aiokafka's own DEBUG line: fail here if a new aiokafka drops it."""
    assert '"Response from %s:%d %d: %s"' in inspect.getsource(aiokafka.conn)
    assert is_broker_response(response())
    assert not is_broker_response(record(CONNECTION_LOGGER, logging.DEBUG, "Request to %s:%d", "h", 1))


def test_connection_errors_with_repr_formatting_count_too(conn_level: None) -> None:
    clock = FakeClock()
    handler, _ = make_handler(clock)
    handler.handle(
        record(
            "aiokafka",
            logging.WARNING,
            "Unable to request metadata from node with id %s: %r",
            1,
            KafkaConnectionError("Connection at 127.0.0.1:29092 closed"),
        )
    )
    assert handler.tracker.down
