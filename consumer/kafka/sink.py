"""Delivery: makes each job's outcome durable, then commits its input offset.

    at_least_once  `AtLeastOnceSink`: one idempotent producer (acks=all). An offset becomes
                   committable when the outcomes of it and of every offset below it are acked
                   (the contiguous watermark of `OffsetTracker`); a commit loop commits it,
                   with the offsets whose outcomes are acked above it (a `CommitPoint`: the
                   intake writes them into the commit's offset metadata, so a new owner of the
                   partition skips them instead of doing them again).
    exactly_once   `ExactlyOnceSink`: one transactional producer per input partition
                   (transactional.id = group.topic.partition, so a restarted or rebalanced owner
                   fences the zombie). Outcomes wait in memory until their offsets are contiguous;
                   then outcomes and the input offset commit in ONE transaction, so a
                   read_committed reader never sees an outcome whose input will be read again.
                   Its commits carry no finished offsets: nothing above the watermark has a
                   committed outcome yet (those outcomes wait in memory).

A `Ticket` is issued per input record on intake; it carries the partition's assignment
epoch, so completions that arrive after the partition was revoked are dropped.

A revoke always forgets the partition, even when its last commit fails (the group moved on:
the new owner reads from the last committed offset). A transactional producer fenced by a
newer owner of its partition (this instance is a zombie) drops that partition's uncommitted
outcomes and leaves the other partitions committing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced

from consumer.core.offsets import CommitPoint, OffsetTracker
from consumer.kafka.assignment import Assignment
from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
from consumer.kafka.partitioning import partition_for
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.settings import Settings

log = logging.getLogger(__name__)

#: commits input positions: an offset, or a CommitPoint when offsets above it are finished too
#: (a plain offset when nothing is, so a commit function that knows only offsets still works
#: wherever nothing finishes out of order)
CommitFn = Callable[[dict[TopicPartition, int | CommitPoint]], Awaitable[None]]

#: how often ready offsets are committed (at_least_once) or transactions closed (exactly_once)
COMMIT_INTERVAL_S = 0.2
#: one commit may not take longer than this; it is retried on the next round
COMMIT_TIMEOUT_S = 10.0
#: producer batch size per partition (aiokafka default 16 KiB)
PRODUCER_BATCH_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Ticket:
    """Proof that an input record was taken in under a given assignment of its partition."""

    source: SourceOffset
    epoch: int


class OutcomeSink(Protocol):
    """Where finished jobs go. Owns producing outcomes and committing input offsets."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def track(self, source: SourceOffset) -> Ticket: ...

    def deliver(self, ticket: Ticket, records: Sequence[OutRecord]) -> None:
        """The job's outcome is decided: make `records` durable, then its offset committable."""
        ...

    async def on_assigned(self, partitions: set[TopicPartition]) -> None: ...

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        """Commit what is done for these partitions (waiting up to timeout_s), then forget them."""
        ...

    async def flush(self, timeout_s: float) -> None:
        """Make everything ready durable and commit it (shutdown)."""
        ...

    def inflight(self, partition: TopicPartition | None = None) -> int:
        """Input records taken in whose offsets are not committable yet."""
        ...

    async def wait_for_room(self, max_inflight: int, timeout_s: float) -> None:
        """Return once fewer than `max_inflight` records are in flight, or after `timeout_s`."""
        ...

    @property
    def dropped_late(self) -> int:
        """Completions dropped because their partition had been revoked meanwhile."""
        ...


class ProducerFactory(Protocol):
    def __call__(self, *, transactional_id: str | None) -> AIOKafkaProducer: ...


def kafka_producer_factory(settings: Settings, client_id: str) -> ProducerFactory:
    """Producers with acks=all and idempotence; transactional when given a transactional_id."""

    def make(*, transactional_id: str | None) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            transactional_id=transactional_id,
            transaction_timeout_ms=round(settings.transaction_timeout_s * 1000),
            linger_ms=5,
            # results are small and many, and a partition's next batch waits until the one
            # before it is sent: at aiokafka's 16 KiB the bench ran at 21.5k items/s, at
            # 256 KiB at 34k (bench/pipeline_bench.py, 50,000 batched jobs in memory)
            max_batch_size=PRODUCER_BATCH_BYTES,
            max_request_size=MAX_MESSAGE_BYTES,
            **client_kwargs(settings),
        )

    return make


