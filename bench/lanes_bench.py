"""Lanes benchmark: interactive job latency behind a bulk backlog, with and without lanes.

    .venv/bin/python bench/lanes_bench.py [--bulk 5000] [--interactive 100] [--rate 2]
                                          [--limiter fixed|aimd|aimd-loss-only|gradient|default]
                                          [--lanes-only] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout; progress goes to stderr. The service (`run_service`, in this process) runs against
the simulator (in a thread) with `capacity` 4 and 200 ms answers; every job is unbatched; the
tier's limiter is fixed at the simulator's capacity (`--limiter fixed`, the default), so
requests wait for their slot in the service (where lanes order them), not in the provider's
queue; `--limiter aimd` or `gradient` (initial 4, max 16) shows whether the limiter itself
finds that capacity: every request it admits past it waits in the simulator's queue, where no
lane can reorder it (`aimd-loss-only`: AIMD with `rtt_tolerance: null`, stopped by 429s and
timeouts only; `default`: the tier names no limiter, so AIMD with initial 4 and max 256).

Runs, each with fresh topics and group:
  idle            the interactive jobs at `--rate`/s on an empty service;
  loaded_lanes    `--bulk` jobs queued on the bulk lane, then 5 s later the same interactive
                  jobs on the interactive lane;
  loaded_no_lanes the same, both kinds on the one jobs topic (no `lanes`);
  bulk_lanes / bulk_no_lanes   the bulk jobs alone, through lanes and without: throughput.
A job's latency is its result record's timestamp minus the moment its producer had it acked.
Targets: loaded_lanes p99 <= 2 x idle p99 + one provider latency; bulk throughput with lanes
>= 0.95 of the single-lane run; no interactive job lost or dead-lettered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumer.app import Service, run_service
from consumer.kafka.admin import ensure_topics
from consumer.settings import Settings, parse_tier_file
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.simulator import SimulatorConfig, run_simulator

LATENCY_MS = 200
CAPACITY = 4
LOAD_DELAY_S = 5.0


def _progress(message: str, *args: Any) -> None:
    print(message % args, file=sys.stderr, flush=True)


def fresh_settings(bootstrap: str) -> Settings:
    sfx = uuid.uuid4().hex[:8]
    return Settings(
        kafka_bootstrap_servers=bootstrap,
        group_id=f"lanes-bench-{sfx}",
        jobs_topic=f"lb-jobs-{sfx}",
        results_topic=f"lb-results-{sfx}",
        dlq_topic=f"lb-dlq-{sfx}",
        batches_topic=f"lb-batches-{sfx}",
        stats_topic=f"lb-stats-{sfx}",
        batching_topic=f"lb-batching-{sfx}",
        quotas_topic=f"lb-quotas-{sfx}",
    )


#: the `--limiter` choices: fixed at the simulator's capacity, or an adaptive one from it
LIMITERS: dict[str, dict[str, Any]] = {
    "fixed": {"algorithm": "fixed", "initial": CAPACITY, "min": 1, "max": CAPACITY},
    "aimd": {"algorithm": "aimd", "initial": CAPACITY, "min": 1, "max": 4 * CAPACITY},
    # AIMD that only 429s, overloads and timeouts stop (latency ignored)
    "aimd-loss-only": {
        "algorithm": "aimd", "initial": CAPACITY, "min": 1, "max": 4 * CAPACITY, "rtt_tolerance": None
    },
    "gradient": {"algorithm": "gradient", "initial": CAPACITY, "min": 1, "max": 4 * CAPACITY},
    # the tier names no limiter: the default (AIMD, initial 4, max 256)
    "default": {},
}


def tier_file(base_url: str, settings: Settings, *, lanes: bool, limiter: str = "fixed") -> dict[str, Any]:
    data: dict[str, Any] = {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": 600,
                **({"limiter": LIMITERS[limiter]} if LIMITERS[limiter] else {}),
            }
        }
    }
    if lanes:
        data["lanes"] = {
            "interactive": {"topic": settings.jobs_topic + ".interactive", "max_wait_ms": 50},
            "bulk": {"topic": settings.jobs_topic + ".bulk", "min_share": 0.1},
        }
    return data


def make_job(kind: str, i: int) -> dict[str, Any]:
    return {
        "id": f"{kind}-{i}",
        "tier": "small",
        "prompt": "Classify the sentiment of the text.\nTEXT:\n${text}",
        "variables": {"text": f"{kind} text number {i}"},
    }


async def produce_all(producer: AIOKafkaProducer, topic: str, jobs: list[dict[str, Any]]) -> None:
    pending = [await producer.send(topic, orjson.dumps(j), key=j["id"].encode()) for j in jobs]
    await asyncio.gather(*pending)


async def produce_paced(
    producer: AIOKafkaProducer, topic: str, jobs: list[dict[str, Any]], rate_per_s: float
) -> dict[str, float]:
    """Send one job every 1/rate s; return each id's acked wall time (ms)."""
    sent: dict[str, float] = {}
    start = time.monotonic()
    for n, j in enumerate(jobs):
        await asyncio.sleep(max(0.0, start + n / rate_per_s - time.monotonic()))
        await (await producer.send(topic, orjson.dumps(j), key=j["id"].encode()))
        sent[j["id"]] = time.time() * 1000.0
    return sent


