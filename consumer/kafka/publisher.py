"""Side-topic publishing: the latest state of something, now and then, to a compacted topic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)


class SidePublisher:
    """Every interval, and once more at stop, publish `records()`: (key, JSON value) pairs.

    Best effort: a failed round is logged and the next one publishes the then latest state.
    `what` names the records in that log line (e.g. "stats").
    """

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        records: Callable[[], Iterable[tuple[bytes, dict[str, Any]]]],
        interval_s: float,
        *,
        what: str,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._records = records
        self._interval_s = interval_s
        self._what = what
        self._task: asyncio.Task[None] | None = None

    async def publish_once(self) -> None:
        # queued together, acknowledged together: one round trip per round, not per record
        delivered = [
            await self._producer.send(self._topic, orjson.dumps(value), key=key)
            for key, value in self._records()
        ]
        await asyncio.gather(*delivered)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.publish_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("publishing %s failed: %s", self._what, exc)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"promptbus-{self._what}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await self.publish_once()  # the final state