class _SinkBase:
    """Ticket, epoch and watermark bookkeeping shared by both guarantees."""

    def __init__(self, commit: CommitFn, assignment: Assignment | None = None) -> None:
        self._commit = commit
        self._tracker: OffsetTracker = OffsetTracker()
        #: the owned partitions and their epochs, shared with the intake
        self.owned = assignment if assignment is not None else Assignment()
        self._commit_task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        #: set whenever an in-flight record completes (intake waits on it under backpressure)
        self._progress = asyncio.Event()
        self._dropped_late = 0

    # -- intake side
    def track(self, source: SourceOffset) -> Ticket:
        tp = source.tp
        # records only come from assigned partitions; `assign` is a no-op for those
        epoch = self.owned.assign(tp).epoch
        self._tracker.track(tp, source.offset)
        return Ticket(source, epoch)

    def inflight(self, partition: TopicPartition | None = None) -> int:
        return self._tracker.pending_count(partition)

    async def wait_for_room(self, max_inflight: int, timeout_s: float) -> None:
        # Intake must not sleep through a whole poll interval while acks free room: at a
        # full max_inflight that wait, not the work, set the pace.
        self._progress.clear()
        if self.inflight() < max_inflight:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._progress.wait(), timeout_s)

    def _completed(self, tp: TopicPartition, offset: int) -> None:
        if self._tracker.complete(tp, offset):
            self._progress.set()

    @property
    def dropped_late(self) -> int:
        return self._dropped_late

    def _current(self, ticket: Ticket) -> bool:
        if self.owned.epoch(ticket.source.tp) != ticket.epoch:
            self._dropped_late += 1
            log.debug("dropping late completion for %s (partition revoked)", ticket.source)
            return False
        return True

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self.owned.assign(tp)

    async def start(self) -> None:
        self._commit_task = asyncio.create_task(self._commit_loop(), name="promptbus-commit")

    async def _stop_loop(self) -> None:
        if self._commit_task:
            self._commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
            self._commit_task = None

    async def _commit_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), COMMIT_INTERVAL_S)
            self._wakeup.clear()
            try:
                await self._commit_ready(None)
            except Exception:  # a failed commit is retried next round; the offsets stay uncommitted
                log.exception("commit failed; will retry")

    async def _commit_ready(self, partitions: set[TopicPartition] | None) -> None:
        raise NotImplementedError

    async def _wait_done(self, partitions: set[TopicPartition] | None, timeout_s: float) -> None:
        """Wait (bounded) until nothing is pending for these partitions."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            pending = (
                self._tracker.pending_count(None)
                if partitions is None
                else sum(self._tracker.pending_count(tp) for tp in partitions)
            )
            if pending == 0:
                return
            await self._commit_ready(partitions)
            await asyncio.sleep(0.05)

    async def flush(self, timeout_s: float) -> None:
        """Wait (bounded) for every outcome taken in, then commit what is ready (shutdown)."""
        await self._wait_done(None, timeout_s)
        await self._commit_ready(None)

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._tracker.forget(tp)
        self.owned.revoke(partitions)

    async def _finish_revoke(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        """Wait (bounded) for the partitions' work and commit it; a failure only loses progress.

        Never raises: the caller forgets the partitions whatever happens here, else a stale
        watermark would outlive the revoke and reject the offsets read after a reassignment.
        """
        try:
            await self._wait_done(partitions, timeout_s)
            await self._commit_ready(partitions)
        except Exception:
            log.warning(
                "revoke of %s: final commit failed; the next owner starts at the last committed offsets",
                sorted(partitions),
                exc_info=True,
            )


def _append(batch: Any, record: OutRecord) -> Any:
    """Add `record` to an aiokafka BatchBuilder; None when the batch is full."""
    return batch.append(key=record.key, value=record.value, timestamp=None, headers=list(record.headers))


def _producer_dead(producer: AIOKafkaProducer | None) -> bool:
    """True when the producer's sender routine has ended: it never sends again.

    aiokafka ends it on an error it does not expect (e.g. the group coordinator's connection
    closing during a transactional offset commit) and leaves the producer in FATAL_ERROR;
    no public API says so, hence the private attribute.
    """
    sender = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    return task is not None and task.done()


M = TypeVar("M")


async def produce_batches(
    producer: AIOKafkaProducer,
    items: Sequence[tuple[M, OutRecord]],
    on_batch: Callable[[asyncio.Future[Any], list[M]], None],
) -> None:
    """Hand `items` to `producer` as record batches, one per (topic, partition), in order.

    A batch carries one delivery future instead of one per record: producing record by record
    cost ~11 us of CPU each, by batch ~4 us (bench/README.md). Records keep the default
    partitioning (murmur2 of the key, `consumer.kafka.partitioning`; keyless ones spread).
    `on_batch(delivered, members)` is called for each batch handed over, with the tags of its
    records (one per record); whatever was not passed to it was not handed over when this
    raises. Serves both sinks (in exactly_once, inside the partition's transaction).
    """
    by_partition: dict[tuple[str, int], list[tuple[M, OutRecord]]] = {}
    partitions: dict[str, list[int]] = {}
    for member, record in items:
        known = partitions.get(record.topic)
        if known is None:
            known = partitions[record.topic] = sorted(await producer.partitions_for(record.topic))
        by_partition.setdefault((record.topic, partition_for(record.key, known)), []).append((member, record))
    for (topic, partition), group in by_partition.items():
        batch = producer.create_batch()
        members: list[M] = []
        for member, record in group:
            if _append(batch, record) is None:
                on_batch(await producer.send_batch(batch, topic, partition=partition), members)
                batch, members = producer.create_batch(), []
                _append(batch, record)  # a fresh batch always takes its first record
            members.append(member)
        on_batch(await producer.send_batch(batch, topic, partition=partition), members)


class _Outgoing:
    """One job's outcome records on their way to the broker."""

    __slots__ = ("failed", "handed", "records", "remaining", "ticket")

    def __init__(self, ticket: Ticket, records: Sequence[OutRecord]) -> None:
        self.ticket = ticket
        self.records = records
        self.remaining = len(records)  # records not acknowledged yet
        self.handed = 0  # records handed to the producer
        self.failed = False


class AtLeastOnceSink(_SinkBase):
    """Idempotent producer; commit the contiguous watermark of acked outcomes."""

    def __init__(
        self, producer: AIOKafkaProducer, commit: CommitFn, assignment: Assignment | None = None
    ) -> None:
        super().__init__(commit, assignment)
        self._producer = producer
        # One sender task hands outcomes to the producer in order; acks arrive as future
        # callbacks. (A task per outcome, each awaiting its send, cost most of the CPU per job.)
        self._queue: collections.deque[tuple[Ticket, Sequence[OutRecord]]] = collections.deque()
        self._queued = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

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

    def deliver(self, ticket: Ticket, records: Sequence[OutRecord]) -> None:
        if not self._current(ticket):
            return
        if not records:
            self._complete(ticket)
            return
        self._queue.append((ticket, records))
        self._queued.set()

    def _complete(self, ticket: Ticket) -> None:
        if self.owned.epoch(ticket.source.tp) == ticket.epoch:
            self._completed(ticket.source.tp, ticket.source.offset)

    async def _send_loop(self) -> None:
        delay_s = 0.5
        while True:
            await self._queued.wait()
            self._queued.clear()
            while self._queue:
                # everything queued goes out now, as one batch per output partition
                outcomes = [_Outgoing(ticket, records) for ticket, records in self._queue]
                self._queue.clear()
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

    async def _send_batches(self, outcomes: list[_Outgoing]) -> None:
        try:
            await produce_batches(
                self._producer, [(o, r) for o in outcomes for r in o.records], self._handed_over
            )
        except BaseException:
            # records not handed over count as failed: their outcomes go out again whole
            for outgoing in outcomes:
                for _ in range(len(outgoing.records) - outgoing.handed):
                    self._record_done(outgoing, ok=False)
            raise

    def _handed_over(self, delivered: asyncio.Future[Any], members: list[_Outgoing]) -> None:
        for outgoing in members:
            outgoing.handed += 1
        delivered.add_done_callback(lambda fut: self._batch_done(fut, members))

    def _batch_done(self, fut: asyncio.Future[Any], members: list[_Outgoing]) -> None:
        ok = not fut.cancelled() and fut.exception() is None
        for outgoing in members:
            self._record_done(outgoing, ok=ok)

    def _record_done(self, outgoing: _Outgoing, *, ok: bool) -> None:
        """Complete the ticket when every record is acked; send the outcome again if any failed."""
        outgoing.remaining -= 1
        outgoing.failed |= not ok
        if outgoing.remaining:
            return
        if outgoing.failed:
            # the idempotent producer already retried up to its delivery timeout: try again
            log.warning("outcome for %s was not acknowledged; sending it again", outgoing.ticket.source)
            self._queue.append((outgoing.ticket, outgoing.records))
            self._queued.set()
        else:
            self._complete(outgoing.ticket)

    async def _commit_ready(self, partitions: set[TopicPartition] | None) -> None:
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
            self._tracker.mark_committed({tp: points[tp] for tp in ready})

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        try:
            await self._finish_revoke(partitions, timeout_s)
        finally:
            self._forget(partitions)


class ExactlyOnceSink(_SinkBase):
    """Per-input-partition transactional producers; outcomes and offsets in one transaction."""

    def __init__(
        self,
        make_producer: ProducerFactory,
        group_id: str,
        commit: CommitFn,
        rejoin: Callable[[], None],
        assignment: Assignment | None = None,
    ) -> None:
        super().__init__(commit, assignment)
        self._make_producer = make_producer
        self._group_id = group_id
        self._rejoin = rejoin
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._ready: dict[TopicPartition, dict[int, Sequence[OutRecord]]] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}

    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self._group_id}.{tp.topic}.{tp.partition}"

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        await super().on_assigned(partitions)
        for tp in partitions:
            if tp not in self._producers:
                producer = self._make_producer(transactional_id=self.transactional_id(tp))
                # start() registers the transactional id and fences any older owner of it
                await producer.start()
                self._producers[tp] = producer
                self._locks[tp] = asyncio.Lock()

    def deliver(self, ticket: Ticket, records: Sequence[OutRecord]) -> None:
        if not self._current(ticket):
            return
        tp = ticket.source.tp
        self._ready.setdefault(tp, {})[ticket.source.offset] = records
        self._completed(tp, ticket.source.offset)

    async def _commit_ready(self, partitions: set[TopicPartition] | None) -> None:
        # One partition's failure must not hold back the others: each commits on its own,
        # and the first error is raised once all were tried (the commit loop retries it).
        error: Exception | None = None
        fenced = False
        ready = self._tracker.committable()
        for tp, next_offset in ready.items():
            if partitions is not None and tp not in partitions:
                continue
            try:
                await self._commit_partition(tp, next_offset)
            except ProducerFenced:
                # Kafka says the same for a newer owner of the transactional id and for a
                # transaction the broker aborted after transaction_timeout_s. Either way this
                # partition's uncommitted outcomes are void; a new assignment settles who owns
                # it now (a partition assigned here again gets a fresh producer and is read
                # again from its committed offset). Without the rejoin a timed-out partition
                # had no producer until some other rebalance: read, answered, never committed.
                log.warning(
                    "%s: producer %s was fenced (a newer owner took the partition, or a "
                    "transaction outlived transaction_timeout_s); dropping its uncommitted "
                    "outcomes and asking the group for a new assignment",
                    tp,
                    self.transactional_id(tp),
                )
                await self._drop(tp)
                fenced = True
            except Exception as exc:
                error = error or exc
                if _producer_dead(self._producers.get(tp)):
                    await self._replace_producer(tp)
        if fenced:
            self._rejoin()  # once for the round: each rejoin would be another rebalance
        if error is not None:
            raise error

    async def _replace_producer(self, tp: TopicPartition) -> None:
        """A new producer for a partition this instance still owns, whose producer died.

        Its start() takes over the transactional id (the dead one's open transaction is
        aborted); the partition's outcomes stay in memory and go out in the next transaction.
        While the brokers are unreachable the start fails and the next round tries again.
        """
        lock = self._locks.get(tp)
        old = self._producers.get(tp)
        if lock is None or old is None:
            return
        async with lock:
            if not self._owns(tp, old):
                return
            new = self._make_producer(transactional_id=self.transactional_id(tp))
            try:
                await new.start()
            except Exception:
                log.warning("%s: replacing its dead producer failed; retrying", tp, exc_info=True)
                with contextlib.suppress(Exception):
                    await new.stop()
                return
            self._producers[tp] = new
        log.warning("%s: producer %s had died; replaced it", tp, self.transactional_id(tp))
        with contextlib.suppress(Exception):  # dead: it may not close cleanly
            await old.stop()

    async def _drop(self, tp: TopicPartition) -> None:
        """Forget a partition this instance no longer owns and close its producer."""
        producer = self._producers.pop(tp, None)
        lock = self._locks.pop(tp, None)
        self._ready.pop(tp, None)
        self._forget({tp})
        if producer is None:
            return
        # A transaction still running on this producer must end before it stops: aiokafka
        # never finishes a transaction on a stopped producer, and the commit loop would hang.
        if lock is not None:
            try:
                await asyncio.wait_for(lock.acquire(), COMMIT_TIMEOUT_S)
            except TimeoutError:
                log.warning("%s: a transaction outlived %.0f s; closing anyway", tp, COMMIT_TIMEOUT_S)
            else:
                lock.release()
        try:
            await producer.stop()
        except Exception:  # a fenced producer may fail to close cleanly; it is gone either way
            log.debug("closing the producer of %s failed", tp, exc_info=True)

    def _owns(self, tp: TopicPartition, producer: AIOKafkaProducer) -> bool:
        return self._producers.get(tp) is producer

    async def _commit_partition(self, tp: TopicPartition, next_offset: int) -> None:
        producer = self._producers.get(tp)
        lock = self._locks.get(tp)
        if producer is None or lock is None:
            return
        async with lock:
            if not self._owns(tp, producer):
                return  # revoked or fenced while this waited: that producer is closed
            waiting = self._ready.get(tp, {})
            offsets = sorted(o for o in waiting if o < next_offset)
            # Step 1: open the transaction. Step 2: outcomes in input order.
            # Step 3: the input offset joins the transaction. Step 4: commit all of it at once.
            sent: list[asyncio.Future[Any]] = []
            try:
                async with producer.transaction():
                    records = [(o, r) for o in offsets for r in waiting[o]]
                    await produce_batches(producer, records, lambda fut, _offsets: sent.append(fut))
                    await producer.send_offsets_to_transaction({tp: next_offset}, self._group_id)
            finally:
                # the commit (or its error) covers every send; fetch their outcomes so a failed
                # transaction does not also log one "exception never retrieved" per batch
                for fut in sent:
                    if fut.done() and not fut.cancelled():
                        fut.exception()
            for o in offsets:
                del waiting[o]
            self._tracker.mark_committed({tp: next_offset})

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        try:
            await self._finish_revoke(partitions, timeout_s)
        finally:
            for tp in partitions:
                await self._drop(tp)

    async def stop(self) -> None:
        await self._stop_loop()
        for producer in self._producers.values():
            await producer.stop()
        self._producers.clear()
