"""Lanes: job topics with a priority (docs/operations.md "Lanes").

A `Lane` is one job topic and how urgent its jobs are. The lane of a job is the lane whose
topic it was read from. Lanes are ranked (0 = the highest, the first lane of the tier file).
Who gets a tier limiter's free slot among the lanes is `consumer.core.scheduling`'s decision;
how lanes' jobs share collection windows is `consumer.core.window.LaneWindows`'.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_LANE_NAME",
    "DEFAULT_MIN_SHARE",
    "Lane",
    "pack_lane",
]

#: the name of the one lane a service without `lanes` runs (on the jobs topic)
DEFAULT_LANE_NAME = "default"
#: the share of a tier's requests a lane below the first keeps when it names none: enough that
#: a lane with work always moves (one request in twenty while the lanes above would take every
#: slot), small enough that the urgent lanes keep nineteen in twenty. The first lane needs none:
#: it wins every slot no other lane is owed.
DEFAULT_MIN_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class Lane:
    """One job topic and its place among the lanes.

    name: as in the tier file (results carry it); topic: the Kafka topic its jobs are read
    from; rank: 0 for the highest lane, then 1, 2, ...; min_share: the share of each tier's
    requests it keeps while it has work waiting; max_inflight: its records held before its
    partitions pause; max_wait_ms: a collection window holding one of its jobs flushes at most
    this long after the job arrived (None: the tier's `batching.max_wait_ms`).
    """

    name: str
    topic: str
    rank: int = 0
    min_share: float = 0.0
    max_inflight: int = 10_000
    max_wait_ms: float | None = None


def pack_lane(lanes: list[Lane]) -> Lane:
    """The lane a request carrying jobs of `lanes` is scheduled in: the highest of them (a
    request is as urgent as its most urgent job)."""
    return min(lanes, key=lambda lane: lane.rank)
