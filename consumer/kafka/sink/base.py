"""The delivery edge: `OutcomeSink` (the Protocol the pipeline talks to), the `Ticket` it hands
out per input record, and `SinkBase`, the ticket, epoch and watermark bookkeeping and the
commit loop both guarantees share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Container, Sequence
from typing import NamedTuple, Protocol

from consumer.core.errors import MembershipLost
from consumer.core.offsets import CommitPoint, OffsetTracker
from consumer.core.tuples import maker
from consumer.kafka.assignment import Assignment
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.waits import wait_at_most

log = logging.getLogger(__name__)

#: commits input positions: an offset, or a CommitPoint when offsets above it are finished too
#: (a plain offset when nothing is, so a commit function that knows only offsets still works
#: wherever nothing finishes out of order)
CommitFn = Callable[[dict[TopicPartition, int | CommitPoint]], Awaitable[None]]

#: how often ready offsets are committed (at_least_once) or transactions closed (exactly_once)
#: when nothing asks for a commit sooner
COMMIT_INTERVAL_S = 0.2
#: an early commit (`_commit_soon`) waits this long first, so the acks of one produced record
#: batch go into one commit; it bounds the commits per second, the cost per job of committing
#: early (what a SIGKILL redoes is what was acked within the last gap + commit round trip)
COMMIT_GATHER_S = 0.005
#: one commit may not take longer than this; it is retried on the next round
COMMIT_TIMEOUT_S = 10.0
#: between two tries of a revoke's last commit (the group coordinator may be failing over too)
REVOKE_COMMIT_RETRY_S = 0.2


class Ticket(NamedTuple):
    """Proof that an input record was taken in under a given assignment of its partition (a
    NamedTuple: one is made per record)."""

    source: SourceOffset
    epoch: int


_new_ticket = maker(Ticket)


class OutcomeSink(Protocol):
    """Where finished jobs go. Owns producing outcomes and committing input offsets."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def track(self, source: SourceOffset) -> Ticket: ...

    def deliver(self, ticket: Ticket, record: OutRecord | None) -> None:
        """The job's outcome is decided: make its `record` (a result or a dead letter; None:
        an offline job's, which has none yet) durable, then its offset committable."""
        ...

    def deliver_all(self, outcomes: Sequence[tuple[Ticket, OutRecord | None]]) -> None:
        """`deliver` each (ticket, record), in one call (the jobs one answer ended)."""
        ...

    async def on_assigned(self, partitions: set[TopicPartition]) -> None: ...

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        """A rebalance began: commit what is durable of these partitions (waiting up to
        timeout_s only for outcomes already on their way, never for work in progress), then
        hold outcomes and commits until `on_assigned` says which partitions stayed."""
        ...

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        """These partitions belong to another member now: forget them; their held outcomes
        and their later completions are dropped, never written or committed."""
        ...

    async def flush(self, timeout_s: float) -> None:
        """Make everything ready durable and commit it (shutdown)."""
        ...

    async def hand_over(self, partitions: set[TopicPartition], not_ours: Container[SourceOffset]) -> bool:
        """at_least_once: publish, per partition of `partitions` with offsets in flight here
        (but `not_ours`: parked for an earlier owner's outcome), a hand-over of them, so the
        partition's next owner waits for their outcomes instead of doing them again; their
        work goes on here if the partition moves. True when every hand-over was published
        (exactly_once: nothing is handed over, False)."""
        ...

    def handed_over(self, partitions: set[TopicPartition]) -> set[TopicPartition]:
        """Those of `partitions` whose in-flight work was handed over (it goes on here)."""
        ...

    async def leave(self, partitions: set[TopicPartition]) -> None:
        """The instance is leaving the group, its work in `partitions` handed over: it owns
        nothing from now on; it finishes what it handed over (a stop's drain)."""
        ...

    def abandon(self, ticket: Ticket) -> None:
        """No outcome will come for this ticket (it is read again by its partition's owner)."""
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

    @property
    def commits(self) -> int:
        """Commits (or closed transactions) made so far: what committing costs per job."""
        ...


