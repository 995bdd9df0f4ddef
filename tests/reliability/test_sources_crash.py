"""SIGKILL a `promptbus run` process enriching a source mid-stream, twice: nothing is lost.

A real `promptbus run` subprocess, a real broker, the simulator over real HTTP in a background
thread (so it outlives every service process), the tier held to 2 concurrent requests so the
backlog lasts across the kills. The source topic holds two versions of each of 150 keys; each
kill comes once the running process has written enriched records of its own. At the end every
key's last enriched record is the enrichment of its latest version (at least once: a key may
have been written more than once, never lost and never left at an older version).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumer.testing.harness import service_env, settings_from_env, slow_tier
from consumer.testing.process import ServiceProcess, stop_gracefully
from consumer.testing.records import RawRecord, produce_records, read_records
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

pytestmark = pytest.mark.integration

KEYS = 150
KILLS = 2
#: enriched records each process writes before it is killed
KILL_AFTER = 40
FINISH_WAIT_S = 180.0


async def _count(settings: Any, topic: str) -> int:
    return len(await read_records(settings, topic))


async def test_a_source_killed_mid_stream_loses_nothing(
    kafka_bootstrap: str, short_session_s: float, create_topic: Any, topic_name: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=4, PROMPTBUS_SESSION_TIMEOUT_S=short_session_s)
    settings = settings_from_env(env)
    source_topic = await create_topic(f"{topic_name}-src", partitions=4)
    out_topic = f"{topic_name}-out"
    records = [
        RawRecord(f"k{i}".encode(), orjson.dumps({"n": i, "text": f"review {i} v{v}"}))
        for v in (1, 2)
        for i in range(KEYS)
    ]
    await produce_records(settings, source_topic, records)
    with run_simulator(SimulatorConfig(latency_ms=120, jitter_ms=40, seed=3)) as sim_url:
        tiers = slow_tier(sim_url)
        tiers["sources"] = {
            "s": {
                "topic": source_topic,
                "tier": "small",
                "prompt": "Say something about this text.\nTEXT:\n${text}",
                "into": {"topic": out_topic, "field": "answer"},
            }
        }
        service = ServiceProcess(env, tiers, tmp_path)
        service.start()
        try:
            written = 0
            for _ in range(KILLS):
                deadline = time.monotonic() + 90
                while await _count(settings, out_topic) < written + KILL_AFTER:
                    assert service.alive(), service.log_tail()
                    assert time.monotonic() < deadline, "no progress before the kill"
                    await asyncio.sleep(0.3)
                service.kill()
                written = await _count(settings, out_topic)
                assert written < 2 * KEYS, "the kill came after the end: make the backlog longer"
                await asyncio.sleep(1.0)
                service.start()
            deadline = time.monotonic() + FINISH_WAIT_S
            latest: dict[bytes | None, Any] = {}
            while True:
                enriched = await read_records(settings, out_topic)
                latest = {r.key: orjson.loads(r.value or b"") for r in enriched}
                done = [k for k, v in latest.items() if v["text"].endswith("v2")]
                if len(done) == KEYS or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
        finally:
            await stop_gracefully(service, 60)
    assert len(latest) == KEYS
    for key, value in latest.items():
        assert value["text"].endswith("v2"), (key, value)
        assert value["answer"] == answer_for(value["text"])
    assert await read_records(settings, settings.dlq_topic) == []
