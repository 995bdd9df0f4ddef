"""The at_least_once sink as an old owner (consumer/kafka/sink/at_least_once.py, on the memory
broker): what it hands over at a revoke, what it still writes for a partition it lost, when it
says a hand-over is finished, and what its deadline cuts off."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from consumer.core.handover import HandOver
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import AtLeastOnceSink
from consumer.testing.harness import until
from consumer.testing.memory import MemoryBroker, MemoryProducer

TOPIC = "jobs"
TP = TopicPartition(TOPIC, 0)
#: how long a test waits for what it expects (bounded polling)
UNTIL_S = 4.0


class RecordingBoard:
    """A `HandOverBoard` that keeps what is published, in order."""

    def __init__(self) -> None:
        self.published: list[HandOver] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, handovers: Sequence[HandOver]) -> None:
        self.published.extend(handovers)

    async def read_to_end(self, timeout_s: float) -> bool:
        return True

    def handovers(self) -> list[HandOver]:
        return list(self.published)

    @property
    def version(self) -> int:
        return len(self.published)


async def _sink(now_ms: list[int]) -> tuple[AtLeastOnceSink, RecordingBoard, MemoryBroker, list[Any]]:
    broker = MemoryBroker(partitions=1)
    commits: list[Any] = []

    async def commit(offsets: dict[TopicPartition, Any]) -> None:
        commits.append(offsets)

    board = RecordingBoard()
    sink = AtLeastOnceSink(
        MemoryProducer(broker),  # type: ignore[arg-type]
        commit,
        handovers=board,
        handover_timeout_s=10.0,
        clock_ms=lambda: now_ms[0],
    )
    await sink.start()
    await sink.on_assigned({TP})
    return sink, board, broker, commits


def _outcome(offset: int) -> OutRecord:
    return OutRecord("results", f"job-{offset}".encode(), b"{}")


def _written(broker: MemoryBroker) -> list[bytes | None]:
    return [r.key for part in broker.topic("results") for r in part]


async def test_a_lost_partitions_handed_over_outcomes_are_written_then_finished() -> None:
    now_ms = [1_000]
    sink, board, broker, commits = await _sink(now_ms)
    tickets = [sink.track(SourceOffset(TP, o)) for o in range(3)]
    sink.deliver(tickets[0], _outcome(0))
    assert await until(lambda: sink.inflight() == 2, UNTIL_S)
    await sink.on_revoked({TP}, timeout_s=1.0)
    assert await sink.hand_over({TP}, not_ours={SourceOffset(TP, 2)})
    assert await sink.hand_over({TP}, not_ours=()), "a second revoke before the assignment"
    [handover] = board.published  # offset 1 only: 0 is committed, 2 is parked for another owner
    assert list(handover.offsets) == [1] and handover.deadline_ms == 11_000 and not handover.finished
    assert sink.handed_over({TP}) == {TP}  # its work goes on if it moves
    await sink.on_lost({TP})
    await sink.on_assigned(set())
    sink.deliver(tickets[2], _outcome(2))  # not handed over: the new owner does it
    sink.deliver(tickets[1], _outcome(1))
    assert await until(lambda: len(board.published) == 2, UNTIL_S)
    finished = board.published[1]
    assert finished.name == handover.name and finished.finished and list(finished.completed) == [1]
    assert _written(broker) == [b"job-0", b"job-1"]
    assert sink.dropped_late == 1
    assert all(TP not in c or c[TP] == 1 for c in commits), "committed past what it handed over"
    await sink.stop()


async def test_past_the_deadline_nothing_more_is_written_and_the_hand_over_ends() -> None:
    now_ms = [1_000]
    sink, board, broker, _ = await _sink(now_ms)
    tickets = [sink.track(SourceOffset(TP, o)) for o in range(2)]
    await sink.on_revoked({TP}, timeout_s=1.0)
    assert await sink.hand_over({TP}, not_ours=())
    await sink.on_lost({TP})
    await sink.on_assigned(set())
    sink.deliver(tickets[0], _outcome(0))
    assert await until(lambda: _written(broker) == [b"job-0"], UNTIL_S)
    now_ms[0] = 11_000  # the new owner runs what is left from now on
    assert await until(lambda: len(board.published) == 2, UNTIL_S)
    assert list(board.published[1].completed) == [0] and board.published[1].finished
    sink.deliver(tickets[1], _outcome(1))
    await asyncio.sleep(0.1)
    assert _written(broker) == [b"job-0"]
    assert sink.dropped_late == 1
    await sink.stop()


async def test_a_kept_partitions_hand_over_is_withdrawn() -> None:
    now_ms = [1_000]
    sink, board, broker, _ = await _sink(now_ms)
    ticket = sink.track(SourceOffset(TP, 0))
    await sink.on_revoked({TP}, timeout_s=1.0)
    assert await sink.hand_over({TP}, not_ours=())
    await sink.on_assigned({TP})
    assert await until(lambda: len(board.published) == 2, UNTIL_S)
    withdrawn = board.published[1]
    assert withdrawn.finished and not withdrawn.completed
    sink.deliver(ticket, _outcome(0))  # its own partition still: written and committed here
    assert await until(lambda: _written(broker) == [b"job-0"] and sink.inflight() == 0, UNTIL_S)
    await sink.stop()


async def test_a_member_whose_membership_is_in_doubt_hands_nothing_over() -> None:
    """Cut off from the group (no heartbeat answered for a heartbeat and a half), a member may
    have been expelled and its partitions' new owners be doing its jobs already: it publishes
    no hand-over, and what it has in flight is the new owners' (as without hand-overs)."""
    now_ms = [1_000]
    sink, board, _, _ = await _sink(now_ms)
    sink.track(SourceOffset(TP, 0))
    sink.owned.lease.arm(10.0, now_s=time.monotonic() - 5.0, heartbeat_s=1.0)
    assert not await sink.hand_over({TP}, not_ours=())
    assert board.published == [] and sink.handed_over({TP}) == set()
    await sink.stop()
