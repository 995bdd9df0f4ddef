"""Common aiokafka client arguments from Settings (bootstrap servers and security), and a
one-connection check that names a refused SASL login."""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka.conn import collect_hosts, create_conn
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from consumer.core.errors import ConfigError
from consumer.settings import KafkaSecurity, Settings

#: jobs may be large (DESIGN: a 2 MB job must dead-letter cleanly, its bytes kept in base64)
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
#: how long `check_connection` waits for one bootstrap server (connect, TLS, SASL)
CHECK_TIMEOUT_S = 15.0

#: what a broker answers when it refuses the client's SASL login
SASL_REFUSALS = (
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    UnsupportedSaslMechanismError,
    IllegalSaslStateError,
)


def client_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments shared by every aiokafka client (consumer, producer, admin).

    The SASL password is unwrapped only here, straight into the client: it is never logged.
    """
    sec = settings.kafka
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": sec.security_protocol,
    }
    if sec.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = ssl.create_default_context(cafile=sec.ssl_cafile)
    if sec.security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = sec.sasl_mechanism or "PLAIN"
        kwargs["sasl_plain_username"] = sec.sasl_username
        kwargs["sasl_plain_password"] = sec.sasl_password.get_secret_value() if sec.sasl_password else None
    return kwargs


#: heartbeats go at least this often: a member learns of a rebalance from its next heartbeat,
#: and the members that learnt first hold their outcomes until the last one has joined
HEARTBEAT_MAX_MS = 1000


def group_kwargs(settings: Settings) -> dict[str, Any]:
    """The consumer-group membership keywords of an `AIOKafkaConsumer` in a group: the
    session (`session_timeout_s`) and a heartbeat every third of it, at most HEARTBEAT_MAX_MS
    apart."""
    session_ms = int(settings.session_timeout_s * 1000)
    return {"session_timeout_ms": session_ms, "heartbeat_interval_ms": _heartbeat_ms(session_ms)}


def heartbeat_interval_s(settings: Settings) -> float:
    """How often a member of the job group heartbeats (`group_kwargs`)."""
    return _heartbeat_ms(int(settings.session_timeout_s * 1000)) / 1000


def _heartbeat_ms(session_ms: int) -> int:
    return max(1, min(session_ms // 3, HEARTBEAT_MAX_MS))


def membership_kwargs(settings: Settings) -> dict[str, Any]:
    """`group_kwargs` of the job group's members: a sticky assignment, so a rebalance moves as
    few partitions as it must (round robin second: a group whose older members offer only it
    still agrees on one), and static membership when `instance_id` is set."""
    kwargs = group_kwargs(settings)
    kwargs["partition_assignment_strategy"] = (StickyPartitionAssignor, RoundRobinPartitionAssignor)
    if settings.instance_id is not None:
        kwargs["group_instance_id"] = settings.instance_id
    return kwargs


def sasl_refused(security: KafkaSecurity) -> ConfigError:
    """The error for a broker that refused the SASL login: names the user and the variables
    that set it, never the password (nor the broker's words, which could echo it)."""
    mechanism = security.sasl_mechanism or "PLAIN"
    return ConfigError(
        "PROMPTBUS_KAFKA__SASL_USERNAME",
        f"Kafka refused the {mechanism} login of user {security.sasl_username!r} "
        "(check it and PROMPTBUS_KAFKA__SASL_PASSWORD)",
    )


#: Kafka's error code for a topic the principal is not authorized to (ACLs)
TOPIC_AUTHORIZATION_FAILED = 29


def topic_refused(security: KafkaSecurity, topic: str) -> ConfigError:
    """The error for a topic the broker's ACLs do not let the user describe (and so neither
    read nor write): names the user and the topic (docs/operations.md#acls)."""
    user = security.sasl_username or "ANONYMOUS"
    return ConfigError(
        "PROMPTBUS_KAFKA__SASL_USERNAME",
        f"Kafka's ACLs do not let user {user!r} use topic {topic!r} (TOPIC_AUTHORIZATION_FAILED)",
    )


async def check_connection(settings: Settings, *, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Open one connection to a bootstrap server (TLS and SASL as configured), then close it.

    Raises `ConfigError` (`sasl_refused`) when a broker refuses the login, and
    `KafkaConnectionError` when no bootstrap server could be reached. aiokafka's clients log
    a refused login as one more failed connection and then fail with "Unable to bootstrap",
    so commands call this first to say what is wrong.
    """
    kwargs = client_kwargs(settings)
    kwargs.pop("bootstrap_servers")
    failures: list[str] = []
    for host, port, _family in collect_hosts(settings.kafka_bootstrap_servers, randomize=False):
        try:
            conn = await create_conn(
                host, port, client_id="promptbus-check", request_timeout_ms=int(timeout_s * 1000), **kwargs
            )
        except SASL_REFUSALS:
            raise sasl_refused(settings.kafka) from None
        except (OSError, TimeoutError, KafkaConnectionError) as exc:
            failures.append(f"{host}:{port}: {str(exc) or type(exc).__name__}")
            continue
        conn.close()
        return
    raise BootstrapUnreachable(f"no bootstrap server answered ({'; '.join(failures)})")


class BootstrapUnreachable(KafkaConnectionError):
    """No bootstrap server answered the connection check (`reason` says what each did)."""

    @property
    def reason(self) -> str:
        return str(self.args[0])


def unreachable(exc: KafkaConnectionError, settings: Settings) -> str:
    """The one wording of a broker that cannot be reached, whichever client found it: the
    check's own reason, or aiokafka's failure said with the bootstrap servers it tried."""
    if isinstance(exc, BootstrapUnreachable):
        return exc.reason
    detail = str(exc.args[0]) if exc.args else type(exc).__name__
    if detail.startswith("Unable to bootstrap"):
        return f"no bootstrap server answered ({settings.kafka_bootstrap_servers})"
    return f"{settings.kafka_bootstrap_servers}: {detail}"
