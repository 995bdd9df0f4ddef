"""Delivery-layer faults without a broker: failed commits on revoke, a fenced transactional
producer, unacknowledged or unsendable at-least-once batches.

The sinks (`consumer.kafka.sink`) are driven directly with in-memory fakes of the producer and
the commit function, so each fault happens exactly where the test puts it:

- a partition lost after a revoke whose last commit failed (the group moved on) must still
  be forgotten, or a reassignment that reads it again from the committed offset would be
  rejected;
- an exactly_once producer fenced (a newer owner of its partition, or a transaction the
  broker timed out) drops that partition's outcomes, asks the group for a new assignment,
  and must not hold back the other partitions;
- a revoke that closes a partition's producer while the commit loop waits to use it must
  not hand the closed producer to the commit loop (aiokafka never ends a transaction on a
  stopped producer: the commit loop, and every partition's commits, would hang for good);
- at_least_once outcomes wait while the membership lease has lapsed, and a revoke then drops
  them unwritten;
- at_least_once outcomes go out as one batch per output partition: a batch the broker did
  not acknowledge, or a round that could not even learn the partitions, sends its outcomes
  again, and offsets commit only once every outcome is acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka.errors import CommitFailedError, KafkaConnectionError, ProducerFenced

from consumer.core.errors import MembershipLost
from consumer.kafka.partitioning import partition_for
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import AtLeastOnceSink, ExactlyOnceSink

TOPIC = "jobs"
GROUP = "g"


class FakeBatch:
    """aiokafka BatchBuilder stand-in: takes `room` records, then says it is full (None)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def append(
        self, *, key: bytes | None, value: bytes | None, timestamp: None, headers: Any
    ) -> object | None:
        if self.records and len(self.records) >= self.room:
            return None
        self.records.append((key, value))
        return object()


class FakeTxnProducer:
    """Transactional producer fake: records sent in a transaction appear on commit only."""

    def __init__(self, transactional_id: str | None) -> None:
        self.transactional_id = transactional_id
        self.committed: list[tuple[str, bytes]] = []
        self.offsets: list[dict[TopicPartition, int]] = []
        self.fail_with: Exception | None = None
        self.stopped = False
        self.gate: asyncio.Event | None = None  # when set, a transaction waits for it to open
        self.used_after_stop = False
        self.dead = False
        self._staged: list[tuple[str, bytes]] = []

    def die(self) -> None:
        """End the sender routine, as aiokafka does on an error it does not expect."""
        self.dead = True
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ended.set_result(None)
        self._sender = types.SimpleNamespace(sender_task=ended)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        if self.stopped:  # like aiokafka: waits for a producer id that never comes
            self.used_after_stop = True
            await asyncio.Event().wait()
        if self.gate is not None:
            await self.gate.wait()
        if self.dead:  # like aiokafka once its sender routine ended: FATAL_ERROR for good
            raise AssertionError("Invalid state transition FATAL_ERROR -> IN_TRANSACTION")
        self._staged = []
        yield  # an exception inside aborts: nothing staged becomes visible
        self.committed += self._staged

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def create_batch(self) -> FakeBatch:
        return FakeBatch(room=100)

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[None]:
        self._staged += [(topic, value or b"") for _key, value in batch.records]
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, int], group_id: str) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.offsets.append(offsets)


class FakeFactory:
    """`make_producer(transactional_id=...)` that keeps every producer it made."""

    def __init__(self) -> None:
        self.made: dict[str, FakeTxnProducer] = {}

    def __call__(self, *, transactional_id: str | None) -> Any:
        producer = FakeTxnProducer(transactional_id)
        self.made[transactional_id or ""] = producer
        return producer


