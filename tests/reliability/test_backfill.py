"""`promptbus backfill`: a bounded range of a source's topic enriched by a real CLI process,
beside nothing else; killed with SIGKILL mid-range and started again, it goes on from its own
commits to the same end, then a run with nothing left exits 0 at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumer.testing.harness import service_env, settings_from_env, slow_tier
from consumer.testing.paths import PROMPTBUS, REPO_ROOT
from consumer.testing.records import RawRecord, produce_records, read_records
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from consumer.yaml12 import dump_yaml

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
OLD, NEW = 30, 60


def backfill(env: dict[str, str], config: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*PROMPTBUS, "backfill", "reviews", "--config", str(config), *args],
        env={**os.environ, **env},
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def test_a_backfill_enriches_its_range_only_and_resumes_after_a_sigkill(
    kafka_bootstrap: str, create_topic: Any, topic_name: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=3)
    settings = settings_from_env(env)
    source_topic = await create_topic(f"{topic_name}-src", partitions=3)
    out_topic = f"{topic_name}-out"
    now_ms = int(time.time() * 1000)
    records = [
        RawRecord(f"old-{i}".encode(), orjson.dumps({"text": f"old {i}"}), timestamp_ms=now_ms - 3 * HOUR_MS)
        for i in range(OLD)
    ] + [
        RawRecord(f"new-{i}".encode(), orjson.dumps({"text": f"new {i}"}), timestamp_ms=now_ms - HOUR_MS + i)
        for i in range(NEW)
    ]
    await produce_records(settings, source_topic, records)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((now_ms - 2 * HOUR_MS) / 1000))
    with run_simulator(SimulatorConfig(latency_ms=150, seed=4)) as sim_url:
        tiers = slow_tier(sim_url)
        tiers["sources"] = {
            "reviews": {
                "topic": source_topic,
                "tier": "small",
                "prompt": "Say something.\nTEXT:\n${text}",
                "into": {"topic": out_topic, "field": "answer"},
            }
        }
        config = tmp_path / "tiers.yaml"
        config.write_text(dump_yaml(tiers))
        first = backfill(env, config, "--from", since)
        deadline = time.monotonic() + 60
        while len(await read_records(settings, out_topic)) < 10:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no enriched record within 60 s"
            await asyncio.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        assert len(await read_records(settings, out_topic)) < NEW, "the kill came after the end"
        second = backfill(env, config, "--from", since)
        out, err = await asyncio.to_thread(second.communicate, timeout=240)
        assert second.returncode == 0, err.decode()[-2000:]
        assert f"{NEW} of {NEW} records" in out.decode()
        third = backfill(env, config, "--from", since)
        out3, err3 = await asyncio.to_thread(third.communicate, timeout=120)
        assert third.returncode == 0 and "nothing left" in out3.decode(), err3.decode()[-2000:]
    enriched = await read_records(settings, out_topic)
    keys = {r.key for r in enriched}
    assert keys == {f"new-{i}".encode() for i in range(NEW)}  # the range, all of it, nothing older
    for record in enriched:
        row = orjson.loads(record.value or b"")
        assert row["answer"] == answer_for(row["text"])
    assert await read_records(settings, settings.dlq_topic) == []
