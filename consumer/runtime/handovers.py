"""The new owner's side of hand-overs (at_least_once, `consumer.core.handover`).

At an assignment the hand-overs the old owners published are read before any record of the new
partitions is taken in. A record a hand-over names is parked (tracked, so commits wait for it,
but not run) while its old owner finishes it; its finished record completes it here without an
outcome (the old owner's is durable), and its deadline releases it to run here. The old owner's
side (publishing, finishing) is the sink's (`OutcomeSink.hand_over`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from consumer.core.handover import HandOverBook, Verdict
from consumer.kafka.handover import HandOverBoard
from consumer.kafka.intake import InRecord
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.kafka.sink import OutcomeSink, Ticket
from consumer.runtime.stats import ServiceStats
from consumer.waits import wait_at_most

log = logging.getLogger(__name__)

#: on assignment, reading the hand-overs published before it may take this long; past it the
#: new partitions are read anyway (what an old owner handed over may then be done twice)
HANDOVER_READ_TIMEOUT_S = 5.0

Taken = tuple[InRecord, Ticket]


class HandedOverRecords:
    """What the group's hand-overs make of this instance's records: parked, completed or run."""

    def __init__(
        self,
        board: HandOverBoard,
        sink: OutcomeSink,
        stats: ServiceStats,
        *,
        timeout_s: float,
        clock_ms: Callable[[], int],
    ) -> None:
        """timeout_s: the hand-overs' deadline (what is older than one deadline past its own is
        done with); clock_ms: the wall clock the deadlines are on."""
        self._board = board
        self._sink = sink
        self._stats = stats
        self._keep_ms = round(timeout_s * 1000)
        self._clock_ms = clock_ms
        #: what the hand-overs read make of this instance's records (as of `_book_version`)
        self._book = HandOverBook()
        self._book_version = -1
        #: records an old owner is finishing, until its hand-over says how they ended or its
        #: deadline passes
        self.parked: dict[SourceOffset, Taken] = {}
        #: clear from a rebalance's revoke until its assignment has read the hand-overs: aiokafka
        #: may return the new partitions' records while the assignment callback still runs
        self._assignment_read = asyncio.Event()
        self._assignment_read.set()

    def revoked(self) -> None:
        """A rebalance began: records polled from now wait for its assignment's hand-overs."""
        self._assignment_read.clear()

    async def read_at_assignment(self) -> None:
        """Read what the old owners handed over (published before this assignment was made)."""
        try:
            read = await self._board.read_to_end(HANDOVER_READ_TIMEOUT_S)
        except Exception:
            log.warning("reading the hand-overs failed", exc_info=True)
            read = False
        if not read:
            log.warning(
                "hand-overs not read within %.0f s: work an old owner is finishing may be done again",
                HANDOVER_READ_TIMEOUT_S,
            )
        self._refresh_book()
        self._assignment_read.set()

    async def wait_for_assignment(self) -> None:
        """Polled records are taken in once the hand-overs say which of them to park."""
        if not self._assignment_read.is_set():
            await wait_at_most(self._assignment_read.wait(), HANDOVER_READ_TIMEOUT_S)

    def take(self, taken: list[Taken]) -> list[Taken]:
        """The polled records to take in as usual: those a hand-over parks or completes are not."""
        book = self._book
        if not book.active:
            return taken
        now_ms, touches, settled = self._clock_ms(), book.touches, self._settled
        return [
            (record, ticket)
            for record, ticket in taken
            if not (
                touches(record.source.tp.topic, record.source.tp.partition)
                and settled(record, ticket, now_ms)
            )
        ]

    def released(self) -> list[Taken]:
        """Parked records whose hand-over expired, to run here; those it finished are completed."""
        self._refresh_book()
        now_ms = self._clock_ms()
        released: list[Taken] = []
        for source, (record, ticket) in list(self.parked.items()):
            del self.parked[source]
            if not self._settled(record, ticket, now_ms):
                released.append((record, ticket))
        if released:
            self._stats.handover_redone += len(released)
            log.info("%d parked records not finished by their old owner: doing them here", len(released))
        return released

    def forget(self, partitions: set[TopicPartition]) -> None:
        """These partitions are not this instance's any more: their parked records with them."""
        for source in [s for s in self.parked if s.tp in partitions]:
            del self.parked[source]

    def _settled(self, record: InRecord, ticket: Ticket, now_ms: int) -> bool:
        """Park a record an old owner is finishing, or complete one it finished (no outcome
        from here); False: the record runs here."""
        source = record.source
        verdict = self._book.verdict(source.tp.topic, source.tp.partition, source.offset, now_ms)
        if verdict is Verdict.PARK:
            self.parked[source] = (record, ticket)
        elif verdict is Verdict.COMPLETED:
            self._sink.deliver(ticket, None)
            self._stats.handover_completed += 1
        return verdict is not Verdict.RUN

    def _refresh_book(self) -> None:
        version = self._board.version
        if version != self._book_version:
            self._book_version = version
            self._book.load(self._board.handovers(), now_ms=self._clock_ms(), keep_ms=self._keep_ms)

