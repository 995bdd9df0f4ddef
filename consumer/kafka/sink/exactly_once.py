"""exactly_once delivery: one transactional producer per input partition; outcomes and the
input offset commit in one transaction (see `consumer.kafka.sink`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced

from consumer.kafka.assignment import Assignment
from consumer.kafka.records import OutRecord, TopicPartition
from consumer.kafka.sink.base import COMMIT_TIMEOUT_S, CommitFn, SinkBase, Ticket
from consumer.kafka.sink.record_batch import ProducerFactory, produce_record_batches

log = logging.getLogger(__name__)


def _producer_dead(producer: AIOKafkaProducer | None) -> bool:
    """True when the producer's sender routine has ended: it never sends again.

    aiokafka ends it on an error it does not expect (e.g. the group coordinator's connection
    closing during a transactional offset commit) and leaves the producer in FATAL_ERROR;
    no public API says so, hence the private attribute.
    """
    sender = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    return task is not None and task.done()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a delivery future's error as seen (its transaction's error says it already)."""
    if not fut.cancelled():
        fut.exception()


class ExactlyOnceSink(SinkBase):
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
        self._ready: dict[TopicPartition, dict[int, OutRecord | None]] = {}
        self._locks: dict[TopicPartition, asyncio.Lock] = {}

    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self._group_id}.{tp.topic}.{tp.partition}"

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        # the kept partitions' transactions go on at once; a new one commits once its producer
        # is there (whose start fences the earlier owner: that owner's last transaction ended
        # before its revoke returned, so before this assignment)
        await super().on_assigned(partitions)
        for tp in partitions:
            if tp not in self._producers:
                producer = self._make_producer(transactional_id=self.transactional_id(tp))
                # start() registers the transactional id and fences any older owner of it
                await producer.start()
                self._producers[tp] = producer
                self._locks[tp] = asyncio.Lock()

    def deliver(self, ticket: Ticket, record: OutRecord | None) -> None:
        self.deliver_all(((ticket, record),))

    def deliver_all(self, outcomes: Sequence[tuple[Ticket, OutRecord | None]]) -> None:
        for ticket, record in outcomes:
            if self._current(ticket):
                tp = ticket.source.tp
                self._ready.setdefault(tp, {})[ticket.source.offset] = record
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
                # would have no producer until some other rebalance: read, answered, never committed.
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

        Only while the membership is certain (`Assignment.lease`): taking the transactional id
        over fences whoever holds it now, and a member the group expelled meanwhile (cut off
        past its session, its producer died of it) would fence the partition's new owner and
        commit its own outcomes and offsets over the new owner's (aiokafka's transactional
        offset commit carries no generation for the broker to refuse). Such a member learns
        of the expulsion at its next heartbeat, and its rejoin drops the partition.
        """
        lock = self._locks.get(tp)
        old = self._producers.get(tp)
        if lock is None or old is None:
            return
        if self.owned.lease.certain_for(time.monotonic()) <= 0:
            log.debug("%s: its producer died; replaced once the group answers this member again", tp)
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
                    records = [(o, r) for o in offsets if (r := waiting[o]) is not None]
                    await produce_record_batches(producer, records, lambda fut, _offsets: sent.append(fut))
                    await producer.send_offsets_to_transaction({tp: next_offset}, self._group_id)
            finally:
                # the commit (or its error) covers every send; fetch their outcomes so a failed
                # transaction does not also log one "exception never retrieved" per batch (a
                # fenced producer fails its batches after the transaction's error is raised)
                for fut in sent:
                    if fut.done():
                        _retrieve(fut)
                    else:
                        fut.add_done_callback(_retrieve)
            for o in offsets:
                del waiting[o]
            self._commits += 1
            self._tracker.mark_committed({tp: next_offset})

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        # their outcomes wait in memory, uncommitted: dropped with the producer, never written
        for tp in partitions:
            await self._drop(tp)

    async def stop(self) -> None:
        await self._stop_loop()
        for producer in self._producers.values():
            await producer.stop()
        self._producers.clear()
