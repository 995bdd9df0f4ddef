"""A correction of aiokafka's group join: one JoinGroup request carries every assignor.

aiokafka (0.14 and earlier; aio-libs/aiokafka pull request 1168 fixes it upstream) sends its
JoinGroup request inside the loop over the consumer's assignors: a member with two (the job
group offers sticky, then round robin: `connection.membership_kwargs`) joins twice on every
rebalance, first offering only the first protocol, then both. The second join changes the
member's protocols, which makes the coordinator start another rebalance; two members doing
this at once can invalidate each other's generation indefinitely (the leader's SyncGroup
answered REBALANCE_IN_PROGRESS every time), so a starting instance may wait minutes for its
first assignment while the other one's partitions are revoked every heartbeat.

`apply()` replaces `CoordinatorGroupRebalance.perform_group_join` with the same procedure,
the protocol list built first and then sent in one request (the KIP-394 member-id round trip
kept), but only when the installed aiokafka still sends the request inside the loop: a
release with the fix keeps its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import aiokafka.errors as errors
from aiokafka.consumer import group_coordinator
from aiokafka.coordinator.protocol import ConsumerProtocol
from aiokafka.protocol.group import JoinGroupRequest

log = logging.getLogger(group_coordinator.__name__)

_applied = False


def joins_once_per_assignor() -> bool:
    """Whether the installed aiokafka sends a JoinGroup request per assignor: its join loop
    (`try_join = True`) is indented under the `for assignor` loop."""
    try:
        source = inspect.getsource(group_coordinator.CoordinatorGroupRebalance.perform_group_join)
    except (OSError, TypeError):
        return False
    lines = source.splitlines()
    loop = next((line for line in lines if "for assignor in self._assignors" in line), None)
    join = next((line for line in lines if line.strip() == "try_join = True"), None)
    if loop is None or join is None:
        return False
    return _indent(join) > _indent(loop)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def apply() -> None:
    """Install the one-request join when the installed aiokafka needs it (once per process)."""
    global _applied
    if _applied:
        return
    _applied = True
    if joins_once_per_assignor():
        group_coordinator.CoordinatorGroupRebalance.perform_group_join = _perform_group_join


async def _perform_group_join(self: Any) -> tuple[str, bytes] | None:
    """aiokafka 0.14's `CoordinatorGroupRebalance.perform_group_join`, with the protocol list
    complete before the JoinGroup request is sent (once, or twice for KIP-394's member id)."""
    log.info("(Re-)joining group %s", self.group_id)

    topics = self._subscription.topics
    metadata_list = []
    for assignor in self._assignors:
        metadata = assignor.metadata(topics)
        if not isinstance(metadata, bytes):
            metadata = metadata.encode()
        metadata_list.append((assignor.name, metadata))

    # for KIP-394 we may have to send a second join request
    try_join = True
    while try_join:
        try_join = False
        request = JoinGroupRequest(
            self.group_id,
            self._session_timeout_ms,
            self._rebalance_timeout_ms,
            self._coordinator.member_id,
            self._coordinator._group_instance_id,
            ConsumerProtocol.PROTOCOL_TYPE,
            metadata_list,
        )
        log.debug("Sending JoinGroup (%s) to coordinator %s", request, self.coordinator_id)
        try:
            response = await self._coordinator._send_req(request)
        except errors.KafkaError:
            # Return right away. It's a connection error, so backoff will be
            # handled by coordinator lookup
            return None
        if not self._subscription.active:
            # Subscription changed. Ignore response and restart group join
            return None

        error_type = errors.for_code(response.error_code)
        if error_type is errors.MemberIdRequired:
            self._coordinator.member_id = response.member_id
            try_join = True

    if error_type is errors.NoError:
        log.debug("Join group response %s", response)
        self._coordinator.member_id = response.member_id
        self._coordinator.generation = response.generation_id
        protocol = response.group_protocol
        log.info(
            "Joined group '%s' (generation %s) with member_id %s",
            self.group_id,
            response.generation_id,
            response.member_id,
        )
        if response.leader_id == response.member_id:
            log.info("Elected group leader -- performing partition assignments using %s", protocol)
            assignment_bytes = await self._on_join_leader(response)
        else:
            assignment_bytes = await self._on_join_follower()
        if assignment_bytes is None:
            return None
        return (protocol, assignment_bytes)
    elif error_type is errors.GroupLoadInProgressError:
        # Backoff and retry
        log.debug(
            "Attempt to join group %s rejected since coordinator %s is loading the group.",
            self.group_id,
            self.coordinator_id,
        )
        await asyncio.sleep(self._retry_backoff_ms / 1000)
    elif error_type is errors.UnknownMemberIdError:
        # reset the member id and retry immediately
        self._coordinator.reset_generation()
        log.debug("Attempt to join group %s failed due to unknown member id", self.group_id)
    elif error_type in (errors.GroupCoordinatorNotAvailableError, errors.NotCoordinatorForGroupError):
        # Coordinator changed we should be able to find it immediately
        err = error_type()
        self._coordinator.coordinator_dead()
        log.debug(
            "Attempt to join group %s failed due to obsolete coordinator information: %s",
            self.group_id,
            err,
        )
    elif error_type in (
        errors.InconsistentGroupProtocolError,
        errors.InvalidSessionTimeoutError,
        errors.InvalidGroupIdError,
    ):
        err = error_type()
        log.error("Attempt to join group failed due to fatal error: %s", err)
        raise err
    elif error_type is errors.GroupAuthorizationFailedError:
        raise error_type(self.group_id)
    else:
        err = error_type()
        log.error("Unexpected error in join group '%s' response: %s", self.group_id, err)
        raise errors.KafkaError(repr(err))
    return None
