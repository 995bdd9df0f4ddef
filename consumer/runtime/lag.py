"""Refreshes the consumer-lag gauges (`ServiceStats.lag`) every few seconds from the intake's
offsets (`JobIntake.partition_offsets`, the real broker's or the in-memory fake's)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from consumer.core.lag import LagTracker, PartitionOffsets
from consumer.kafka.records import TopicPartition
from consumer.runtime.stats import ServiceStats
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)

#: how often the lag gauges are refreshed (a few broker round trips each time)
LAG_REFRESH_S = 5.0


class OffsetsSource(Protocol):
    async def partition_offsets(self) -> dict[TopicPartition, PartitionOffsets]: ...


class LagMonitor:
    """A task that keeps `stats.lag` current for the partitions this instance owns."""

    def __init__(
        self,
        intake: OffsetsSource,
        stats: ServiceStats,
        *,
        interval_s: float = LAG_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._intake = intake
        self._stats = stats
        self._interval_s = interval_s
        self._clock = clock
        self._tracker: LagTracker[TopicPartition] = LagTracker()
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        offsets = await self._intake.partition_offsets()
        lag = self._tracker.update(self._clock(), offsets)
        self._stats.lag = {(tp.topic, tp.partition): v for tp, v in lag.items()}

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # a broker hiccup: the gauges keep their last values
                log.warning("consumer lag refresh failed: %s", exc)
            await asyncio.sleep(self._interval_s)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="promptbus-lag")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
