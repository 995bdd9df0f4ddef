"""Side-topic publishing: stats snapshots and offline batch records (compacted topics)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)


class StatsPublisher:
    """Every interval, publish `snapshot()` to the stats topic under this instance's key."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        instance: str,
        snapshot: Callable[[], dict[str, Any]],
        interval_s: float,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._key = instance.encode()
        self._snapshot = snapshot
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def publish_once(self) -> None:
        await self._producer.send_and_wait(self._topic, orjson.dumps(self._snapshot()), key=self._key)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # stats are best effort; the next round tries again
                log.warning("publishing stats failed: %s", exc)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="promptbus-stats")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.publish_once()  # final numbers
