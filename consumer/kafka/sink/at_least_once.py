"""at_least_once delivery: one idempotent producer; a commit loop commits the contiguous
watermark of acked outcomes (see `consumer.kafka.sink`).

From a rebalance's revoke to its assignment, outcomes are queued, not sent: the ones of a
partition that moves are dropped then (its new owner does those jobs), so the rebalance
writes no outcome twice.

No outcome is handed to the producer while the membership is in doubt (`Assignment.lease`: no
request answered for a heartbeat and a half; past a session the group may have given the
partitions to another member): they wait in the queue. The lease is asked before each record
batch, and a batch waiting in the producer for the partition's previous one is handed over
only while it holds. If the group did move on, the revoke drops the queue and the assignment
after it keeps no partition (the new owner does their jobs, once); if it did not, the next
answered heartbeat releases them. Without this, an instance cut off from the brokers past its
session writes, once back, the outcomes it made meanwhile for partitions it lost (a zombie
write), and the ones it handed to its producer early in the cut (another copy of each of
those jobs, which the new owner redoes from the committed offset).

A revoke waits (up to SETTLE_TIMEOUT_S) for the revoked partitions' outcomes already on their
way to the broker, then commits them: those records are written whatever the revoke does, so
forgetting them would let the partition's next owner (often this same process, after a
rebalance during a broker failover) read them again from the committed offset and write their
outcomes twice.

Hand-over (`consumer.core.handover`, given a `HandOverBoard`): a revoke publishes, per
partition with offsets in flight, a hand-over of those offsets and a deadline. If the partition
moves, its work goes on here: the outcomes of the handed-over offsets are still written until
the deadline (nothing else of the partition is, and it is never committed here again), and
once they are acknowledged (or given up) the hand-over is published again, finished, naming
the ones completed; its new owner then commits past them. A kept partition's hand-over is
withdrawn (finished, naming none). A stop hands over everything it owns the same way
(`hand_over`, then `leave`) and leaves the group at once."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from consumer.core.handover import HandOver, OutgoingHandOver
from consumer.core.offsets import CommitPoint, DoneOffsets
from consumer.kafka.assignment import Assignment
from consumer.kafka.handover import HandOverBoard
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink.base import COMMIT_TIMEOUT_S, CommitFn, SinkBase, Ticket
from consumer.kafka.sink.record_batch import produce_record_batches
from consumer.waits import wait_at_most

log = logging.getLogger(__name__)

#: how long a revoke waits for outcomes already handed to the producer (or queued for it) to be
#: acknowledged: through a leader failover (the dead broker fenced, the ISR shrunk, batches
#: retried on the new leader) but well inside the group's rebalance timeout (max.poll.interval)
SETTLE_TIMEOUT_S = 30.0


#: how often a sink holding outcomes through a lapsed membership lease looks at it again
LEASE_POLL_S = 0.05

#: a job's outcome on its way to the broker: its ticket and its record
Outgoing = tuple[Ticket, OutRecord]

#: publishing hand-overs (waiting for the broker's ack) may take this long; past it the
#: partitions' next owners are not told, and do the work again
HANDOVER_PUBLISH_TIMEOUT_S = 5.0


def wall_ms() -> int:
    return int(time.time() * 1000)


class AtLeastOnceSink(SinkBase):
    """Idempotent producer; commit the contiguous watermark of acked outcomes."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        commit: CommitFn,
        assignment: Assignment | None = None,
        *,
        handovers: HandOverBoard | None = None,
        handover_timeout_s: float = 0.0,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        """handovers: where in-flight work is handed over at a revoke or a stop (None: it is
        not; a moved partition's new owner does it again), each with a deadline
        `handover_timeout_s` ahead (wall-clock `clock_ms`)."""
        super().__init__(commit, assignment)
        self._producer = producer
        self._handovers = handovers
        self._handover_timeout_ms = round(handover_timeout_s * 1000)
        self._clock_ms = clock_ms
        #: hand-overs published and not finished, by (partition, epoch they were taken in under)
        self._handing: dict[tuple[TopicPartition, int], OutgoingHandOver] = {}
        self._handover_round = 0
        self._publishing: set[asyncio.Task[bool]] = set()
        # One sender task hands outcomes to the producer in order; acks arrive as future
        # callbacks (a task per outcome, each awaiting its send, would cost more CPU than the job).
        self._queue: collections.deque[Outgoing] = collections.deque()
        #: `owned.revocations` when the queue was last sent (`_send_loop`)
        self._revocations_sent = 0
        self._queued = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        #: the outcomes being handed to the producer now, and those of each record batch the
        #: producer holds (by its delivery future): with `_queue`, every outcome delivered and
        #: not acknowledged yet (a revoke waits for its partitions' ones: `_unsettled`)
        self._sending: Sequence[Outgoing] = ()
        self._in_flight: dict[asyncio.Future[Any], Sequence[Outgoing]] = {}
        #: set whenever a record batch is acknowledged or fails
        self._settled = asyncio.Event()

    async def start(self) -> None:
        await self._producer.start()
        await super().start()
        self._sender = asyncio.create_task(self._send_loop(), name="promptbus-sender")

    async def stop(self) -> None:
        await self._stop_loop()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        await self._producer.stop()

    def deliver(self, ticket: Ticket, record: OutRecord | None) -> None:
        self.deliver_all(((ticket, record),))

    def deliver_all(self, outcomes: Sequence[tuple[Ticket, OutRecord | None]]) -> None:
        recordless: list[Ticket] = []
        queue, current = self._queue, self._current
        queued = len(queue)
        for outcome in outcomes:
            ticket = outcome[0]
            if not current(ticket):
                continue
            if outcome[1] is not None:
                queue.append(outcome)  # type: ignore[arg-type]  # its record is not None: an Outgoing
            else:
                recordless.append(ticket)  # nothing to make durable (an offline job's record)
        if recordless:
            self._complete_all(recordless)
        if len(queue) > queued:
            self._queued.set()

    def _complete_all(self, tickets: Iterable[Ticket]) -> None:
        """These outcomes are durable: their offsets may commit (a revoked partition's are
        late, and dropped)."""
        epoch_of, complete = self.owned.epoch, self._tracker.complete
        current = progressed = False
        handing = self._handing
        for ticket in tickets:
            source = ticket.source
            if epoch_of(source.tp) == ticket.epoch:
                current = True
                progressed |= complete(source.tp, source.offset)
            if handing:
                self._settle_handed(ticket, completed=True)
        if progressed:
            self._progress.set()
        if current:
            # an acked outcome is committed (or named in the metadata) at once: until then a
            # crash would produce it again
            self._commit_soon()

    async def _send_loop(self) -> None:
        delay_s = 0.5
        while True:
            await self._queued.wait()
            self._queued.clear()
            while self._queue and not self._held:
                if self.owned.lease.certain_for(time.monotonic()) <= 0:
                    await self._lease_back()
                    continue
                # everything queued goes out now, as one batch per output partition, but what
                # a lost partition left behind (the next owner does those jobs)
                revocations = self.owned.revocations
                if revocations == self._revocations_sent:
                    # queued since the last send (the queue empties at each) and current when
                    # queued: no partition was revoked since, so all of them still are
                    outcomes = list(self._queue)
                else:
                    outcomes = self._current_only(self._queue)
                    self._revocations_sent = revocations
                self._queue.clear()
                if not outcomes:
                    continue
                try:
                    await self._send_batches(outcomes)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the offsets stay uncommitted until the outcomes are acked
                    log.warning("producing %d outcomes failed (%s); retrying", len(outcomes), exc)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, 10.0)
                    continue
                delay_s = 0.5

    async def _send_batches(self, outcomes: list[Outgoing]) -> None:
        handed: list[Sequence[Outgoing]] = []

        def handed_over(delivered: asyncio.Future[Any], batch: Sequence[Outgoing]) -> None:
            handed.append(batch)
            self._in_flight[delivered] = batch
            delivered.add_done_callback(lambda fut: self._batch_done(fut, batch))

        self._sending = outcomes
        try:
            held_back = await produce_record_batches(
                self._producer, outcomes, handed_over, self._certain_for
            )
        except BaseException:
            # the outcomes not handed over go out again
            went = {ticket for batch in handed for ticket, _ in batch}
            self._send_again([outcome for outcome in outcomes if outcome[0] not in went])
            raise
        finally:
            self._sending = ()
        if held_back:
            # the membership came into doubt meanwhile: they wait (first in line) for it
            self._queue.extendleft(reversed(held_back))

    def _certain_for(self) -> float:
        return self.owned.lease.certain_for(time.monotonic())

    def _current_only(self, outcomes: Iterable[Outgoing]) -> list[Outgoing]:
        """The outcomes whose partition is still owned under the epoch they were taken in (or
        handed over, before its deadline)."""
        epoch_of, owed = self.owned.epoch, self._owed
        return [o for o in outcomes if epoch_of(o[0].source.tp) == o[0].epoch or owed(o[0])]

    def _current(self, ticket: Ticket) -> bool:
        if self.owned.epoch(ticket.source.tp) == ticket.epoch or self._owed(ticket):
            return True
        self._dropped_late += 1
        log.debug("dropping late completion for %s (partition revoked)", ticket.source)
        return False

    # ------------------------------------------------------------------ hand-overs
    def _owed(self, ticket: Ticket) -> bool:
        """Whether this ticket's outcome is still owed to a hand-over (before its deadline)."""
        if not self._handing:
            return False
        outgoing = self._handing.get((ticket.source.tp, ticket.epoch))
        return (
            outgoing is not None
            and outgoing.owes(ticket.source.offset)
            and not outgoing.expired(self._clock_ms())
        )

    def _settle_handed(self, ticket: Ticket, *, completed: bool) -> None:
        """A handed-over offset's outcome is durable (`completed`) or will not come: once none
        is owed, the hand-over is finished."""
        key = (ticket.source.tp, ticket.epoch)
        outgoing = self._handing.get(key)
        if outgoing is None:
            return
        offset = ticket.source.offset
        if (outgoing.complete(offset) if completed else outgoing.give_up(offset)) and not outgoing.open:
            self._finish_hand_over(key)

    def _finish_hand_over(self, key: tuple[TopicPartition, int]) -> None:
        outgoing = self._handing.pop(key)
        finished = outgoing.finished()
        log.info(
            "hand-over %s finished: %d of %d offsets completed here",
            finished.name,
            len(finished.completed),
            len(finished.offsets),
        )
        self._publish_later([finished])

    def _publish_later(self, handovers: Sequence[HandOver]) -> None:
        task = asyncio.create_task(self._publish(handovers), name="promptbus-handover")
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, handovers: Sequence[HandOver]) -> bool:
        """Publish, waiting for the ack (bounded); never raises (the new owner's deadline covers
        a hand-over it never hears of the end of)."""
        assert self._handovers is not None
        try:
            await asyncio.wait_for(self._handovers.publish(handovers), HANDOVER_PUBLISH_TIMEOUT_S)
            return True
        except Exception:
            log.warning(
                "could not publish %d hand-overs; their partitions' new owners go by the deadlines",
                len(handovers),
                exc_info=True,
            )
            return False

    async def hand_over(self, partitions: set[TopicPartition], not_ours: Container[SourceOffset]) -> bool:
        if self._handovers is None:
            return False
        if self.refused or self.owned.lease.certain_for(time.monotonic()) <= 0:
            # the group may have moved on without this member: its partitions' new owners may
            # be doing these jobs already, and its outcomes would be second copies
            log.warning("membership in doubt or lost: %d partitions' work not handed over", len(partitions))
            return False
        self._handover_round += 1
        deadline_ms = self._clock_ms() + self._handover_timeout_ms
        made: dict[tuple[TopicPartition, int], OutgoingHandOver] = {}
        for tp in partitions:
            epoch = self.owned.epoch(tp)
            if epoch is None or (tp, epoch) in self._handing:
                continue  # not owned, or handed over already (a stop's hand-over, then a revoke)
            offsets = [o for o in self._tracker.pending_offsets(tp) if SourceOffset(tp, o) not in not_ours]
            if not offsets:
                continue
            name = f"{tp.topic}/{tp.partition}/{epoch}.{self._handover_round}"
            h = HandOver(name, tp.topic, tp.partition, DoneOffsets.of_sorted(offsets), deadline_ms)
            made[(tp, epoch)] = OutgoingHandOver(h)
        if not made:
            return True
        if not await self._publish([o.handover for o in made.values()]):
            return False
        self._handing.update(made)
        log.info(
            "handed over %d offsets in flight of %d partitions (deadline in %.0f s)",
            sum(len(o.handover.offsets) for o in made.values()),
            len(made),
            self._handover_timeout_ms / 1000,
        )
        return True

    def handed_over(self, partitions: set[TopicPartition]) -> set[TopicPartition]:
        # by partition alone: the intake forgets a lost partition's epoch before `on_lost`
        return {tp for tp, _ in self._handing if tp in partitions}

    def abandon(self, ticket: Ticket) -> None:
        if self._handing:
            self._settle_handed(ticket, completed=False)

    async def leave(self, partitions: set[TopicPartition]) -> None:
        self.owned.lease.leave()
        await self.on_lost(partitions)
        self._release()

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        # the kept partitions' hand-overs are withdrawn (finished, naming none)
        kept = [key for key in self._handing if key[0] in partitions and self.owned.epoch(key[0]) == key[1]]
        if kept:
            self._publish_later([self._handing.pop(key).handover.withdrawn() for key in kept])
        await super().on_assigned(partitions)

    def _expire_hand_overs(self) -> None:
        """Past a hand-over's deadline its new owner does what is left: nothing more of it is
        written here (what is queued is dropped at the next send)."""
        now_ms = self._clock_ms()
        expired = [key for key, outgoing in self._handing.items() if outgoing.expired(now_ms)]
        for key in expired:
            self._finish_hand_over(key)
        if expired:
            self._revocations_sent = -1  # the next send keeps only current outcomes

    async def flush(self, timeout_s: float) -> None:
        """As the base's; then wait (bounded) for what was handed over, and say what of it
        was finished."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        await super().flush(timeout_s)
        while self._handing and loop.time() < deadline:
            self._expire_hand_overs()
            self._settled.clear()
            await wait_at_most(self._settled.wait(), min(0.05, max(0.0, deadline - loop.time())))
        for key in list(self._handing):
            self._finish_hand_over(key)
        if self._publishing:
            await asyncio.wait(set(self._publishing), timeout=HANDOVER_PUBLISH_TIMEOUT_S)

    async def _lease_back(self) -> None:
        """Wait (polling) until the membership is certain again or a revoke has emptied the queue."""
        lease = self.owned.lease
        while self._queue and lease.certain_for(time.monotonic()) <= 0:
            # no event says "answered": look again after a moment (or sooner, as outcomes queue)
            self._queued.clear()
            await wait_at_most(self._queued.wait(), LEASE_POLL_S)
        self._queued.set()  # the outer loop looks at the queue again

    def _batch_done(self, fut: asyncio.Future[Any], batch: Sequence[Outgoing]) -> None:
        """A record batch was acknowledged (or failed): its outcomes complete their tickets,
        in one pass (a batch carries hundreds), or go out again."""
        del self._in_flight[fut]
        if not fut.cancelled() and fut.exception() is None:
            self._settled.set()
            self._complete_all(ticket for ticket, _ in batch)
        else:
            # the idempotent producer already retried up to its delivery timeout
            self._send_again(batch)

    def _send_again(self, outcomes: Sequence[Outgoing]) -> None:
        """Queue outcomes that were not acknowledged again, but those of a partition revoked
        meanwhile: their offsets were not committed, so the partition's owner does their jobs
        again, and sending them too would repeat them."""
        again = self._current_only(outcomes)
        if again:
            log.warning("%d outcomes were not acknowledged; sending them again", len(again))
            self._queue.extend(again)
            self._queued.set()
        self._settled.set()

    def _unsettled(self, partitions: set[TopicPartition]) -> int:
        """Outcomes of `partitions` delivered and not acknowledged yet: queued (unless the
        lease has lapsed: those wait for a lease that comes back only after this revoke, and
        are not written), being handed to the producer, or in its record batches."""
        tickets = {ticket for batch in self._in_flight.values() for ticket, _ in batch}
        tickets.update(ticket for ticket, _ in self._sending)
        if self.owned.lease.held(time.monotonic()):
            tickets.update(ticket for ticket, _ in self._queue)
        return sum(1 for ticket in tickets if ticket.source.tp in partitions)

    async def _commit_ready(self, partitions: set[TopicPartition] | None) -> None:
        if self._handing:
            self._expire_hand_overs()
        # A partition is committed again when its watermark stays put but outcomes above it
        # were acked: the commit's metadata then names them, so a crash does not redo them.
        points = self._tracker.commit_points()
        ready: dict[TopicPartition, int | CommitPoint] = {
            tp: point if point.done else point.offset
            for tp, point in points.items()
            if partitions is None or tp in partitions
        }
        if ready:
            await asyncio.wait_for(self._commit(ready), COMMIT_TIMEOUT_S)
            self._commits += 1
            self._tracker.mark_committed({tp: points[tp] for tp in ready})

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        if not self.owned.lease.held(time.monotonic()):
            # the group may have given them away already: what was not handed to the producer
            # is not written (their offsets stay uncommitted; the next owner does the jobs)
            kept = [o for o in self._queue if o[0].source.tp not in partitions]
            if len(kept) < len(self._queue):
                log.warning(
                    "revoke of %s after the membership lapsed: %d outcomes not written",
                    sorted(partitions),
                    len(self._queue) - len(kept),
                )
                self._queue = collections.deque(kept)
        await super().on_revoked(partitions, timeout_s)

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        # held since the revoke, never handed to the producer: the new owner does these jobs,
        # but the handed-over ones (this instance still owes their outcomes)
        owed = self._owed
        kept = [o for o in self._queue if o[0].source.tp not in partitions or owed(o[0])]
        self._queue.clear()
        self._queue.extend(kept)
        await super().on_lost(partitions)

    def _release(self) -> None:
        super()._release()
        self._queued.set()

    def _settle_s(self) -> float:
        return SETTLE_TIMEOUT_S

    async def _settle(self, partitions: set[TopicPartition], deadline: float) -> None:
        """Until `deadline`: wait for the outcomes of `partitions` already delivered (queued,
        being sent or in the producer) to be acknowledged. Their records reach the log
        whatever this revoke does; acknowledged, their offsets commit now."""
        loop = asyncio.get_running_loop()
        while (left := self._unsettled(partitions)) and loop.time() < deadline:
            self._settled.clear()
            await wait_at_most(self._settled.wait(), deadline - loop.time())
        if left:
            log.warning(
                "revoke of %s: %d outcomes still unacknowledged after %.0f s; the next owner "
                "may write them again",
                sorted(partitions),
                left,
                SETTLE_TIMEOUT_S,
            )