class Rejoins:
    """The intake's `rejoin`: counts the new assignments the sink asked the group for."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def eos_sink(factory: FakeFactory, rejoin: Rejoins | None = None) -> ExactlyOnceSink:
    return ExactlyOnceSink(factory, GROUP, commit=None, rejoin=rejoin or Rejoins())  # type: ignore[arg-type]


def outcome(offset: int) -> OutRecord:
    return OutRecord("results", f"job-{offset}".encode(), f"result-{offset}".encode())


async def test_a_revoke_whose_commit_the_group_refuses_ends_without_retrying() -> None:
    """A member the group expelled has its revoke's commit refused (`MembershipLost`, from
    aiokafka's CommitFailedError): no retry can succeed, so the revoke ends after the one
    try instead of retrying until its deadline (which held the member's rejoin back)."""
    attempts: list[dict[TopicPartition, Any]] = []

    async def commit(offsets: dict[TopicPartition, Any]) -> None:
        attempts.append(offsets)
        raise MembershipLost("group g refused the commit: it has rebalanced without this member")

    sink = AtLeastOnceSink(producer=FakeTxnProducer(None), commit=commit)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    sink.deliver(sink.track(SourceOffset(tp, 0)), None)  # an empty outcome completes at once
    await asyncio.wait_for(sink.on_revoked({tp}, timeout_s=5), timeout=10)
    assert attempts == [{tp: 1}], "the refused commit was tried again"


async def test_a_lost_partition_is_forgotten_even_when_the_revokes_last_commit_fails() -> None:
    commits: list[dict[TopicPartition, int]] = []

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        if not commits:
            commits.append({})  # the first commit fails, as after a session timeout
            raise CommitFailedError("the group rebalanced")
        commits.append(offsets)

    sink = AtLeastOnceSink(producer=FakeTxnProducer(None), commit=commit)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    tickets = [sink.track(SourceOffset(TopicPartition(TOPIC, 0), o)) for o in range(3)]
    for ticket in tickets[:2]:
        sink.deliver(ticket, None)  # an empty outcome completes at once (no producer involved)

    await sink.on_revoked({tp}, timeout_s=0.1)  # must not raise: the group has moved on
    await sink.on_lost({tp})  # the new assignment gave it to another member
    assert sink.inflight() == 0

    sink.deliver(tickets[2], None)  # a late completion from before the revoke
    assert sink.dropped_late == 1

    # assigned again: read again from the committed offset (0), below what was tracked before
    await sink.on_assigned({tp})
    again = [sink.track(SourceOffset(TopicPartition(TOPIC, 0), o)) for o in range(3)]
    for ticket in again:
        sink.deliver(ticket, None)
    await sink.flush(timeout_s=1)
    assert commits[-1] == {tp: 3}


async def test_exactly_once_loss_closes_producers_even_when_the_revokes_commit_fails() -> None:
    factory = FakeFactory()
    sink = eos_sink(factory)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    producer = factory.made[sink.transactional_id(tp)]
    producer.fail_with = KafkaConnectionError("coordinator gone")
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))

    await sink.on_revoked({tp}, timeout_s=0.1)
    await sink.on_lost({tp})
    assert producer.stopped
    assert producer.committed == [], "an aborted transaction published outcomes"
    assert sink.inflight() == 0

    await sink.on_assigned({tp})  # a new producer for the same transactional id
    assert factory.made[sink.transactional_id(tp)] is not producer
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))
    await sink.flush(timeout_s=1)
    assert factory.made[sink.transactional_id(tp)].committed == [("results", b"result-0")]


async def test_a_fenced_partition_is_dropped_and_the_others_keep_committing() -> None:
    factory = FakeFactory()
    rejoins = Rejoins()
    sink = eos_sink(factory, rejoins)
    tps = [TopicPartition(TOPIC, p) for p in range(3)]
    await sink.on_assigned(set(tps))
    fenced = factory.made[sink.transactional_id(tps[0])]
    fenced.fail_with = ProducerFenced()
    late = []
    for tp in tps:
        for offset in range(2):
            ticket = sink.track(SourceOffset(TopicPartition(TOPIC, tp.partition), offset))
            if tp == tps[0] and offset == 1:
                late.append(ticket)
                continue
            sink.deliver(ticket, outcome(offset))

    await sink.flush(timeout_s=0.2)  # raises nothing: a fence is not retried

    assert fenced.committed == [] and fenced.stopped
    # a fence may also be a transaction timeout while this instance still owns the partition:
    # only a new assignment gives it a producer again
    assert rejoins.count == 1, "a fenced partition did not ask the group for a new assignment"
    for tp in tps[1:]:
        producer = factory.made[sink.transactional_id(tp)]
        assert producer.offsets == [{tp: 2}], f"{tp} was held back by the fenced partition"
        assert len(producer.committed) == 2
    assert sink.inflight(tps[0]) == 0, "the fenced partition's work is still counted in flight"
    sink.deliver(late[0], outcome(1))
    assert sink.dropped_late == 1


