"""The tier file's `lanes` section: one `LaneConfig` per lane, highest priority first, and the
core's `Lane`s made from them."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from consumer.core.lanes import DEFAULT_LANE_NAME, DEFAULT_MIN_SHARE, Lane
from consumer.settings.base import StrictModel


class LaneConfig(StrictModel):
    """One lane of the tier file (`consumer.core.lanes`): a job topic and its priority, which
    is its place in the `lanes` mapping (the first is the highest)."""

    topic: str = Field(min_length=1, description="the Kafka topic this lane's jobs are read from")
    min_share: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="the share of each tier's requests this lane keeps while it has work waiting; "
        "unset: 0 for the first lane (it wins every slot no other lane is owed), else "
        f"DEFAULT_MIN_SHARE ({DEFAULT_MIN_SHARE:g})",
    )
    max_inflight: int | None = Field(
        None, ge=1, description="records of this lane held before its partitions pause; unset: "
        "PROMPTBUS_MAX_INFLIGHT"
    )
    max_wait_ms: float | None = Field(
        None,
        gt=0,
        description="a collection window holding a job of this lane flushes at most this long "
        "after the job arrived; unset: the tier's batching.max_wait_ms",
    )


def lane_min_share(lane: LaneConfig, rank: int) -> float:
    """A lane's `min_share`: its own, else 0 for the first lane (rank 0) and
    DEFAULT_MIN_SHARE for every lane below it."""
    if lane.min_share is not None:
        return lane.min_share
    return 0.0 if rank == 0 else DEFAULT_MIN_SHARE


def lanes_problem(lanes: Mapping[str, LaneConfig]) -> str | None:
    """What the lanes cannot be together (a topic of two lanes, shares adding up to 1 or
    more), naming the key; None when nothing is wrong."""
    topics = [lane.topic for lane in lanes.values()]
    for name, lane in lanes.items():
        if topics.count(lane.topic) > 1:
            return f"lanes.{name}.topic: {lane.topic} is the topic of another lane too"
    shares = sum(lane_min_share(lane, rank) for rank, lane in enumerate(lanes.values()))
    if shares >= 1.0:
        return (
            f"lanes: the min_share of all lanes add up to {shares:g} (lanes below the first "
            f"default to {DEFAULT_MIN_SHARE}); they must add up to less than 1"
        )
    return None


def lane_list(lanes: Mapping[str, LaneConfig] | None, jobs_topic: str, max_inflight: int) -> tuple[Lane, ...]:
    """The service's lanes, highest first: those of the tier file's `lanes`, or one lane
    named `default` on `jobs_topic` (PROMPTBUS_JOBS_TOPIC). `max_inflight`: the service's
    PROMPTBUS_MAX_INFLIGHT, the bound of a lane that names none."""
    if not lanes:
        return (Lane(DEFAULT_LANE_NAME, jobs_topic, max_inflight=max_inflight),)
    return tuple(
        Lane(
            name,
            lane.topic,
            rank=rank,
            min_share=lane_min_share(lane, rank),
            max_inflight=lane.max_inflight if lane.max_inflight is not None else max_inflight,
            max_wait_ms=lane.max_wait_ms,
        )
        for rank, (name, lane) in enumerate(lanes.items())
    )
