"""The job group's membership keywords (`consumer.kafka.connection.membership_kwargs`) and
PROMPTBUS_INSTANCE_ID: a sticky assignment first, static membership only when an instance id
is set, heartbeats at most 1 s apart, and a bad instance id refused at startup naming the
variable."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from consumer.core.errors import ConfigError
from consumer.kafka.connection import HEARTBEAT_MAX_MS, group_kwargs, membership_kwargs
from consumer.settings import load_settings


def test_dynamic_membership_by_default_with_a_sticky_assignment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMPTBUS_INSTANCE_ID", raising=False)
    kwargs = membership_kwargs(load_settings())
    assert "group_instance_id" not in kwargs
    assert kwargs["partition_assignment_strategy"] == (StickyPartitionAssignor, RoundRobinPartitionAssignor)


def test_an_instance_id_is_static_membership(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTBUS_INSTANCE_ID", "promptbus-2")
    assert membership_kwargs(load_settings())["group_instance_id"] == "promptbus-2"


@pytest.mark.parametrize(("session_s", "heartbeat_ms"), [("10", HEARTBEAT_MAX_MS), ("6", 1000), ("2.4", 800)])
def test_heartbeats_every_third_of_the_session_at_most_a_second_apart(
    monkeypatch: pytest.MonkeyPatch, session_s: str, heartbeat_ms: int
) -> None:
    monkeypatch.setenv("PROMPTBUS_SESSION_TIMEOUT_S", session_s)
    kwargs = group_kwargs(load_settings())
    assert kwargs["heartbeat_interval_ms"] == heartbeat_ms
    assert kwargs["session_timeout_ms"] >= 3 * heartbeat_ms


@pytest.mark.parametrize("bad", ["pod 0", "", "x" * 250, "pod/0"])
def test_a_bad_instance_id_stops_startup_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("PROMPTBUS_INSTANCE_ID", bad)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "PROMPTBUS_INSTANCE_ID" in str(err.value)
