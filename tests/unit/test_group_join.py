"""The job group's join sends one JoinGroup request offering every assignor (`group_join`):
aiokafka's own sends one per assignor, and the second, with more protocols, makes the
coordinator rebalance again (two starting members can keep each other from ever syncing)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiokafka.errors as errors
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.protocol.group import JoinGroupRequest

from consumer.kafka import group_join


class _Coordinator:
    """What a rebalance uses of aiokafka's GroupCoordinator; answers JoinGroup from a script."""

    def __init__(self, answers: list[Any]) -> None:
        self.member_id = ""
        self.generation = -1
        self._group_instance_id = None
        self._rebalance_timeout_ms = 4000
        #: each JoinGroup request as sent: (member id, protocol names)
        self.joins: list[tuple[str, list[str]]] = []
        self._answers = answers
        self.resets = 0

    async def _send_req(self, request: Any) -> Any:
        assert isinstance(request, JoinGroupRequest)
        self.joins.append((request._member_id, [name for name, _ in request._group_protocols]))
        return self._answers.pop(0)

    def reset_generation(self) -> None:
        self.resets += 1


def _rebalance(coordinator: _Coordinator) -> CoordinatorGroupRebalance:
    subscription = SimpleNamespace(topics={"jobs"}, active=True)
    assignors = (StickyPartitionAssignor, RoundRobinPartitionAssignor)
    return CoordinatorGroupRebalance(coordinator, "group", 1, subscription, assignors, 4000, 100)


async def test_one_join_request_offers_every_assignor_and_keeps_the_member_id_round_trip() -> None:
    group_join.apply()
    member_id_required = SimpleNamespace(error_code=errors.MemberIdRequired.errno, member_id="m-1")
    unknown_member = SimpleNamespace(error_code=errors.UnknownMemberIdError.errno, member_id="")
    coordinator = _Coordinator([member_id_required, unknown_member, unknown_member])
    assert await _rebalance(coordinator).perform_group_join() is None
    # KIP-394: the first request learns the member id, the second joins with it; both offer
    # sticky then round robin (aiokafka's own join sends sticky alone, then a third request)
    assert coordinator.joins == [("", ["sticky", "roundrobin"]), ("m-1", ["sticky", "roundrobin"])]
    assert coordinator.resets == 1  # the unknown member id was handled as aiokafka does
