"""What tracing costs the service: the same jobs with tracing off and exporting over OTLP.

    .venv/bin/python bench/telemetry_bench.py [--jobs 20000] [--repeats 3] [--workloads batched,mixed]
        [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout (`--save`: also bench/results/telemetry_bench.json); progress goes to stderr.

Per workload (`batched`: every job `batch: true`, max_items 20; `mixed`: every other one),
N short classification jobs are produced once; then, each run with its own consumer group
and output topics, the service (`run_service` in this process) answers them with the
in-memory `FakeProvider` (no HTTP: what is measured is the service's own cost, where
tracing's share is largest):

    off     no exporter configured (the default): every telemetry call returns at once
    otlp    OTEL_TRACES_EXPORTER=otlp to an OTLP/HTTP receiver in a process of its own
            (`python -m consumer.testing.otlp`, counting what it decodes): spans made,
            batched, protobuf-encoded and posted, as in production
    sampled the same with OTEL_TRACES_SAMPLER=parentbased_traceidratio at 0.1: one trace in
            ten is recorded (the jobs carry no traceparent, so each job's span decides)

Before the runs, `off_calls` times (timeit, best of 5) what tracing off leaves on the hot path:
the telemetry calls of one job (start, traceparent, end with its outcome record) and the
wrapper of one provider call of a 20-job request, in nanoseconds.

Variants run `--repeats` times, interleaved (off, otlp, sampled, off, ...), so drifts in the
machine's load hit all alike. Reported per variant: items/s from the output records' Kafka
timestamps (pipeline_bench's measure; medians) and the process CPU per job in microseconds
(the exporter's thread included), and each traced variant's ratios to `off`. The receiver's span count
checks that the export really ran (each job has a `process` and a `send` span, each provider
call one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

# run as a script, this file's directory is importable: the workloads and runs are pipeline_bench's
from pipeline_bench import (
    TIER,
    WORKLOADS,
    _progress,
    fake_answer,
    make_jobs,
    service_run,
    tier_dict,
)

from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.jobs import decode_job
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import submit_jobs
from consumer.kafka.intake import InRecord
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime.heap import tune_gc
from consumer.settings import Settings
from consumer.telemetry import Telemetry
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import service_env, settings_from_env
from consumer.testing.paths import REPO_ROOT

VARIANTS = ("off", "otlp", "sampled")
#: the sampled variant's share of new traces (OTEL_TRACES_SAMPLER=parentbased_traceidratio)
SAMPLED_SHARE = 0.1


class Receiver:
    """The counting OTLP receiver in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumer.testing.otlp"], stdout=subprocess.PIPE, cwd=REPO_ROOT, text=True
        )
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://127.0.0.1:"):
            self.proc.kill()
            raise RuntimeError("the OTLP receiver did not start")

    def spans(self) -> int:
        return int(httpx.get(self.endpoint + "/_counts", timeout=5).json()["spans"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def tracing_env(variant: str, endpoint: str) -> Iterator[None]:
    """OTEL_* set for one run (the service reads them at start), restored after."""
    names = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        # a queue that holds a run's spans: none is dropped, so every one is encoded and sent
        "OTEL_BSP_MAX_QUEUE_SIZE": "200000",
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    if variant == "sampled":
        names["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        names["OTEL_TRACES_SAMPLER_ARG"] = str(SAMPLED_SHARE)
    saved = {k: os.environ.get(k) for k in (*names, "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")}
    if variant != "off":
        os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def one_run(
    base: Settings, variant: str, n: int, timeout_s: float, receiver: Receiver
) -> dict[str, Any]:
    fake = FakeProvider(fake_answer, name="openai_compat")
    tiers = tier_dict("http://127.0.0.1:9/v1", batching=True)
    spans_before = receiver.spans()
    cpu_s = time.process_time()
    with tracing_env(variant, receiver.endpoint):
        res, _ = await service_run(base, variant, tiers, n, timeout_s, providers={TIER: fake})
    res["cpu_us_per_job"] = round((time.process_time() - cpu_s) / max(res["items"], 1) * 1e6, 1)
    res["spans_exported"] = receiver.spans() - spans_before  # the service flushed them as it stopped
    return res


async def workload_runs(
    args: argparse.Namespace, base: Settings, workload: str, receiver: Receiver
) -> dict[str, Any]:
    n = args.jobs
    base = base.model_copy(update={"jobs_topic": f"bench-tel-{workload}-{uuid.uuid4().hex[:6]}"})
    await ensure_topics(base)
    jobs = make_jobs(n, batched_share=WORKLOADS[workload])
    encoded = (orjson.dumps(j) for j in jobs)
    await submit_jobs(base, encoded, key_of=lambda v: orjson.loads(v)["id"].encode())
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for rep in range(args.repeats):
        for variant in VARIANTS:
            res = await one_run(base, variant, n, args.variant_timeout_s, receiver)
            _progress("telemetry %s %s #%d: %s", workload, variant, rep + 1, res)
            runs[variant].append(res)
    out: dict[str, Any] = {"jobs": n, "batched_share": WORKLOADS[workload]}
    for variant, results in runs.items():
        out[variant] = {
            "items_per_s_median": statistics.median(r["items_per_s"] for r in results),
            "items_per_s_runs": [r["items_per_s"] for r in results],
            "cpu_us_per_job_median": statistics.median(r["cpu_us_per_job"] for r in results),
            "cpu_us_per_job_runs": [r["cpu_us_per_job"] for r in results],
            "spans_exported_runs": [r["spans_exported"] for r in results],
            "provider_requests": results[-1]["provider_requests"],
        }
    off = out["off"]
    for variant in VARIANTS[1:]:
        traced = out[variant]
        for measure in ("items_per_s", "cpu_us_per_job"):
            ratio = traced[f"{measure}_median"] / off[f"{measure}_median"]
            out[f"{variant}_vs_off_{measure}"] = round(ratio, 3)
    return out


def off_calls() -> dict[str, float]:
    """ns per job and per provider call of the telemetry calls while tracing is off."""
    telemetry = Telemetry.disabled()
    job = decode_job(orjson.dumps(make_jobs(1, batched_share=1.0)[0]))
    record = InRecord(SourceOffset(TopicPartition("jobs", 0), 1), b"job-0", b"{}", (), 0)
    outcome = OutRecord("results", b"job-0", b"{}")
    request = CompletionRequest((ChatMessage("user", "hi"),), "sim-model")
    answer = text_completion("positive")
    target = telemetry.call_target(TIER, "openai_compat", "http://127.0.0.1:9/v1")
    traces = [None] * 20

    def one_job() -> None:
        span = telemetry.start_job(job, record)
        telemetry.traceparent(span)
        telemetry.end_job(span, outcome, error=None)

    def one_call() -> None:
        with telemetry.provider_call(target, request, traces) as call:
            call.answered(answer)

    number = 100_000
    return {
        name: round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9, 1)
        for name, fn in (("ns_per_job", one_job), ("ns_per_provider_call", one_call))
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tune_gc()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    base = settings_from_env(service_env(bootstrap, partitions=4, PROMPTBUS_SHUTDOWN_TIMEOUT_S="30"))
    result: dict[str, Any] = {
        "bench": "telemetry_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    result["off_calls"] = off_calls()
    receiver = Receiver()
    t0 = time.monotonic()
    try:
        for workload in args.workloads:
            result[workload] = await workload_runs(args, base, workload, receiver)
    finally:
        receiver.stop()
    result["repeats"] = args.repeats
    result["bench_s"] = round(time.monotonic() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20000, help="jobs per workload")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant, interleaved")
    parser.add_argument("--workloads", default="batched,mixed", help="comma list: batched, mixed")
    parser.add_argument("--variant-timeout-s", type=float, default=180.0, help="bound of one run")
    add_save_option(parser)
    args = parser.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip() in WORKLOADS]
    emit_report(asyncio.run(main_async(args)), args.save, name="telemetry_bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
