"""Memory per held job: resident memory of one `promptbus run` with its in-flight jobs full.

    .venv/bin/python bench/memory_bench.py [--jobs 100000] [--max-inflight 10000] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). One service process
with the default `max_inflight`, a slow simulator (4 requests at a time, 200 ms each) so the
backlog cannot drain, half the jobs batchable (~200-byte records). Measures the process's
RSS idle (joined, no jobs), then produces the backlog and waits until the instance's stats say
`max_inflight` jobs are held, and measures again. Prints one JSON object: idle RSS, RSS at the
backlog, jobs held and bytes per held job (`--save`: also bench/results/memory_bench.json).
Not a timed test: the figures are memory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from consumer.kafka.admin import ensure_topics
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.faultrun import latest_stats
from consumer.testing.harness import job, produce, service_env, settings_from_env
from consumer.testing.process import ServiceProcess, rss_bytes
from consumer.testing.simulator import SimulatorConfig, run_simulator

MB = 1024 * 1024


def tier_file(base_url: str) -> dict[str, Any]:
    return {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": 30,
                "batching": {"enabled": True, "max_items": 10, "window_ms": 50, "max_wait_ms": 500},
                "limiter": {"algorithm": "fixed", "initial": 4, "min": 1, "max": 4},
            }
        }
    }


async def sample_rss(pid: int, seconds: float) -> int:
    """Median RSS over `seconds` (sampled every 0.25 s)."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(rss_bytes(pid))
        await asyncio.sleep(0.25)
    return int(statistics.median(samples))


async def held(settings: Any) -> int:
    return sum(int(s.get("inflight", 0)) for s in (await latest_stats(settings)).values())


async def bench(bootstrap: str, jobs: int, max_inflight: int, workdir: Path) -> dict[str, Any]:
    env = service_env(
        bootstrap, partitions=4, PROMPTBUS_STATS_INTERVAL_S=1, PROMPTBUS_MAX_INFLIGHT=max_inflight
    )
    settings = settings_from_env(env)
    await ensure_topics(settings)
    with run_simulator(SimulatorConfig(latency_ms=200, capacity=4, seed=1)) as base_url:
        service = ServiceProcess(env, tier_file(base_url), workdir)
        service.start()
        try:
            assert service.pid is not None
            deadline = time.monotonic() + 60
            while not await latest_stats(settings):
                if time.monotonic() > deadline or not service.alive():
                    raise RuntimeError(f"service did not start\n{service.log_tail()}")
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            idle = await sample_rss(service.pid, 3.0)
            print(f"idle: {idle / MB:.1f} MB; producing {jobs} jobs", file=sys.stderr)
            await produce(settings, (job(i, batch=i % 2 == 1) for i in range(jobs)))
            deadline = time.monotonic() + 180
            count = 0
            while time.monotonic() < deadline:
                count = await held(settings)
                if count >= max_inflight * 0.98:
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)  # settle: the held jobs are parsed and windowed by now
            at_backlog = await sample_rss(service.pid, 5.0)
            count = await held(settings)
        finally:
            service.kill()
    return {
        "jobs": jobs,
        "max_inflight": max_inflight,
        "held": count,
        "idle_rss_mb": round(idle / MB, 1),
        "backlog_rss_mb": round(at_backlog / MB, 1),
        "bytes_per_held_job": round((at_backlog - idle) / max(count, 1)),
        "log": str(service.log_path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--max-inflight", type=int, default=10_000)
    add_save_option(parser)
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    workdir = Path(tempfile.mkdtemp(prefix="memory-bench-"))
    report = asyncio.run(bench(bootstrap, args.jobs, args.max_inflight, workdir))
    emit_report(report, args.save, name="memory_bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
