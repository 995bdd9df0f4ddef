"""Intake: the consumer-group edge. `JobIntake` is the Protocol; `KafkaIntake` wraps aiokafka.

Kafka vocabulary is kept verbatim (assignment, pause, resume, commit, highwater). Offsets are
committed only by the delivery sink (`consumer.kafka.sink`), never automatically.

A commit may name offsets above it whose outcomes are already durable (a `CommitPoint`); they
go into the commit's offset metadata (`consumer.core.offsets.encode_done`). On assignment the
intake reads the metadata of each partition's committed offset, and `poll` drops the records
it names: they were finished by an earlier owner (counted in `skipped_done`, logged once per
partition). Until this owner's commits pass them, its own commits name them again, so a
second crash does not redo them either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, OffsetMetadataTooLargeError
from aiokafka.structs import OffsetAndMetadata

from consumer.core.errors import MembershipLost
from consumer.core.lag import PartitionOffsets
from consumer.core.offsets import (
    METADATA_MAX_CHARS,
    NO_OFFSETS,
    CommitPoint,
    DoneOffsets,
    decode_done,
    encode_done,
)
from consumer.core.tuples import maker
from consumer.kafka import group_join
from consumer.kafka.assignment import Assignment
from consumer.kafka.connection import (
    MAX_MESSAGE_BYTES,
    client_kwargs,
    heartbeat_interval_s,
    membership_kwargs,
)
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.settings import Settings

log = logging.getLogger(__name__)

#: reading the committed offsets' metadata on assignment may take this long (it retries
#: inside); past it the partition is read without skipping anything
COMMITTED_FETCH_TIMEOUT_S = 10.0


class InRecord(NamedTuple):
    """One fetched input record (a NamedTuple: one is made per record)."""

    source: SourceOffset
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


_new_record, _new_source = maker(InRecord), maker(SourceOffset)


class RebalanceHandler(Protocol):
    """What the pipeline does when the group moves partitions (awaited inside the rebalance).

    aiokafka speaks the eager protocol: a rebalance revokes every partition of every member,
    and which of them move is known only on assignment. So `on_revoked` only makes what is
    done durable and holds new outcomes (it must return at once: the whole group waits for
    it), `on_lost` ends the work of the partitions another member owns now, and `on_assigned`
    begins the new ones and lets the kept ones go on (their work never stopped).
    """

    async def on_revoked(self, partitions: set[TopicPartition]) -> None:
        """A rebalance began: any of these partitions may move."""
        ...

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        """These partitions moved to another member: end their work, commit nothing more."""
        ...

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        """The new assignment (kept partitions included); called after `on_lost`."""
        ...


class JobIntake(Protocol):
    group_id: str

    async def start(self, handler: RebalanceHandler) -> None: ...

    async def stop(self) -> None: ...

    async def leave_group(self) -> None:
        """Leave the group now (its partitions go to the other members at once, with no
        revoke callback here); nothing is read or committed after it."""
        ...

    async def poll(self, timeout_s: float, max_records: int) -> list[InRecord]: ...

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, partitions: Iterable[TopicPartition]) -> None: ...

    def resume(self, partitions: Iterable[TopicPartition]) -> None: ...

    def paused(self) -> set[TopicPartition]: ...

    async def commit(self, offsets: dict[TopicPartition, int | CommitPoint]) -> None:
        """Commit positions; a CommitPoint also names the offsets finished above its position."""
        ...

    #: records `poll` dropped because an earlier owner of their partition had finished them
    skipped_done: int

    def has_unfetched(self) -> bool:
        """True when some assigned partition holds records not fetched yet (could still join a window)."""
        ...

    async def partition_offsets(self) -> dict[TopicPartition, PartitionOffsets]:
        """Log end, committed offset and fetch position of each owned partition (consumer lag)."""
        ...


class _Listener(ConsumerRebalanceListener):
    def __init__(
        self,
        handler: RebalanceHandler,
        keep: Callable[[set[TopicPartition]], set[TopicPartition]],
        load: Callable[[set[TopicPartition]], Awaitable[None]],
        joined: Callable[[], None],
    ) -> None:
        self._handler = handler
        self._keep = keep
        self._load = load
        self._joined = joined

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        await self._handler.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        # first, before any await: kept partitions go on from where they were fetched to (and
        # whether any is kept is judged on the lease as it was before this assignment)
        lost = self._keep(set(assigned))
        # an assignment is the group's answer to this member's join: the lease starts afresh
        self._joined()
        if lost:
            await self._handler.on_lost(lost)
        # what earlier owners finished above the committed offsets is known before any record
        await self._load(set(assigned))
        await self._handler.on_assigned(set(assigned))


class KafkaIntake:
    """aiokafka consumer in a group on the job topics (every lane's), manual commits,
    read_committed. topics: the lanes' topics (None: the jobs topic)."""

    def __init__(
        self,
        settings: Settings,
        *,
        client_id: str,
        assignment: Assignment | None = None,
        topics: Sequence[str] | None = None,
    ) -> None:
        group_join.apply()  # one JoinGroup request per join, whatever aiokafka's release
        self.group_id = settings.group_id
        self._session_s = settings.session_timeout_s
        self._heartbeat_s = heartbeat_interval_s(settings)
        #: this member's id at its last assignment (`_membership_continued`)
        self._last_member_id: str | None = None
        #: the partitions of the last assignment (a forgotten one among them is not read on)
        self._assigned: set[TopicPartition] = set()
        self._topics = list(topics) if topics else [settings.jobs_topic]
        self._consumer = AIOKafkaConsumer(
            group_id=settings.group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
            # the pipeline polls continuously even when paused, so a short poll interval is safe
            max_poll_interval_ms=300_000,
            **membership_kwargs(settings),
            **client_kwargs(settings),
        )
        #: per owned partition: its fetch position and what an earlier owner finished (shared
        #: with the sink, which keeps the epochs there)
        self.owned = assignment if assignment is not None else Assignment()
        self._listener: _Listener | None = None
        #: metadata text limit; halved when the broker's offset.metadata.max.bytes is lower
        self._metadata_max_chars = METADATA_MAX_CHARS
        #: records dropped by `poll` because an earlier owner had finished them
        self.skipped_done = 0

    async def start(self, handler: RebalanceHandler) -> None:
        self._listener = _Listener(handler, self._keep_positions, self._load_done, self._joined)
        self._consumer.subscribe(self._topics, listener=self._listener)
        await self._consumer.start()
        self._observe_heartbeats()

    def _joined(self) -> None:
        self.owned.lease.confirm(time.monotonic())

    def _observe_heartbeats(self) -> None:
        """Confirm the membership lease with every heartbeat the group answers (stamped with
        when it was sent). aiokafka has no public hook for heartbeats; its coordinator's
        `_do_heartbeat` (True: answered, the member still in the group) is looked up on each
        beat, so wrapping it on the instance sees them all."""
        lease = self.owned.lease
        lease.arm(self._session_s, time.monotonic(), heartbeat_s=self._heartbeat_s)
        coordinator = getattr(self._consumer, "_coordinator", None)
        beat = getattr(coordinator, "_do_heartbeat", None)
        if beat is None:
            log.warning("cannot observe the group's heartbeats: outcomes are written without a lease")
            lease.session_s = None
            return

        async def observed_beat() -> bool:
            sent_s = time.monotonic()
            answered = bool(await beat())
            if answered:
                lease.confirm(sent_s)
            return answered

        coordinator._do_heartbeat = observed_beat  # type: ignore[union-attr]

    def rejoin(self) -> None:
        """Ask the group for a new assignment: a rebalance (the handler's `on_revoked`, then
        `on_assigned`). A partition this instance forgot meanwhile (`owned.revoke`: its
        transactional producer was fenced) is assigned afresh, read from its committed offset;
        one still owned goes on from its fetch position.

        The request goes to aiokafka's group coordinator (`request_rejoin`: its routine joins
        again at its next turn, whatever it is doing now). Subscribing again, aiokafka's public
        way, replaces the subscription: when that happens while the coordinator routine is in
        the middle of a rebalance (a member whose producers were fenced is often being expelled
        at that very moment), the routine ends on an AssertionError and the consumer stops.
        """
        if self._listener is None:
            return  # not started: the first join assigns afresh anyway
        log.info("rejoining group %s for a new assignment", self.group_id)
        coordinator = getattr(self._consumer, "_coordinator", None)
        request_rejoin = getattr(coordinator, "request_rejoin", None)
        if request_rejoin is None:
            self._consumer.subscribe(self._topics, listener=self._listener)
            return
        request_rejoin()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def leave_group(self) -> None:
        # closing the consumer sends LeaveGroup (dynamic membership; a static member's
        # partitions wait for it under its name) and calls no revoke; `stop` is then a no-op
        log.info("leaving group %s", self.group_id)
        await self._consumer.stop()

    def _keep_positions(self, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """The owned partitions not in `assigned` (lost: forgotten here); the kept ones skip
        what they had fetched.

        aiokafka's new assignment starts every partition at its committed offset; a kept
        partition's records between that and its fetch position are in this instance's
        windows and requests already, and must not be taken in twice (`poll` skips them). No
        record is returned between the revoke and the assignment (aiokafka holds them back),
        so the positions recorded by the last poll are current.
        """
        first_join = self._last_member_id is None
        if self._membership_continued():
            lost = {tp for tp in self.owned if tp not in assigned}
        else:
            # this member left the group in between (expelled and joined again, or a
            # generation went by without it): another member may have owned any partition
            # meanwhile and read and committed past this instance's positions; none is kept,
            # each assigned one starts afresh from its committed offset
            lost = set(self.owned)
            if not first_join or lost:
                log.warning(
                    "group %s: joined again as a new member (this one was expelled or missed a "
                    "generation); it keeps none of the %d partitions it held, every assigned one "
                    "starts from its committed offset",
                    self.group_id,
                    len(lost),
                )
        self.owned.revoke(lost)
        self._assigned = set(assigned)
        for tp in assigned:
            state = self.owned.get(tp)
            if state is not None and state.fetched_to is not None:
                # not a seek: aiokafka's fetcher may be resetting the new assignment's positions
                # to the committed offsets right now, and a seek under it breaks its state
                state.skip_below = state.fetched_to
        return lost

    def _membership_continued(self) -> bool:
        """Whether this member has stayed in the group since its last assignment: then no
        other member can have owned its partitions in between. A member the group expelled
        (its session lapsed) or that missed a generation joins again under a new member id
        (aiokafka resets it on UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION).

        aiokafka has no public view of its member id: its coordinator's attribute is read
        (without it, the membership lease decides: no heartbeat answered for a session, the
        member may have been expelled).
        """
        coordinator = getattr(self._consumer, "_coordinator", None)
        member_id = getattr(coordinator, "member_id", None)
        if not isinstance(member_id, str):
            return self.owned.lease.held(time.monotonic())
        last, self._last_member_id = self._last_member_id, member_id
        return last == member_id

    async def _load_done(self, partitions: set[TopicPartition]) -> None:
        """Read the committed offsets' metadata: what earlier owners finished above them.

        Never raises (a failure only means those records are done again): it runs inside
        the rebalance.
        """
        partitions = {tp for tp in partitions if not self.owned.assign(tp).done_read}
        if not partitions:
            return
        try:
            committed = await self._fetch_committed(partitions)
        except Exception:
            log.warning(
                "could not read the committed offsets' metadata of %s; records finished above "
                "them by an earlier owner will be done again",
                sorted(partitions),
                exc_info=True,
            )
            committed = {}
        for tp in partitions:
            state = self.owned.assign(tp)
            state.done_read, state.done = True, NO_OFFSETS
            meta = committed.get(tp)
            if meta is None or meta.offset < 0:
                continue
            decoded = decode_done(meta.offset, meta.metadata or "")
            if decoded.reason is not None:
                log.warning(
                    "%s: the metadata of committed offset %d is not used (%s)",
                    tp,
                    meta.offset,
                    decoded.reason,
                )
            elif decoded.done:
                state.done = decoded.done
                log.info(
                    "%s: %d records above committed offset %d were finished by an earlier owner; "
                    "skipping them",
                    tp,
                    len(decoded.done),
                    meta.offset,
                )

    async def _fetch_committed(self, partitions: set[TopicPartition]) -> dict[TopicPartition, Any]:
        """The group's committed OffsetAndMetadata of these partitions.

        `AIOKafkaConsumer.committed()` returns the offset without its metadata; its group
        coordinator (the same connection and retries `committed()` uses) returns both. No
        public API of the consumer does, hence the private attribute.
        """
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None:
            return {}
        fetch = coordinator.fetch_committed_offsets(list(partitions))
        result: dict[TopicPartition, Any] = await asyncio.wait_for(fetch, COMMITTED_FETCH_TIMEOUT_S)
        return result

    async def poll(self, timeout_s: float, max_records: int) -> list[InRecord]:
        batches = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        out: list[InRecord] = []
        for tp, records in batches.items():
            state = self.owned.get(tp)
            if state is None and tp in self._assigned:
                # forgotten since its assignment (its transactional producer was fenced): not
                # ours until the group says so again; its next owner reads these records again
                # from the committed offset, and they must not be taken in here under a new epoch
                continue
            if state is None or not state.done_read:  # assigned without the listener seeing it
                await self._load_done({tp})
                state = self.owned.assign(tp)
            if state.skip_below is not None:
                records = [r for r in records if r.offset >= state.skip_below]
            done = state.done
            if done:
                kept = [r for r in records if r.offset not in done]
                self.skipped_done += len(records) - len(kept)
                records = kept
            out += [
                _new_record(
                    (
                        _new_source((tp, r.offset)),
                        r.key,
                        r.value,
                        tuple(r.headers) if r.headers else (),
                        r.timestamp,
                    )
                )
                for r in records
            ]
        for tp in self._consumer.assignment():
            # the consumer's own position: it also steps over transaction markers, which take
            # an offset after a transactional producer's records but are never returned
            # (last record + 1 would leave one "unfetched" offset behind forever)
            state = self.owned.get(tp)
            if state is not None:
                try:
                    position = await self._consumer.position(tp)
                    if state.skip_below is not None:
                        # read again below what was fetched before: fetched_to stays there
                        if position < state.skip_below:
                            continue
                        state.skip_below = None
                    state.fetched_to = position
                except IllegalStateError:
                    # revoked by a rebalance while `position` waited (an instance back from
                    # a network partition rejoins): no longer ours, nothing to record
                    continue
        return out

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.pause(*partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._consumer.paused())

    async def commit(self, offsets: Mapping[TopicPartition, int | CommitPoint]) -> None:
        """Commit these positions; a CommitPoint's finished offsets (and those an earlier owner
        finished, still above the position) go into the commit's metadata."""
        if not offsets:
            return
        points: dict[TopicPartition, tuple[int, DoneOffsets]] = {}
        for tp, value in offsets.items():
            offset, done = (value, NO_OFFSETS) if isinstance(value, int) else (value.offset, value.done)
            state = self.owned.get(tp)
            if state is not None and state.done:
                # below the new position they are committed anyway: forget them
                state.done = state.done.from_offset(offset)
                done = done.union(state.done)
            points[tp] = (offset, done)
        while True:
            limit = self._metadata_max_chars
            try:
                sent_s = time.monotonic()
                await self._consumer.commit(
                    {
                        tp: OffsetAndMetadata(off, encode_done(off, done, limit))
                        for tp, (off, done) in points.items()
                    }
                )
                self.owned.lease.confirm(sent_s)  # the group took a commit of this generation
                return
            except CommitFailedError as exc:
                # the group rebalanced without this member (it was expelled): retrying cannot
                # succeed before it rejoins, and the partitions may be another member's now
                raise MembershipLost(
                    f"group {self.group_id} refused the commit: it has rebalanced without this member"
                ) from exc
            except OffsetMetadataTooLargeError:
                if limit == 0:
                    raise
                # the broker's offset.metadata.max.bytes is below ours: halve it until it fits
                self._metadata_max_chars = limit // 2 if limit > 64 else 0
                log.warning(
                    "the broker refused %d chars of offset metadata; using at most %d",
                    limit,
                    self._metadata_max_chars,
                )

    async def partition_offsets(self) -> dict[TopicPartition, PartitionOffsets]:
        owned = self.assignment()
        if not owned:
            return {}
        ends = await self._consumer.end_offsets(list(owned))
        starts = await self._consumer.beginning_offsets(list(owned))
        committed = await self._fetch_committed(owned)
        out: dict[TopicPartition, PartitionOffsets] = {}
        for tp in owned:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            state = self.owned.get(tp)
            position = state.fetched_to if state is not None and state.fetched_to is not None else None
            start = int(starts.get(tp, 0))
            base = offset if offset is not None else start
            fetched = base if position is None else position
            out[tp] = PartitionOffsets(int(ends.get(tp, base)), offset, fetched, start)
        return out

    def has_unfetched(self) -> bool:
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                return True  # nothing fetched yet for it: records may be there
            state = self.owned.get(tp)
            fetched_to = state.fetched_to if state is not None else None
            if high > (fetched_to or 0):
                return True
        return False
