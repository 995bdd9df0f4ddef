"""aiokafka's log records, folded: a broker outage is one WARNING and one INFO line.

aiokafka logs every failed reconnect at ERROR (about a hundred lines a second while a broker
is away). `KafkaLogHandler` sits on the `aiokafka` logger, which then no longer propagates,
and sorts each record it gets:

- a connection failure: the record carries an `OSError`, `TimeoutError`,
  `KafkaConnectionError`, `NodeNotReadyError` or a SASL authentication error, or it is one of
  aiokafka's "Unable to update metadata" / "Heartbeat session expired" lines. It goes to an
  `OutageTracker`; the first of an outage becomes one WARNING
  ``Kafka broker(s) unreachable: <reason>`` on this module's logger, the record itself is
  demoted to DEBUG.
- a broker answer: aiokafka's DEBUG ``Response from host:port`` on `aiokafka.conn`. It is a
  reply read from a broker, so the brokers are reachable. That logger is set to DEBUG only
  while an outage lasts, so the normal request path creates no records. The first answer
  after the failures stopped for `settle_s` becomes one INFO
  ``Kafka broker(s) reachable again after N s``.
- a retriable broker error (leader moved, coordinator not available or loading): aiokafka
  retries it itself; demoted to DEBUG.
- anything else: passed to the root logger's handlers when at or above `passthrough_level`.

Records are demoted rather than dropped, so ``--log-level DEBUG`` still shows all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from consumer.core.broker_outage import DEFAULT_SETTLE_S, BrokersReachable, BrokersUnreachable, OutageTracker

log = logging.getLogger(__name__)

KAFKA_LOGGER = "aiokafka"
#: the logger of aiokafka's connections, whose DEBUG "Response from" is the reachable signal
CONNECTION_LOGGER = "aiokafka.conn"

#: exceptions in a record that mean a broker could not be reached (or refused the client)
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    KafkaConnectionError,
    NodeNotReadyError,
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    UnsupportedSaslMechanismError,
    IllegalSaslStateError,
)
#: aiokafka lines without an exception that only come when no broker answers
CONNECTION_FAILURE_MESSAGES = (
    "Unable to update metadata from",
    "Heartbeat session expired",
)
RESPONSE_MESSAGE = "Response from"


def _exceptions(record: logging.LogRecord) -> list[BaseException]:
    found: list[BaseException] = []
    if isinstance(record.args, tuple):
        found += [a for a in record.args if isinstance(a, BaseException)]
    if record.exc_info and record.exc_info[1] is not None:
        found.append(record.exc_info[1])
    return found


def is_connection_failure(record: logging.LogRecord) -> bool:
    """True for an aiokafka record that says a broker could not be reached."""
    if record.levelno < logging.WARNING:
        return False
    if any(isinstance(e, CONNECTION_ERRORS) for e in _exceptions(record)):
        return True
    return isinstance(record.msg, str) and record.msg.startswith(CONNECTION_FAILURE_MESSAGES)


def is_retriable_hiccup(record: logging.LogRecord) -> bool:
    """True for an aiokafka record about a retriable broker error aiokafka retries itself."""
    return record.levelno >= logging.WARNING and any(
        isinstance(e, KafkaError) and e.retriable for e in _exceptions(record)
    )


def is_broker_response(record: logging.LogRecord) -> bool:
    """True for aiokafka's record of a response read from a broker."""
    return (
        record.name == CONNECTION_LOGGER
        and isinstance(record.msg, str)
        and record.msg.startswith(RESPONSE_MESSAGE)
    )


class KafkaLogHandler(logging.Handler):
    """The handler of the `aiokafka` logger: outages folded into two lines (module doc)."""

    def __init__(
        self,
        tracker: OutageTracker,
        *,
        passthrough_level: int = logging.ERROR,
        announce: bool = True,
        clock: Callable[[], float] = time.monotonic,
        forward: Callable[[logging.LogRecord], Any] | None = None,
    ) -> None:
        super().__init__()
        self.tracker = tracker
        self.passthrough_level = passthrough_level
        self.announce = announce
        self._clock = clock
        self._forward = forward or logging.getLogger().handle

    def emit(self, record: logging.LogRecord) -> None:
        """Sort one aiokafka record: fold it into the outage, demote it, or pass it on."""
        if is_broker_response(record):
            self._reached(self.tracker.success(self._clock()))
        elif is_connection_failure(record):
            self._lost(self.tracker.failure(self._clock(), record.getMessage()))
            _demote(record)
        elif is_retriable_hiccup(record):
            _demote(record)
        if record.levelno >= self.passthrough_level:
            self._forward(record)

    def _lost(self, verdict: BrokersUnreachable | None) -> None:
        if verdict is None:
            return
        # listen for the broker's answers only while they are missing
        logging.getLogger(CONNECTION_LOGGER).setLevel(logging.DEBUG)
        if self.announce:
            log.warning("Kafka broker(s) unreachable: %s", verdict.reason)

    def _reached(self, verdict: BrokersReachable | None) -> None:
        if verdict is None:
            return
        logging.getLogger(CONNECTION_LOGGER).setLevel(logging.NOTSET)
        if self.announce:
            log.info(
                "Kafka broker(s) reachable again after %.0f s (%d failed attempts)",
                verdict.down_s,
                verdict.failures,
            )


def _demote(record: logging.LogRecord) -> None:
    record.levelno = logging.DEBUG
    record.levelname = logging.getLevelName(logging.DEBUG)


def install_kafka_log_handler(
    *, passthrough_level: int = logging.ERROR, announce: bool = True, settle_s: float = DEFAULT_SETTLE_S
) -> KafkaLogHandler:
    """Put a fresh `KafkaLogHandler` on the `aiokafka` logger (replacing an earlier one).

    aiokafka's records stop propagating; the handler passes on what it keeps. The logger's
    level admits WARNING (connection failures) even when `passthrough_level` is higher.
    """
    kafka = logging.getLogger(KAFKA_LOGGER)
    for old in [h for h in kafka.handlers if isinstance(h, KafkaLogHandler)]:
        kafka.removeHandler(old)
    handler = KafkaLogHandler(OutageTracker(settle_s), passthrough_level=passthrough_level, announce=announce)
    kafka.addHandler(handler)
    kafka.propagate = False
    kafka.setLevel(min(passthrough_level, logging.WARNING))
    logging.getLogger(CONNECTION_LOGGER).setLevel(logging.NOTSET)
    return handler