async def test_an_ordinary_failure_on_one_partition_does_not_block_the_others() -> None:
    factory = FakeFactory()
    sink = eos_sink(factory)
    tps = [TopicPartition(TOPIC, p) for p in range(2)]
    await sink.on_assigned(set(tps))
    failing = factory.made[sink.transactional_id(tps[0])]
    failing.fail_with = KafkaConnectionError("broker briefly gone")
    for tp in tps:
        sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, tp.partition), 0)), outcome(0))

    with pytest.raises(KafkaConnectionError):
        await sink.flush(timeout_s=0.2)
    assert factory.made[sink.transactional_id(tps[1])].offsets == [{tps[1]: 1}]

    failing.fail_with = None  # the broker is back: the kept outcome commits on the next round
    await sink.flush(timeout_s=1)
    assert failing.committed == [("results", b"result-0")]
    assert failing.offsets == [{tps[0]: 1}]


async def test_a_commit_waiting_for_a_dropped_partition_never_uses_its_closed_producer() -> None:
    factory = FakeFactory()
    sink = eos_sink(factory)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    old = factory.made[sink.transactional_id(tp)]
    old.gate = asyncio.Event()
    old.fail_with = ProducerFenced()
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))

    # one commit round holds the partition's lock (its transaction waits at the gate, then
    # is fenced); a second round (the revoke's, or the commit loop's) waits for the lock
    first = asyncio.create_task(sink.flush(timeout_s=0))
    await asyncio.sleep(0.01)
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 1)), outcome(1))
    second = asyncio.create_task(sink.on_revoked({tp}, timeout_s=0))
    await asyncio.sleep(0.01)
    old.gate.set()
    done, _ = await asyncio.wait({first, second}, timeout=2)
    assert done == {first, second}, "a commit hangs on the closed producer"
    assert old.stopped and not old.used_after_stop, "a transaction ran on the closed producer"

    await sink.on_assigned({tp})  # back again: the new producer commits normally
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))
    await asyncio.wait_for(sink.flush(timeout_s=1), timeout=5)
    assert factory.made[sink.transactional_id(tp)].offsets == [{tp: 1}]


class FakeBatchProducer:
    """At-least-once producer fake: batches per partition; scripted failures."""

    def __init__(self, *, room: int = 2, partitions: int = 2) -> None:
        self.room = room
        self.partitions = partitions
        self.fail_partitions_for = 0  # partitions_for raises this many times
        self.fail_deliveries = 0  # this many delivery futures end with an error
        self.sent: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = []
        self.acked: list[bytes | None] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def partitions_for(self, topic: str) -> set[int]:
        if self.fail_partitions_for:
            self.fail_partitions_for -= 1
            raise KafkaConnectionError("no metadata")
        return set(range(self.partitions))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.room)

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[None]:
        self.sent.append((topic, partition, list(batch.records)))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_deliveries:
            self.fail_deliveries -= 1
            delivered.set_exception(KafkaConnectionError("not acknowledged"))
        else:
            self.acked += [value for _key, value in batch.records]
            delivered.set_result(None)
        return delivered


async def _deliver_all(
    producer: FakeBatchProducer, offsets: range
) -> tuple[AtLeastOnceSink, list[dict[TopicPartition, int]]]:
    commits: list[dict[TopicPartition, int]] = []

    async def commit(offsets: dict[TopicPartition, int]) -> None:
        commits.append(offsets)

    sink = AtLeastOnceSink(producer=producer, commit=commit)
    await sink.start()
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    for o in offsets:
        sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), o)), outcome(o))
    await asyncio.wait_for(sink.flush(timeout_s=5), timeout=10)
    await sink.stop()
    return sink, commits


async def test_at_least_once_sends_batches_per_partition_and_commits_when_all_are_acked() -> None:
    producer = FakeBatchProducer(room=2, partitions=2)
    sink, commits = await _deliver_all(producer, range(7))
    assert sink.inflight() == 0
    assert commits[-1] == {TopicPartition(TOPIC, 0): 7}
    assert sorted(producer.acked) == sorted(f"result-{o}".encode() for o in range(7))  # type: ignore[type-var]
    # full batches were split (room 2) and every record went to its key's partition
    assert all(len(records) <= 2 for _t, _p, records in producer.sent)
    for _topic, partition, records in producer.sent:
        for key, _value in records:
            assert partition == partition_for(key, [0, 1])


async def test_an_unacknowledged_batch_sends_its_outcomes_again() -> None:
    producer = FakeBatchProducer(room=2, partitions=2)
    producer.fail_deliveries = 2
    sink, commits = await _deliver_all(producer, range(5))
    assert sink.inflight() == 0 and commits[-1] == {TopicPartition(TOPIC, 0): 5}
    # every outcome acked at least once; the failed batches' ones were sent again
    assert set(producer.acked) == {f"result-{o}".encode() for o in range(5)}
    assert sum(len(records) for _t, _p, records in producer.sent) > 5


