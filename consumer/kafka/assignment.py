"""The partitions this instance owns, and what it knows about each, in one object.

Every part that keeps state per assigned partition keeps it here, so a partition's state
begins and ends in one place: `assign` when the group hands it over, `revoke` when it is
taken away (or its transactional producer was fenced). Per partition:

    epoch       which assignment a job was taken in under (its `Ticket`): a completion from
                an older epoch arrives after a revoke and is dropped (the sink);
    fetched_to  the next offset the intake will fetch: offsets below it were fetched;
    done        offsets at or above the committed one that an earlier owner finished, read
                from the committed offset's metadata: the intake skips them and its commits
                carry them on until the watermark passes them;
    done_read   whether that metadata was read (it is, once, on assignment);
    skip_below  a partition kept through a rebalance: the records below it, read again from
                the committed offset, are skipped (they are in this instance's work already).

One `MembershipLease` for the whole assignment says whether the group may already have given
the partitions away (this member's heartbeats unanswered for a session) and whether that is in
doubt (unanswered past a heartbeat and a half): the Kafka intake confirms it, the at_least_once
sink hands no outcome to its producer while it is in doubt.

The intake and the sink share one (`owned` on both; `app.run_service` makes it). What is the
sink's own per partition (its watermark `OffsetTracker`, exactly_once's producers) is
forgotten in the same revoke; jobs still waiting in collection windows or for an offline batch are the
pipeline's to abandon (`Pipeline.on_lost`). A rebalance revokes every partition, but only the
lost ones are revoked here (`KafkaIntake` on assignment): a kept partition keeps its epoch,
its fetch position and its work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from consumer.core.offsets import NO_OFFSETS, DoneOffsets
from consumer.kafka.records import TopicPartition


@dataclass(slots=True)
class PartitionState:
    """What this instance knows about one partition it owns (see the module docstring)."""

    epoch: int
    fetched_to: int | None = None
    done: DoneOffsets = NO_OFFSETS
    done_read: bool = False
    #: kept through a rebalance: the consumer reads again from the committed offset, and the
    #: records below this one are in this instance's work already (None: none to skip)
    skip_below: int | None = None


class MembershipLease:
    """Whether this member certainly still owns its partitions.

    The group coordinator expels a member whose heartbeats stop reaching it for a session,
    counted from the last one it received; that one was sent after the last heartbeat this
    member saw answered was sent. So until (that send time + the session) no other member can
    have been given the partitions; past it, one may have, and an outcome written now could
    be a second copy of the new owner's (a zombie write).

    Membership is in doubt earlier, once no request was answered for `DOUBT_HEARTBEATS`
    heartbeat intervals: a heartbeat goes every interval, so a member in touch with the group
    never gets there, and one that is cut off gets there well before its session lapses. An
    outcome handed to the producer in between may sit in it until the brokers are reachable
    again, and be written after the group gave its job to another member; held instead, it
    is dropped by the revoke if the group moved on (the new owner does the job, once).

    Unarmed (no consumer group: the in-memory edges) it is always held. Times are
    `time.monotonic()` seconds, passed in.
    """

    #: no request answered for this many heartbeat intervals: the membership is in doubt
    DOUBT_HEARTBEATS = 1.5

    def __init__(self) -> None:
        self.session_s: float | None = None
        self._doubt_s: float | None = None
        self._confirmed_s = 0.0

    def arm(self, session_s: float, now_s: float, heartbeat_s: float | None = None) -> None:
        """Start counting at `now_s`; `heartbeat_s`: the group's heartbeat interval (None:
        in doubt only once the session has lapsed)."""
        self.session_s = session_s
        doubt_s = session_s if heartbeat_s is None else heartbeat_s * self.DOUBT_HEARTBEATS
        self._doubt_s = min(session_s, doubt_s)
        self._confirmed_s = now_s

    def confirm(self, sent_at_s: float) -> None:
        """The group answered a request (heartbeat, join, commit) sent at `sent_at_s`."""
        self._confirmed_s = max(self._confirmed_s, sent_at_s)

    def leave(self) -> None:
        """The member left the group: it owns no partition, so nothing it writes from now on
        is a zombie write for one (what it still writes is what it handed over, bounded by
        the hand-overs' deadlines: `consumer.core.handover`): it is held, never in doubt."""
        self.session_s = None
        self._doubt_s = None

    def held(self, now_s: float) -> bool:
        """False once the group may have given the partitions to another member."""
        return self.session_s is None or now_s < self._confirmed_s + self.session_s

    def certain_for(self, now_s: float) -> float:
        """Seconds until the membership is in doubt (<= 0: it is; inf: unarmed)."""
        if self._doubt_s is None:
            return math.inf
        return self._confirmed_s + self._doubt_s - now_s


class Assignment:
    """The owned partitions' states; epochs grow for the life of the process."""

    def __init__(self) -> None:
        self._states: dict[TopicPartition, PartitionState] = {}
        self._next_epoch = 1
        #: how many partitions were revoked so far: an outcome taken in while its partition
        #: was owned stays current until this moves (a check per outcome costs the hot path)
        self.revocations = 0
        #: the member's hold on all of them (see `MembershipLease`)
        self.lease = MembershipLease()

    def assign(self, tp: TopicPartition) -> PartitionState:
        """The partition's state, begun with a new epoch when it is not owned yet."""
        state = self._states.get(tp)
        if state is None:
            state = self._states[tp] = PartitionState(self._next_epoch)
            self._next_epoch += 1
        return state

    def revoke(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget these partitions: completions of their current epoch become late."""
        for tp in partitions:
            if self._states.pop(tp, None) is not None:
                self.revocations += 1

    def get(self, tp: TopicPartition) -> PartitionState | None:
        return self._states.get(tp)

    def epoch(self, tp: TopicPartition) -> int | None:
        state = self._states.get(tp)
        return state.epoch if state is not None else None

    def __contains__(self, tp: object) -> bool:
        return tp in self._states

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._states)