async def read_outcomes(settings: Settings, want: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Result and dead-letter records of the ids in `want` (value and the record's timestamp)."""
    consumer = AIOKafkaConsumer(
        settings.results_topic,
        settings.dlq_topic,
        bootstrap_servers=settings.kafka_bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    out: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not want <= set(out):
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batches.items():
                for r in records:
                    value = orjson.loads(r.value)
                    if value.get("id") in want:
                        out[value["id"]] = {
                            "ts_ms": r.timestamp,
                            "dead": tp.topic == settings.dlq_topic,
                            **value,
                        }
    finally:
        await consumer.stop()
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Running:
    """The service running in this loop until `stop`."""

    def __init__(self, settings: Settings, tiers: dict[str, Any]) -> None:
        self.settings = settings
        self.tier_file = parse_tier_file(tiers)
        self.stop = asyncio.Event()
        self.service: Service | None = None
        self.task: asyncio.Task[int] | None = None

    def _started(self, service: Service) -> None:
        self.service = service

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(
            run_service(
                self.settings,
                self.tier_file,
                stop=self.stop,
                install_signal_handlers=False,
                on_started=self._started,
            )
        )
        while self.service is None or not self.service.pipeline.ready.is_set():
            if self.task.done():
                self.task.result()
                raise RuntimeError("the service exited during start")
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, timeout=120)


async def latency_run(
    bootstrap: str,
    base_url: str,
    *,
    lanes: bool,
    bulk: int,
    interactive: int,
    rate: float,
    limiter: str = "fixed",
) -> dict[str, Any]:
    settings = fresh_settings(bootstrap)
    tiers = tier_file(base_url, settings, lanes=lanes, limiter=limiter)
    lane_list = parse_tier_file(tiers).lane_list(settings.jobs_topic, settings.max_inflight)
    topics = {lane.name: lane.topic for lane in lane_list}
    await ensure_topics(settings, lane_topics=list(topics.values()))
    int_topic = topics.get("interactive", settings.jobs_topic)
    bulk_topic = topics.get("bulk", settings.jobs_topic)
    bulk_jobs = [make_job("bulk", i) for i in range(bulk)]
    jobs = [make_job("int", i) for i in range(interactive)]
    sent, outcomes = await backlog_then_paced(
        settings, tiers, (bulk_topic, bulk_jobs), (int_topic, jobs), rate_per_s=rate
    )
    figures = latency_figures(sent, outcomes)
    return {"lanes": lanes, "bulk_queued": bulk, "interactive": interactive, **figures}


async def backlog_then_paced(
    settings: Settings,
    tiers: dict[str, Any],
    backlog: tuple[str, list[dict[str, Any]]],
    paced: tuple[str, list[dict[str, Any]]],
    *,
    rate_per_s: float,
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """The `backlog` jobs queued on their topic, the service started, LOAD_DELAY_S later the
    `paced` jobs at `rate_per_s` on theirs: each paced job's ack time and outcome."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=5)
    await producer.start()
    try:
        (backlog_topic, backlog_jobs), (paced_topic, paced_jobs) = backlog, paced
        if backlog_jobs:
            await produce_all(producer, backlog_topic, backlog_jobs)
        async with Running(settings, tiers):
            if backlog_jobs:
                await asyncio.sleep(LOAD_DELAY_S)
            sent = await produce_paced(producer, paced_topic, paced_jobs, rate_per_s)
            backlog_s = len(backlog_jobs) * LATENCY_MS / 1000.0 / CAPACITY
            outcomes = await read_outcomes(settings, set(sent), timeout_s=120 + 3 * backlog_s)
    finally:
        await producer.stop()
    return sent, outcomes


def latency_figures(sent: dict[str, float], outcomes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The paced jobs' outcomes counted and their latencies (result timestamp minus ack)."""
    latencies = [(outcomes[i]["ts_ms"] - sent[i]) / 1000.0 for i in sent if i in outcomes]
    return {
        "answered": sum(1 for o in outcomes.values() if not o["dead"]),
        "dead_lettered": sum(1 for o in outcomes.values() if o["dead"]),
        "lost": len(set(sent) - set(outcomes)),
        "p50_s": round(_pct(latencies, 0.5), 3) if latencies else None,
        "p99_s": round(_pct(latencies, 0.99), 3) if latencies else None,
        "max_s": round(max(latencies), 3) if latencies else None,
        "mean_s": round(statistics.fmean(latencies), 3) if latencies else None,
    }


async def bulk_run(
    bootstrap: str, base_url: str, *, lanes: bool, bulk: int, limiter: str = "fixed"
) -> dict[str, Any]:
    settings = fresh_settings(bootstrap)
    tiers = tier_file(base_url, settings, lanes=lanes, limiter=limiter)
    lane_list = parse_tier_file(tiers).lane_list(settings.jobs_topic, settings.max_inflight)
    topics = {lane.name: lane.topic for lane in lane_list}
    await ensure_topics(settings, lane_topics=list(topics.values()))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    jobs = [make_job("bulk", i) for i in range(bulk)]
    try:
        await produce_all(producer, topics.get("bulk", settings.jobs_topic), jobs)
    finally:
        await producer.stop()
    async with Running(settings, tiers):
        outcomes = await read_outcomes(
            settings, {j["id"] for j in jobs}, timeout_s=120 + 3 * bulk * LATENCY_MS / 1000.0 / CAPACITY
        )
    stamps = sorted(o["ts_ms"] for o in outcomes.values())
    span_s = (stamps[-1] - stamps[0]) / 1000.0 if len(stamps) > 1 else 0.0
    return {
        "lanes": lanes,
        "jobs": bulk,
        "answered": len(outcomes),
        "span_s": round(span_s, 3),
        "jobs_per_s": round((len(stamps) - 1) / span_s, 2) if span_s > 0 else None,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    config = SimulatorConfig(latency_ms=LATENCY_MS, capacity=CAPACITY, seed=3)
    result: dict[str, Any] = {
        "simulator": {"latency_ms": LATENCY_MS, "capacity": CAPACITY},
        "limiter": LIMITERS[args.limiter],
        "interactive_rate_per_s": args.rate,
    }
    with run_simulator(config) as base_url:
        common = {"interactive": args.interactive, "rate": args.rate, "limiter": args.limiter}
        _progress("idle: %d interactive jobs at %.1f/s", args.interactive, args.rate)
        result["idle"] = await latency_run(bootstrap, base_url, lanes=True, bulk=0, **common)
        _progress("loaded, lanes: %d bulk queued", args.bulk)
        result["loaded_lanes"] = await latency_run(bootstrap, base_url, lanes=True, bulk=args.bulk, **common)
        if not args.lanes_only:
            _progress("loaded, no lanes: %d bulk queued", args.bulk)
            result["loaded_no_lanes"] = await latency_run(
                bootstrap, base_url, lanes=False, bulk=args.bulk, **common
            )
            _progress("bulk alone through lanes and without")
            result["bulk_lanes"] = await bulk_run(
                bootstrap, base_url, lanes=True, bulk=args.bulk, limiter=args.limiter
            )
            result["bulk_no_lanes"] = await bulk_run(
                bootstrap, base_url, lanes=False, bulk=args.bulk, limiter=args.limiter
            )
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets of the runs in `result` (the throughput ones only when the bulk runs ran)."""
    idle_p99, loaded_p99 = result["idle"]["p99_s"], result["loaded_lanes"]["p99_s"]
    target = 2 * idle_p99 + LATENCY_MS / 1000.0 if idle_p99 is not None else None
    met: dict[str, Any] = {
        "loaded_p99_limit_s": round(target, 3) if target is not None else None,
        "loaded_p99_met": target is not None and loaded_p99 is not None and loaded_p99 <= target,
        "no_interactive_lost": all(
            result[k]["lost"] == 0 and result[k]["dead_lettered"] == 0
            for k in ("idle", "loaded_lanes", "loaded_no_lanes")
            if k in result
        ),
    }
    if "bulk_lanes" in result:
        with_lanes, without = result["bulk_lanes"]["jobs_per_s"], result["bulk_no_lanes"]["jobs_per_s"]
        ratio = round(with_lanes / without, 3) if with_lanes and without else None
        met["bulk_throughput_ratio"] = ratio
        met["bulk_throughput_met"] = ratio is not None and ratio >= 0.95
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bulk", type=int, default=5000, help="bulk jobs queued (default 5000)")
    parser.add_argument("--interactive", type=int, default=100, help="interactive jobs (default 100)")
    parser.add_argument("--rate", type=float, default=2.0, help="interactive jobs per second (default 2)")
    parser.add_argument(
        "--limiter", choices=sorted(LIMITERS), default="fixed", help="the tier's limiter (default fixed)"
    )
    parser.add_argument(
        "--lanes-only",
        action="store_true",
        help="only the idle and loaded-with-lanes runs (no single-topic run, no throughput runs)",
    )
    add_save_option(parser)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    emit_report(result, args.save, name="lanes_bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
