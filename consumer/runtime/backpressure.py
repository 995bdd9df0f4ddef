"""Backpressure per lane: pausing and resuming a lane's partitions by its in-flight bound.

Each lane has its own in-flight bound (`Lane.max_inflight`): when a lane's records held (read,
not yet committable) reach it, only that lane's partitions pause, and they resume once it is
well below the bound again. So a backlog in one lane never takes the room another lane's jobs
need. With one lane this is the service-wide pause (docs/operations.md "Backpressure"),
exactly. `LaneGate.lane_of` also names a record's lane: the lane whose topic it was read from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from consumer.core.lanes import Lane
from consumer.kafka.intake import JobIntake
from consumer.kafka.records import TopicPartition
from consumer.kafka.sink import OutcomeSink
from consumer.runtime.stats import ServiceStats

log = logging.getLogger(__name__)


def resume_point(max_inflight: int, max_poll_records: int) -> int:
    """Where a paused lane resumes: well below its bound, so the pause does not flap with every
    ack and a resumed poll can take a full batch."""
    return max_inflight - max(1, min(max_poll_records, max_inflight // 4))


@dataclass(slots=True)
class _LaneState:
    lane: Lane
    resume_at: int
    paused: bool = False
    inflight: int = 0


class LaneGate:
    """Per-lane in-flight bounds over one intake (all lanes' topics, one consumer group).

    `room()` says how many records the next poll may take; `apply()` pauses and resumes each
    lane's partitions by its own bound; `lane_of(topic)` names a record's lane.
    """

    def __init__(
        self,
        lanes: Sequence[Lane],
        intake: JobIntake,
        sink: OutcomeSink,
        stats: ServiceStats,
        *,
        max_poll_records: int,
        extra_topics: Mapping[str, Lane] | None = None,
    ) -> None:
        """extra_topics: topics read into a lane besides its own (the sources'), by topic."""
        if not lanes:
            raise ValueError("at least one lane")
        self.lanes = tuple(lanes)
        self._intake = intake
        self._sink = sink
        self._stats = stats
        self._states = [_LaneState(lane, resume_point(lane.max_inflight, max_poll_records)) for lane in lanes]
        self._by_topic = {s.lane.topic: s for s in self._states}
        by_name = {s.lane.name: s for s in self._states}
        for topic, lane in (extra_topics or {}).items():
            self._by_topic[topic] = by_name[lane.name]
        self._first = self._states[0]
        for lane in lanes:
            stats.lane(lane.name)

    def lane_of(self, topic: str) -> Lane:
        """The lane whose topic this is (records only come from the lanes' topics)."""
        state = self._by_topic.get(topic, self._first)
        return state.lane

    def _count(self) -> dict[str, list[TopicPartition]]:
        """Refresh each lane's in-flight count; return each lane's assigned partitions."""
        owned: dict[str, list[TopicPartition]] = {s.lane.name: [] for s in self._states}
        by_topic = self._by_topic
        for tp in self._intake.assignment():
            state = by_topic.get(tp.topic)
            if state is not None:
                owned[state.lane.name].append(tp)
        if len(self._states) == 1:
            self._first.inflight = self._sink.inflight()
        else:
            for state in self._states:
                state.inflight = sum(self._sink.inflight(tp) for tp in owned[state.lane.name])
        return owned

    def room(self) -> int:
        """Records the next poll may take: the least room of the lanes not paused (their
        partitions are the ones a poll reads), 0 when every lane is paused or full."""
        self._count()
        rooms = [s.lane.max_inflight - s.inflight for s in self._states if not s.paused]
        return max(0, min(rooms)) if rooms else 0

    def wait_target(self) -> int:
        """The service-wide in-flight count below which some lane will have room again."""
        total = self._sink.inflight()
        closest = min(
            (s.inflight - s.resume_at) if s.paused else (s.inflight - s.lane.max_inflight + 1)
            for s in self._states
        )
        return max(1, total - max(0, closest) + 1)

    def apply(self) -> None:
        """Pause each lane at its bound, resume it once below its resume point; partitions
        newly assigned to a paused lane are paused too."""
        owned = self._count()
        paused = self._intake.paused()
        for state in self._states:
            lane, parts = state.lane, owned[state.lane.name]
            if not state.paused and state.inflight >= lane.max_inflight:
                state.paused = True
                self._intake.pause(parts)
                log.info(
                    "backpressure: lane %s has %d items in flight >= max_inflight %d; its partitions paused",
                    lane.name,
                    state.inflight,
                    lane.max_inflight,
                )
            elif state.paused and state.inflight <= state.resume_at:
                state.paused = False
                self._intake.resume(parts)
                log.info("backpressure released: lane %s has %d items in flight", lane.name, state.inflight)
            elif state.paused:
                fresh = [tp for tp in parts if tp not in paused]
                if fresh:
                    self._intake.pause(fresh)
        self._record()

    def record(self) -> None:
        """Refresh the lanes' gauges without pausing or resuming (after the drain, whose
        last commits the next poll would otherwise never count)."""
        self._count()
        self._record()

    def _record(self) -> None:
        for state in self._states:
            stats = self._stats.lane(state.lane.name)
            stats.inflight = state.inflight
            stats.paused = int(state.paused)

    @property
    def paused_lanes(self) -> list[str]:
        """The lanes whose partitions are paused now."""
        return [s.lane.name for s in self._states if s.paused]