async def test_outcomes_wait_out_a_metadata_failure_and_go_out_after_it() -> None:
    producer = FakeBatchProducer(room=10, partitions=3)
    producer.fail_partitions_for = 1
    sink, commits = await _deliver_all(producer, range(4))
    assert sink.inflight() == 0 and commits[-1] == {TopicPartition(TOPIC, 0): 4}
    assert sorted(producer.acked) == sorted(f"result-{o}".encode() for o in range(4))  # type: ignore[type-var]


async def test_a_dead_transactional_producer_is_replaced_and_its_outcomes_commit() -> None:
    factory = FakeFactory()
    sink = eos_sink(factory)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    dead = factory.made[sink.transactional_id(tp)]
    dead.die()
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))

    with pytest.raises(AssertionError):  # this round fails on the dead producer ...
        await sink.flush(timeout_s=0)
    fresh = factory.made[sink.transactional_id(tp)]
    assert fresh is not dead and dead.stopped, "the dead producer was not replaced"
    await sink.flush(timeout_s=1)  # ... the next commits the kept outcome with the new one
    assert fresh.committed == [("results", b"result-0")]
    assert fresh.offsets == [{tp: 1}]
    assert dead.committed == []


async def test_a_dead_producer_is_not_replaced_while_the_membership_is_in_doubt() -> None:
    """Replacing a producer takes its transactional id over, fencing whoever holds it: a member
    the group may have expelled (no answer for a while) must not fence the partition's new
    owner and commit over it. Once the group answers again, the producer is replaced."""
    factory = FakeFactory()
    sink = eos_sink(factory)
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    lease = sink.owned.lease
    lease.arm(4.0, time.monotonic() - 10.0, heartbeat_s=1.0)  # nothing answered for 10 s
    dead = factory.made[sink.transactional_id(tp)]
    dead.die()
    sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, 0), 0)), outcome(0))

    with pytest.raises(AssertionError):  # the round fails on the dead producer ...
        await sink.flush(timeout_s=0)
    assert factory.made[sink.transactional_id(tp)] is dead and not dead.stopped, (
        "the transactional id was taken over while the member may have been expelled"
    )
    lease.confirm(time.monotonic())  # a heartbeat answered: still the owner
    with pytest.raises(AssertionError):  # ... this one replaces it ...
        await sink.flush(timeout_s=0)
    fresh = factory.made[sink.transactional_id(tp)]
    assert fresh is not dead and dead.stopped
    await sink.flush(timeout_s=1)  # ... and the next commits the kept outcome
    assert fresh.committed == [("results", b"result-0")]


async def test_partitions_fenced_in_one_round_ask_for_one_new_assignment() -> None:
    factory = FakeFactory()
    rejoins = Rejoins()
    sink = eos_sink(factory, rejoins)
    tps = [TopicPartition(TOPIC, p) for p in range(3)]
    await sink.on_assigned(set(tps))
    for tp in tps[:2]:
        factory.made[sink.transactional_id(tp)].fail_with = ProducerFenced()
    for tp in tps:
        sink.deliver(sink.track(SourceOffset(TopicPartition(TOPIC, tp.partition), 0)), outcome(0))

    await sink.flush(timeout_s=0.2)

    assert rejoins.count == 1, "each fenced partition asked for its own rebalance"
    assert factory.made[sink.transactional_id(tps[2])].offsets == [{tps[2]: 1}]


class BlockedPartitionProducer(FakeBatchProducer):
    """A partition's next batch waits in `send_batch` until `unblock` (its previous batch not
    sent yet: the brokers unreachable), as aiokafka's accumulator makes it wait."""

    def __init__(self, blocked: int) -> None:
        super().__init__(room=100, partitions=2)
        self.blocked = blocked
        self.waiting = asyncio.Event()
        self.unblocked = asyncio.Event()

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[None]:
        if partition == self.blocked and not self.unblocked.is_set():
            self.waiting.set()
            await self.unblocked.wait()
        return await super().send_batch(batch, topic, partition=partition)