class SinkBase:
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
        self._commits = 0
        #: between a rebalance's revoke and its assignment nothing is written or committed:
        #: which partitions stay is not known yet (`on_revoked`)
        self._held = False
        #: one commit round at a time: the revoke's last one and the loop's
        self._round = asyncio.Lock()
        #: the last revoke's commit was refused: the group moved on without this member
        self.refused = False

    # -- intake side
    def track(self, source: SourceOffset) -> Ticket:
        tp = source.tp
        # records only come from assigned partitions; `assign` is a no-op for those
        epoch = self.owned.assign(tp).epoch
        self._tracker.track(tp, source.offset)
        return _new_ticket((source, epoch))

    def inflight(self, partition: TopicPartition | None = None) -> int:
        return self._tracker.pending_count(partition)

    async def wait_for_room(self, max_inflight: int, timeout_s: float) -> None:
        # Intake must not sleep through a whole poll interval while acks free room: at a
        # full max_inflight that wait, not the work, would set the pace.
        self._progress.clear()
        if self.inflight() < max_inflight:
            return
        await wait_at_most(self._progress.wait(), timeout_s)

    def _completed(self, tp: TopicPartition, offset: int) -> None:
        if self._tracker.complete(tp, offset):
            self._progress.set()

    @property
    def dropped_late(self) -> int:
        return self._dropped_late

    @property
    def commits(self) -> int:
        return self._commits

    def _current(self, ticket: Ticket) -> bool:
        if self.owned.epoch(ticket.source.tp) != ticket.epoch:
            self._dropped_late += 1
            log.debug("dropping late completion for %s (partition revoked)", ticket.source)
            return False
        return True

    async def on_assigned(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self.owned.assign(tp)
        self._release()

    def _release(self) -> None:
        """The rebalance is over: what was held is written and committed now."""
        if self._held:
            self._held = False
            self._commit_soon()

    async def on_revoked(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        async with self._round:
            await self._finish_revoke(partitions, timeout_s)
            self._held = True

    async def on_lost(self, partitions: set[TopicPartition]) -> None:
        self._forget(partitions)

    async def hand_over(self, partitions: set[TopicPartition], not_ours: Container[SourceOffset]) -> bool:
        return False

    def handed_over(self, partitions: set[TopicPartition]) -> set[TopicPartition]:
        return set()

    async def leave(self, partitions: set[TopicPartition]) -> None:
        self._forget(partitions)

    def abandon(self, ticket: Ticket) -> None:
        """Nothing to do: the offset stays in flight, so it is never committed here."""

    async def start(self) -> None:
        self._commit_task = asyncio.create_task(self._commit_loop(), name="promptbus-commit")

    async def _stop_loop(self) -> None:
        if self._commit_task:
            self._commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
            self._commit_task = None

    def _commit_soon(self) -> None:
        """Commit within COMMIT_GATHER_S (after the commit in flight, if any), not at the next interval."""
        self._wakeup.set()

    async def _commit_loop(self) -> None:
        while True:
            await wait_at_most(self._wakeup.wait(), COMMIT_INTERVAL_S)
            if self._wakeup.is_set():
                await asyncio.sleep(COMMIT_GATHER_S)
            # cleared before committing: what completes during the commit asks for the next one
            self._wakeup.clear()
            try:
                async with self._round:
                    if not self._held:
                        await self._commit_ready(None)
            except MembershipLost as exc:  # until the rebalance that follows, nothing commits
                log.warning("commit refused: %s; the offsets stay uncommitted", exc)
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
        """Wait (bounded) for every outcome taken in, then commit what is ready (shutdown);
        in the middle of a rebalance nothing is committed (the owners are not known yet)."""
        if self._held:
            log.warning("shutdown during a rebalance: what is not committed yet is done again")
            return
        await self._wait_done(None, timeout_s)
        await self._commit_ready(None)

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._tracker.forget(tp)
        self.owned.revoke(partitions)

    async def _finish_revoke(self, partitions: set[TopicPartition], timeout_s: float) -> None:
        """Wait (up to `_settle_s`, at least `timeout_s`) for what `_settle` waits for, and
        commit, retrying the commit until then (not once the group refused it: it has moved
        on without this member); a failure only loses progress. Work still in
        progress is not waited for: a partition that stays goes on with it, one that moves is
        done again by its new owner.

        Never raises: the rebalance goes on whatever happens here.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, self._settle_s())
        self.refused = False
        await self._settle(partitions, deadline)
        while True:
            try:
                await self._commit_ready(partitions)
                return
            except MembershipLost:
                self.refused = True
                # the group moved on without this member: no retry can commit these offsets
                # (their next owner starts at the last committed ones), and waiting out the
                # deadline would only hold this member's rejoin back
                log.warning(
                    "revoke of %s: the group has rebalanced without this member; its last "
                    "commit was refused, the next owner starts at the last committed offsets",
                    sorted(partitions),
                )
                return
            except Exception:
                if loop.time() + REVOKE_COMMIT_RETRY_S >= deadline:
                    log.warning(
                        "revoke of %s: final commit failed; the next owner starts at the last "
                        "committed offsets",
                        sorted(partitions),
                        exc_info=True,
                    )
                    return
            await asyncio.sleep(REVOKE_COMMIT_RETRY_S)

    def _settle_s(self) -> float:
        """How long a revoke may wait in `_settle` (none here)."""
        return 0.0

    async def _settle(self, partitions: set[TopicPartition], deadline: float) -> None:
        """What a revoke waits for, until `deadline`, once the partitions' work is done or its
        time is up, before the last commit (nothing here)."""