async def test_a_batch_is_not_handed_over_once_the_membership_comes_into_doubt() -> None:
    """The lease is asked before each record batch, and a batch waiting for its partition's
    previous one is given up when the membership comes into doubt: nothing reaches the
    producer after that. The outcomes wait, and go once the group answers again."""
    keys = {partition_for(f"job-{o}".encode(), [0, 1]) for o in range(6)}
    assert keys == {0, 1}, "the outcomes span both output partitions"
    producer = BlockedPartitionProducer(blocked=partition_for(b"job-0", [0, 1]))
    commits: list[dict[TopicPartition, Any]] = []

    async def commit(offsets: dict[TopicPartition, Any]) -> None:
        commits.append(offsets)

    sink = AtLeastOnceSink(producer=producer, commit=commit)
    await sink.start()
    tp = TopicPartition(TOPIC, 0)
    await sink.on_assigned({tp})
    lease = sink.owned.lease
    lease.arm(4.0, time.monotonic(), heartbeat_s=0.2)  # in doubt 0.3 s from now
    for o in range(6):
        sink.deliver(sink.track(SourceOffset(tp, o)), outcome(o))
    await asyncio.wait_for(producer.waiting.wait(), 5)
    await asyncio.sleep(0.5)  # the doubt came while the batch waited
    producer.unblocked.set()
    await asyncio.sleep(0.2)
    assert producer.sent == [], "a batch was handed to the producer after the membership came into doubt"
    lease.confirm(time.monotonic())
    await asyncio.wait_for(sink.flush(timeout_s=5), timeout=10)
    assert sorted(producer.acked) == sorted(f"result-{o}".encode() for o in range(6))  # type: ignore[type-var]
    assert commits[-1] == {tp: 6}
    await sink.stop()


class HeldAcksProducer(FakeBatchProducer):
    """Writes every batch at once but holds its acknowledgement until `release` (acks=all
    waiting for a dead replica to leave the ISR, or a batch retried on a new leader)."""

    def __init__(self) -> None:
        super().__init__(room=100, partitions=4)
        self.held: list[asyncio.Future[None]] = []

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[None]:
        self.sent.append((topic, partition, list(batch.records)))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(delivered)
        return delivered

    def release(self, error: Exception | None = None) -> None:
        for delivered in self.held:
            if not delivered.done():
                if error is None:
                    delivered.set_result(None)
                else:
                    delivered.set_exception(error)


HeldSink = tuple[AtLeastOnceSink, HeldAcksProducer, list[dict[Any, Any]]]


async def held_acks_sink(tp: TopicPartition) -> HeldSink:
    """A started sink owning `tp` on a `HeldAcksProducer`, and the list its commits go to."""
    commits: list[dict[Any, Any]] = []

    async def commit(offsets: dict[TopicPartition, Any]) -> None:
        commits.append(offsets)

    producer = HeldAcksProducer()
    sink = AtLeastOnceSink(producer=producer, commit=commit)
    await sink.start()
    await sink.on_assigned({tp})
    return sink, producer, commits


async def test_a_revoke_waits_for_outcomes_already_written_and_commits_them() -> None:
    """A rebalance during a broker failover: outcomes handed to the producer are in the log
    whatever the revoke does; forgotten unacknowledged, the partition's next owner (here the
    same process) would read them again from the committed offset and write them twice."""
    tp = TopicPartition(TOPIC, 2)
    sink, producer, commits = await held_acks_sink(tp)
    for o in range(3):
        sink.deliver(sink.track(SourceOffset(tp, o)), outcome(o))
    await asyncio.sleep(0.05)
    assert producer.held  # written, not acknowledged
    asyncio.get_running_loop().call_later(0.3, producer.release)  # the failover ends
    await asyncio.wait_for(sink.on_revoked({tp}, timeout_s=0.05), timeout=5)
    assert commits and commits[-1] == {tp: 3}  # read again from 3: nothing written twice
    await sink.stop()


async def test_an_outcome_of_a_revoked_partition_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import consumer.kafka.sink.at_least_once as at_least_once

    monkeypatch.setattr(at_least_once, "SETTLE_TIMEOUT_S", 0.1)
    tp = TopicPartition(TOPIC, 0)
    sink, producer, commits = await held_acks_sink(tp)
    sink.deliver(sink.track(SourceOffset(tp, 0)), outcome(0))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(sink.on_revoked({tp}, timeout_s=0.05), timeout=5)
    await sink.on_lost({tp})
    producer.release(KafkaConnectionError("gave up"))  # the producer gives up after the revoke
    await asyncio.sleep(0.1)
    # not acknowledged and revoked: uncommitted, so the partition's owner does it again; a
    # second send from here would be one more copy
    assert len(producer.sent) == 1
    assert all(c.get(tp, 0) == 0 for c in commits)
    await sink.stop()


def _last_committed(commits: list[dict[Any, Any]]) -> dict[TopicPartition, int]:
    last: dict[TopicPartition, int] = {}
    for commit in commits:
        last.update({tp: int(getattr(point, "offset", point)) for tp, point in commit.items()})
    return last


async def test_a_rebalance_holds_outcomes_then_writes_the_kept_partitions_only() -> None:
    """Eager protocol: every partition is revoked, which of them move is known only on the
    assignment. What is acked commits at the revoke; outcomes completed after it wait; then
    a kept partition's go out and commit, a lost partition's are never written (its new owner
    does those jobs) and nothing of it is committed any more."""
    kept, lost = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    sink, producer, commits = await held_acks_sink(kept)
    await sink.on_assigned({lost})
    tickets = {tp: [sink.track(SourceOffset(tp, o)) for o in range(2)] for tp in (kept, lost)}

    def record(tp: TopicPartition, o: int) -> OutRecord:
        return OutRecord("results", f"{tp.partition}".encode(), f"{tp.partition}-{o}".encode())

    for tp in (kept, lost):
        sink.deliver(tickets[tp][0], record(tp, 0))
    for _ in range(500):  # bounded: until both are handed to the producer
        if sum(len(records) for _topic, _partition, records in producer.sent) == 2:
            break
        await asyncio.sleep(0.01)
    producer.release()
    await asyncio.wait_for(sink.on_revoked({kept, lost}, timeout_s=0.1), timeout=30)
    assert _last_committed(commits) == {kept: 1, lost: 1}  # the durable ones, before the join

    written = len(producer.sent)
    for tp in (kept, lost):
        sink.deliver(tickets[tp][1], record(tp, 1))  # their requests ended during the rebalance
    await asyncio.sleep(0.05)
    assert len(producer.sent) == written, "an outcome went out before the assignment was known"

    await sink.on_lost({lost})
    await sink.on_assigned({kept})
    for _ in range(500):
        await asyncio.sleep(0.01)
        producer.release()
        if _last_committed(commits).get(kept) == 2:
            break
    values = [value for _topic, _partition, records in producer.sent[written:] for _key, value in records]
    assert values == [b"0-1"]
    assert _last_committed(commits) == {kept: 2, lost: 1}
    assert sink.dropped_late == 0  # dropped with the loss, not as a late completion
    await sink.stop()


async def test_outcomes_wait_while_the_membership_lease_has_lapsed() -> None:
    """An instance whose heartbeats went unanswered for a session (cut off from the brokers)
    may have lost its partitions: its outcomes stay queued. A revoke then drops them unwritten
    (the new owner does the jobs: no zombie copy); an answered heartbeat instead lets them go."""
    tp = TopicPartition(TOPIC, 0)
    producer = FakeBatchProducer(room=10, partitions=1)
    commits: list[dict[TopicPartition, Any]] = []

    async def commit(offsets: dict[TopicPartition, Any]) -> None:
        commits.append(offsets)

    sink = AtLeastOnceSink(producer=producer, commit=commit)
    await sink.start()
    await sink.on_assigned({tp})
    lease = sink.owned.lease
    now = time.monotonic()
    lease.arm(1.0, now - 5.0)  # last answered heartbeat sent 5 s ago, session 1 s: lapsed
    for o in range(3):
        sink.deliver(sink.track(SourceOffset(tp, o)), outcome(o))
    await asyncio.sleep(0.2)
    assert producer.sent == [], "nothing is written while the group may have moved on"
    await asyncio.wait_for(sink.on_revoked({tp}, timeout_s=0.05), timeout=5)
    assert producer.sent == [] and all(c.get(tp, 0) == 0 for c in commits)

    # the intake's assignment after a lapsed membership keeps no partition
    await sink.on_lost({tp})
    await sink.on_assigned({tp})
    for o in range(3, 5):
        sink.deliver(sink.track(SourceOffset(tp, o)), outcome(o))
    await asyncio.sleep(0.2)
    assert producer.sent == []
    lease.confirm(time.monotonic())  # a heartbeat answered: still a member
    await asyncio.wait_for(sink.flush(timeout_s=5), timeout=10)
    assert sorted(producer.acked) == [b"result-3", b"result-4"]
    await sink.stop()
