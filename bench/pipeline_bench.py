"""Service benchmarks: throughput vs raw aiokafka, and the limiter vs a provider ceiling.

    .venv/bin/python bench/pipeline_bench.py [--quick] [--jobs 50000] [--repeats 3] [--plot] [--profile]
        [--spy] [--variants raw,sim,fake,sdk,fake@max_inflight=2000,fake@gc=default] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092; `deploy/kafka-local/kafka
start`). Prints one JSON object on stdout; progress goes to stderr.

1. Throughput. Per workload (`batched`: every job `batch: true`; `mixed`: every other one;
   `unbatched`: none, `--unbatched-jobs` of them; max_items 20, short classification inputs),
   N jobs are produced once to a fresh 4-partition jobs topic. Then, each run with its own
   consumer group and output topic:
     raw        a plain aiokafka loop: getmany -> each message produced as it is (key and
                value) to another topic (same producer settings as the service: acks=all,
                idempotent, linger 5 ms) -> wait for the acks -> commit: the floor cost of
                consuming and producing these messages;
     sim        the service (`run_service`, in this process) against the simulator with no
                latency, run as a separate process (`python -m consumer.cli simulate`) so
                it has the other core;
     fake       the service with the in-memory `FakeProvider` (no HTTP): the service's own
                cost;
     sdk        (unbatched only) the consumer a user writes by hand: aiokafka reads a batch,
                the official openai SDK asks each job with 16 requests in flight against the
                same simulator, each answer produced as a result, the batch committed.
   Each variant runs `--repeats` times, interleaved (raw, sim, fake, raw, ...), so drifts in
   the machine's load hit all of them alike; the medians are compared. Items/s is counted
   from the output records' own Kafka timestamps (first to last), so start-up and group join
   are left out of every variant alike; `wall_s` (join included) is printed next to it.
   Each run also prints this process's CPU time per outcome (the service's, or the loop's; not
   the simulator's, which `simulator.cpu_us_per_job` gives): `cpu_us_per_item` between 10% and
   90% of the run's outcomes (the steady state), `cpu_us_per_job` over the whole run (start-up
   and group join included). Each service run also prints `commits_per_1k_items`: input offset commits per
   1,000 outcomes (at_least_once commits as acks arrive, gathered for a few ms), what
   committing early costs per job.
   A variant may change one thing of the service, `VARIANT@KEY=VALUE`, and runs interleaved
   with the others: `KEY` a setting (`fake@max_inflight=2000`: PROMPTBUS_MAX_INFLIGHT 2,000),
   or `gc=default` (CPython's own GC settings: once the service has started, which applied
   `tune_gc`, the heap is unfrozen and the young generation's threshold set back).
   `ratio_vs_raw` = median items/s / raw's median (target >= 0.6). The process runs with the
   service's GC settings (`consumer.runtime.heap.tune_gc`) for every variant. N must be well above the
   service's max_inflight (10,000) to measure a steady state: with N = 20,000 half the input
   sat in memory while the output was timed, and the ratios read too high.
2. Limiter vs ceiling. The simulator has `capacity` (requests served at once; more queue),
   `latency_ms` and a rate limit of `rpm` requests per minute as a token bucket, the way
   OpenAI and Anthropic enforce theirs: it holds rpm/60*window requests and refills
   continuously over `rate_window_s` (full at the start); an empty bucket answers 429 +
   Retry-After (the time until one request fits); every answer says what remains and when
   the bucket is full again. The ceiling is min(rpm/60, capacity*1000/latency_ms) requests/s.
   A scenario with `tpm` limits tokens the same way (each request costs its input + output
   tokens, ~len/4 each); its ceiling is tpm/60 over one request's tokens (measured with one
   call before the run).
   The same unbatched jobs go through
     service    the service with its AIMD limiter (tier limiter aimd, initial 4, max 64),
                which paces admissions by mirrors of the provider's buckets kept from those
                headers (`consumer.core.pacing`);
     fixed16    16 workers calling the tier's adapter (`build_provider`) directly, honouring
                Retry-After on 429;
     await_each one call at a time, same adapter and retry handling.
   The simulator's own counters (`/_sim/stats`, sampled every 0.1 s) give the request rate
   in the steady part of the run (from 10% to 90% of the jobs answered) and the 429 share
   of all requests the variant sent. Targets: service rate >= 95% of the ceiling and 429
   share <= 3%.

`--profile` also runs the `fake` variant under cProfile and prints the top functions by own
time in microseconds per job; `--spy` runs it once more under py-spy, a sampling profiler that
does not slow the calls it measures (cProfile slows short calls most), and prints the top
functions by their share of its samples (`consumer.testing.sampling`; the samples are kept in
bench/out/spy-fake-WORKLOAD.txt). `--plot` draws bench/out/pipeline_bench.png. `--save` also writes
the JSON report to bench/results/ (default name: pipeline_bench_ and the parts run, e.g.
pipeline_bench_throughput.json); with `--plot`, the plot is copied beside it (same name, .png).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import logging
import os
import platform
import pstats
import random
import shutil
import statistics
import string
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from consumer.core.completion import ChatMessage, Completion, CompletionRequest
from consumer.core.errors import ProviderError
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import submit_jobs
from consumer.kafka.connection import client_kwargs
from consumer.kafka.sink import kafka_producer_factory
from consumer.providers.factory import build_provider, make_http_client
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime import eventloop
from consumer.runtime.heap import tune_gc
from consumer.settings import Settings, TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import InProcessService, service_env, settings_from_env
from consumer.testing.paths import PROMPTBUS, REPO_ROOT
from consumer.testing.ports import free_port

log = logging.getLogger(__name__)

PROMPT = "Classify the sentiment of the text.\nTEXT:\n${text}"
WORDS = "good bad slow fast cold warm fine rude kind late early cheap dear clean loud calm".split()
#: the tier name every variant uses
TIER = "small"
#: simulator counters are sampled this often during limiter runs
SAMPLE_INTERVAL_S = 0.1
#: CPython's own GC thresholds, read before anything here changes them (`fake@gc=default`)
CPYTHON_GC_THRESHOLD = gc.get_threshold()


def _progress(message: str, *args: Any) -> None:
    print(
        f"[{time.strftime('%H:%M:%S')}] " + (message % args if args else message), file=sys.stderr, flush=True
    )


# ----------------------------------------------------------------------------------------------
# jobs and tiers


def make_jobs(n: int, *, batched_share: float, seed: int = 1) -> list[dict[str, Any]]:
    """n classification jobs with short (~30 character) inputs; every 1/batched_share-th is batch: true."""
    rng = random.Random(seed)
    every = round(1 / batched_share) if batched_share > 0 else 0
    jobs = []
    for i in range(n):
        text = f"{i} " + " ".join(rng.choice(WORDS) for _ in range(5))
        jobs.append(
            {
                "id": f"job-{i}",
                "tier": TIER,
                "prompt": PROMPT,
                "variables": {"text": text},
                "options": {"max_tokens": 16},
                "batch": bool(every) and i % every == 0,
            }
        )
    return jobs


def tier_dict(base_url: str, *, batching: bool, max_items: int = 20) -> dict[str, Any]:
    """The tier file every service variant runs with (DESIGN.md defaults where not stated)."""
    return {
        "tiers": {
            TIER: {
                "provider": "openai_compat",
                "base_url": base_url,
                "model": "sim-model",
                "timeout_s": 10,
                "batching": {
                    "enabled": batching,
                    "max_items": max_items,
                    "window_ms": 100,
                    "max_wait_ms": 2000,
                },
                "limiter": {"algorithm": "aimd", "initial": 4, "min": 1, "max": 64},
                "retry": {"max_attempts": 10, "backoff_initial_s": 0.5, "backoff_max_s": 10},
            }
        }
    }


def fake_answer(request: CompletionRequest) -> Completion:
    """An answer of the right shape at almost no cost (the fake variant times the service, not
    a provider): a packed prompt, whose items line is its last, gets every alias answered;
    any other prompt one word."""
    last_line = request.messages[-1].content.rpartition("\n")[2]
    if not last_line.startswith("[{"):
        return text_completion(FAKE_OUTPUT)
    answers = {item["id"]: FAKE_OUTPUT for item in orjson.loads(last_line)}
    return text_completion(orjson.dumps(answers).decode())


#: what the fake provider answers for every input
FAKE_OUTPUT = "positive"


def request_for(job: dict[str, Any], model: str) -> CompletionRequest:
    """The ordinary request the service sends for an unbatched prompt job."""
    rendered = job["prompt"].replace("${text}", job["variables"]["text"])
    return CompletionRequest((ChatMessage("user", rendered),), model, dict(job.get("options") or {}))


# ----------------------------------------------------------------------------------------------
# simulator process


def _spawn(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)


class SimProcess:
    """`python -m consumer.cli simulate` in its own process (so it runs on the other core)."""

    def __init__(self, faults: dict[str, Any], log_path: Path, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.faults = faults
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.AsyncClient(timeout=5)

    async def __aenter__(self) -> SimProcess:
        text = ",".join(f"{k}={v}" for k, v in self.faults.items())
        argv = [*PROMPTBUS, "simulate", "--port", str(self.port)]
        if text:
            argv += ["--faults", text]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = _spawn(argv, self.log_path)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {self.proc.returncode}; see {self.log_path}")
            with contextlib.suppress(httpx.HTTPError):
                await self.stats()
                return self
            await asyncio.sleep(0.1)
        raise TimeoutError("simulator did not answer within 30 s")

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def cpu_s(self) -> float:
        """CPU seconds the simulator process has used (user + system, from /proc)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def stats(self) -> dict[str, Any]:
        r = await self.client.get(f"{self.base}/_sim/stats")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    async def reset(self) -> None:
        (await self.client.post(f"{self.base}/_sim/reset")).raise_for_status()

    async def configure(self, **knobs: Any) -> None:
        (await self.client.post(f"{self.base}/_sim/config", json=knobs)).raise_for_status()


# ----------------------------------------------------------------------------------------------
# variants

#: the kinds of throughput variant (module docstring)
KINDS = ("raw", "sim", "fake", "sdk")


@dataclass(frozen=True)
class Variant:
    """A throughput variant: its kind and at most one change to the service (`KIND@KEY=VALUE`)."""

    label: str
    kind: str
    #: Settings fields changed for this variant's service
    settings: dict[str, Any] = field(default_factory=dict)
    #: run the service under CPython's own GC settings instead of `tune_gc`'s
    gc_default: bool = False


def parse_variant(label: str) -> Variant:
    """`fake`, `fake@max_inflight=2000`, `sim@gc=default`; ValueError naming what is wrong."""
    kind, _, change = label.partition("@")
    if kind not in KINDS:
        raise ValueError(f"variant {label!r}: the kind must be one of {', '.join(KINDS)}")
    if not change:
        return Variant(label, kind)
    if kind in ("raw", "sdk"):
        raise ValueError(f"variant {label!r}: {kind} runs no service to change")
    key, _, value = change.partition("=")
    if key == "gc":
        if value != "default":
            raise ValueError(f"variant {label!r}: gc takes only 'default'")
        return Variant(label, kind, gc_default=True)
    if key not in Settings.model_fields:
        raise ValueError(f"variant {label!r}: {key!r} is not a setting")
    try:  # read as the environment variable would be
        typed = getattr(settings_from_env({f"PROMPTBUS_{key.upper()}": value}), key)
    except ValidationError as exc:
        raise ValueError(f"variant {label!r}: {exc.errors()[0]['msg']}") from None
    return Variant(label, kind, settings={key: typed})


def use_cpython_gc() -> None:
    """CPython's own GC settings, undoing `tune_gc` (which the service applied at start)."""
    gc.unfreeze()
    gc.set_threshold(*CPYTHON_GC_THRESHOLD)


@dataclass
class CpuMeter:
    """This process's CPU time against outcomes counted, sampled as a run polls: CPU per
    outcome between 10% and 90% of the run's outcomes (start-up and drain left out, as the
    items/s from output timestamps leave them out)."""

    total: int
    samples: list[tuple[float, int]] = field(default_factory=list)

    def mark(self, done: int) -> None:
        self.samples.append((time.process_time(), done))

    def us_per_item(self) -> float | None:
        low = [s for s in self.samples if s[1] >= 0.1 * self.total]
        high = [s for s in low if s[1] >= 0.9 * self.total]
        if not low or not high or high[0][1] <= low[0][1]:
            return None
        (cpu0, done0), (cpu1, done1) = low[0], high[0]
        return round((cpu1 - cpu0) / (done1 - done0) * 1e6, 1)


# ----------------------------------------------------------------------------------------------
# Kafka helpers


def variant_settings(base: Settings, name: str, changes: dict[str, Any] | None = None) -> Settings:
    """Same jobs topic, its own group and output topics (a variant reads every job afresh);
    `changes`: the variant's own settings (`parse_variant` validated them)."""
    sfx = uuid.uuid4().hex[:6]
    name = name.split("@")[0]
    return base.model_copy(
        update={
            **(changes or {}),
            "group_id": f"bench-{name}-{sfx}",
            "results_topic": f"bench-{name}-results-{sfx}",
            "dlq_topic": f"bench-{name}-dlq-{sfx}",
            "stats_topic": f"bench-{name}-stats-{sfx}",
            "batching_topic": f"bench-{name}-batching-{sfx}",
            "batches_topic": f"bench-{name}-batches-{sfx}",
            "quotas_topic": f"bench-{name}-quotas-{sfx}",
        }
    )


async def record_timestamps_ms(settings: Settings, topic: str) -> list[int]:
    """The Kafka timestamps of every record in `topic` (read without a group)."""
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        stamps: list[int] = []
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                stamps.extend(r.timestamp for r in records)
        return stamps
    finally:
        await consumer.stop()


def rate_from_stamps(stamps: list[int]) -> tuple[float, float]:
    """(span_s, items/s) from output timestamps: n-1 intervals over first..last."""
    if len(stamps) < 2:
        return 0.0, 0.0
    span_s = (max(stamps) - min(stamps)) / 1000.0
    return span_s, (len(stamps) - 1) / span_s if span_s > 0 else float("inf")


# ----------------------------------------------------------------------------------------------
# throughput


async def raw_loop(base: Settings, n: int, timeout_s: float) -> dict[str, Any]:
    """Consume the jobs topic in a group, produce each message as it is to another topic, wait
    for the acks, commit: the floor cost of moving these messages through Kafka."""
    settings = variant_settings(base, "raw")
    await ensure_topics(settings)
    out_topic = settings.results_topic
    consumer = AIOKafkaConsumer(
        settings.jobs_topic,
        group_id=settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **client_kwargs(settings),
    )
    producer = kafka_producer_factory(settings, client_id="bench-raw")(transactional_id=None)
    await producer.start()
    await consumer.start()
    t0 = time.monotonic()
    cpu = CpuMeter(n)
    done = 0
    try:
        while done < n and time.monotonic() - t0 < timeout_s:
            batches = await consumer.getmany(timeout_ms=50, max_records=500)
            futures = []
            for records in batches.values():
                for r in records:
                    futures.append(await producer.send(out_topic, r.value, key=r.key))
            if futures:
                await asyncio.gather(*futures)
                await consumer.commit()
                done += len(futures)
                cpu.mark(done)
        wall_s = time.monotonic() - t0
    finally:
        await consumer.stop()
        await producer.stop()
    stamps = await record_timestamps_ms(settings, out_topic)
    span_s, rate = rate_from_stamps(stamps)
    return {
        "items": len(stamps),
        "span_s": round(span_s, 3),
        "items_per_s": round(rate, 1),
        "wall_s": round(wall_s, 3),
        "cpu_us_per_item": cpu.us_per_item(),
    }


async def service_run(
    base: Settings,
    name: str,
    tiers: dict[str, Any],
    n: int,
    timeout_s: float,
    providers: dict[str, Any] | None = None,
    on_running: Callable[[InProcessService], Coroutine[Any, Any, None]] | None = None,
    variant: Variant | None = None,
) -> tuple[dict[str, Any], Settings]:
    """Run the service in this process until n outcomes are out (bounded); rate from result
    stamps. `variant`: its one change to the service (settings, or CPython's GC settings)."""
    settings = variant_settings(base, name, variant.settings if variant else None)
    svc = InProcessService(settings, tiers, providers=providers)
    t0 = time.monotonic()
    try:
        async with svc:
            if variant is not None and variant.gc_default:
                use_cpython_gc()
            watcher = asyncio.create_task(on_running(svc)) if on_running else None
            cpu = CpuMeter(n)
            while time.monotonic() - t0 < timeout_s:
                snap = svc.stats_snapshot()
                done = snap["results"] + sum(snap["dead_letters"].values())
                cpu.mark(done)
                if done >= n:
                    break
                await asyncio.sleep(0.05)
            wall_s = time.monotonic() - t0
            snap = svc.stats_snapshot()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    finally:
        if variant is not None and variant.gc_default:
            tune_gc()  # the next variant runs under the service's settings again
    stamps = await record_timestamps_ms(settings, settings.results_topic)
    span_s, rate = rate_from_stamps(stamps)
    tier = snap["tiers"].get(TIER, {})
    out = {
        "items": len(stamps),
        "span_s": round(span_s, 3),
        "items_per_s": round(rate, 1),
        "wall_s": round(wall_s, 3),
        "cpu_us_per_item": cpu.us_per_item(),
        "dead_letters": snap["dead_letters"],
        "provider_requests": tier.get("provider_requests"),
        "requests_saved": tier.get("requests_saved"),
        "rate_limited": tier.get("rate_limited"),
        "final_limit": tier.get("limit"),
        # what committing costs: commits per 1,000 outcomes (at_least_once commits as acks arrive)
        "commits_per_1k_items": round(1000 * snap.get("commits", 0) / max(len(stamps), 1), 1),
    }
    return out, settings


#: throughput workloads: name -> share of jobs with batch: true
WORKLOADS = {"batched": 1.0, "mixed": 0.5, "unbatched": 0.0}
#: the service against the raw loop, and (unbatched, through the simulator) against `sdk`
TARGET_RATIO = 0.6
TARGET_SDK_RATIO = 8.0
#: functions listed per profile
PROFILE_TOP = 15


async def throughput(args: argparse.Namespace, base: Settings) -> dict[str, Any]:
    """Per workload: the jobs produced once to their own topic, then every variant `repeats`
    times, interleaved (raw, sim, fake, raw, ...) so drifts of the machine's load hit all of
    them alike; medians and their ratios to raw's median (and, unbatched, sim's to sdk's)."""
    out: dict[str, Any] = {"jobs": args.jobs, "max_items": 20, "partitions": 4, "repeats": args.repeats}
    for name in args.workloads:
        n = args.unbatched_jobs if name == "unbatched" else args.jobs
        workload_base = base.model_copy(update={"jobs_topic": f"bench-jobs-{name}-{uuid.uuid4().hex[:6]}"})
        await produce_workload(workload_base, name, n)
        out[name] = await throughput_workload(args, workload_base, name, n)
        if args.profile:
            out[name]["profile_fake"] = await profile_fake(workload_base, n, args.variant_timeout_s)
        if args.spy:
            out[name]["spy_fake"] = await spy_fake(workload_base, n, args.variant_timeout_s, name)
    out["target_ratio"] = TARGET_RATIO
    out["target_sdk_ratio"] = TARGET_SDK_RATIO
    return out


async def produce_workload(base: Settings, workload: str, n: int) -> None:
    """`n` jobs of `workload` (its share batch: true) on `base`'s jobs topic."""
    jobs = make_jobs(n, batched_share=WORKLOADS[workload])
    t0 = time.monotonic()
    await ensure_topics(base)
    sent = await submit_jobs(
        base, (orjson.dumps(j) for j in jobs), key_of=lambda v: orjson.loads(v)["id"].encode()
    )
    _progress("throughput %s: produced %d jobs in %.1fs", workload, sent, time.monotonic() - t0)


async def throughput_workload(
    args: argparse.Namespace, base: Settings, workload: str, n: int
) -> dict[str, Any]:
    timeout_s = args.variant_timeout_s
    variants = [v for v in args.variants if v.kind != "sdk" or workload == "unbatched"]
    runs: dict[str, list[dict[str, Any]]] = {v.label: [] for v in variants}
    async with contextlib.AsyncExitStack() as stack:
        sim = None
        if any(v.kind in ("sim", "sdk") for v in variants):
            sim = await stack.enter_async_context(
                SimProcess({"seed": 1}, REPO_ROOT / f"bench/out/sim-throughput-{workload}.log")
            )
        for rep in range(args.repeats):
            for variant in variants:
                cpu0_s = time.process_time()
                if variant.kind == "raw":
                    res = await raw_loop(base, n, timeout_s)
                elif variant.kind in ("sim", "sdk"):
                    assert sim is not None
                    await sim.reset()
                    sim_cpu0_s = sim.cpu_s()
                    if variant.kind == "sim":
                        tiers = tier_dict(f"{sim.base}/v1", batching=True)
                        res, _ = await service_run(base, variant.label, tiers, n, timeout_s, variant=variant)
                    else:
                        res = await sdk_loop(base, n, timeout_s, f"{sim.base}/v1")
                    sim_stats = await sim.stats()
                    keep = ("requests", "batched_requests", "items_answered", "max_inflight")
                    res["simulator"] = {k: v for k, v in sim_stats.items() if k in keep}
                    res["simulator"]["cpu_us_per_job"] = round(
                        (sim.cpu_s() - sim_cpu0_s) * 1e6 / max(res["items"], 1), 1
                    )
                else:
                    res = await fake_run(base, variant.label, n, timeout_s, variant)
                # this process's CPU (the simulator runs in its own): start-up and join included
                res["cpu_us_per_job"] = round((time.process_time() - cpu0_s) * 1e6 / max(res["items"], 1), 1)
                _progress("throughput %s %s #%d: %s", workload, variant.label, rep + 1, res)
                runs[variant.label].append(res)
    out: dict[str, Any] = {"batched_share": WORKLOADS[workload], "jobs": n}
    for label, results in runs.items():
        rates = [r["items_per_s"] for r in results]
        cpu = [r.get("cpu_us_per_item") for r in results]
        known = [c for c in cpu if c is not None]
        out[label] = {
            "items_per_s_median": round(statistics.median(rates), 1),
            "items_per_s_runs": rates,
            "cpu_us_per_item_median": round(statistics.median(known), 1) if known else None,
            "cpu_us_per_item_runs": cpu,
            "cpu_us_per_job_median": statistics.median(r["cpu_us_per_job"] for r in results),
            "last_run": results[-1],
        }
    raw_rate = out.get("raw", {}).get("items_per_s_median")
    for label in runs:
        if label != "raw" and raw_rate:
            out[label]["ratio_vs_raw"] = round(out[label]["items_per_s_median"] / raw_rate, 3)
    sdk_rate = out.get("sdk", {}).get("items_per_s_median")
    if "sim" in out and sdk_rate:
        out["sim"]["ratio_vs_sdk"] = round(out["sim"]["items_per_s_median"] / sdk_rate, 2)
    return out


async def sdk_loop(base: Settings, n: int, timeout_s: float, base_url: str) -> dict[str, Any]:
    """The consumer a user writes by hand: aiokafka reads a batch of jobs, the official openai
    SDK (`openai.AsyncOpenAI`) asks each job's prompt with 16 requests in flight, each answer is
    produced as a result (same producer settings as the service), and the batch's offsets are
    committed once its results are acknowledged."""
    from openai import AsyncOpenAI

    settings = variant_settings(base, "sdk")
    await ensure_topics(settings)
    out_topic = settings.results_topic
    consumer = AIOKafkaConsumer(
        settings.jobs_topic,
        group_id=settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **client_kwargs(settings),
    )
    producer = kafka_producer_factory(settings, client_id="bench-sdk")(transactional_id=None)
    client = AsyncOpenAI(base_url=base_url, api_key="bench-key", max_retries=5, timeout=10)
    in_flight = asyncio.Semaphore(16)

    async def answer(record: Any) -> asyncio.Future[Any]:
        job = orjson.loads(record.value)
        prompt = string.Template(job["prompt"]).substitute(job["variables"])
        async with in_flight:
            completion = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=job["options"]["max_tokens"],
            )
        usage = completion.usage
        result = {
            "id": job["id"],
            "status": "ok",
            "output": completion.choices[0].message.content,
            "model": completion.model,
            "finish_reason": completion.choices[0].finish_reason,
            "usage": {
                "input_tokens": usage.prompt_tokens if usage else 0,
                "output_tokens": usage.completion_tokens if usage else 0,
            },
            "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
        }
        return await producer.send(out_topic, orjson.dumps(result), key=record.key)

    await producer.start()
    await consumer.start()
    t0 = time.monotonic()
    cpu = CpuMeter(n)
    done = 0
    try:
        while done < n and time.monotonic() - t0 < timeout_s:
            batches = await consumer.getmany(timeout_ms=50, max_records=500)
            records = [r for rs in batches.values() for r in rs]
            if records:
                acks = await asyncio.gather(*(answer(r) for r in records))
                await asyncio.gather(*acks)
                await consumer.commit()
                done += len(records)
                cpu.mark(done)
        wall_s = time.monotonic() - t0
    finally:
        await consumer.stop()
        await producer.stop()
        await client.close()
    stamps = await record_timestamps_ms(settings, out_topic)
    span_s, rate = rate_from_stamps(stamps)
    return {
        "items": len(stamps),
        "span_s": round(span_s, 3),
        "items_per_s": round(rate, 1),
        "wall_s": round(wall_s, 3),
        "cpu_us_per_item": cpu.us_per_item(),
    }


async def fake_run(
    base: Settings, name: str, n: int, timeout_s: float, variant: Variant | None = None
) -> dict[str, Any]:
    """The service with the in-memory provider (answers as the simulator would, no HTTP)."""
    fake = FakeProvider(fake_answer, name="openai_compat")
    tiers = tier_dict("http://127.0.0.1:9/v1", batching=True)
    res, _ = await service_run(base, name, tiers, n, timeout_s, providers={TIER: fake}, variant=variant)
    return res


async def profile_fake(base: Settings, n: int, timeout_s: float) -> dict[str, Any]:
    """The fake variant again under cProfile: the top functions by own time, us per job."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        res = await fake_run(base, "prof", n, timeout_s)
    finally:
        prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    total_tt = 0.0
    for (filename, line, func), (_cc, ncalls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total_tt += tt
        rows.append((tt, ct, ncalls, f"{_short(filename)}:{line}:{func}"))
    rows.sort(reverse=True)
    per_job = 1e6 / max(1, res["items"])
    by_cum = sorted(rows, key=lambda r: r[1], reverse=True)
    return {
        "items": res["items"],
        "items_per_s_under_profiler": res["items_per_s"],
        "cpu_us_per_job_total": round(total_tt * per_job, 1),
        "top_tottime_us_per_job": [
            {"fn": name, "us_per_job": round(tt * per_job, 2), "calls_per_job": round(nc * per_job / 1e6, 2)}
            for tt, _ct, nc, name in rows[:PROFILE_TOP]
        ],
        "top_cumtime_us_per_job_in_consumer": [
            {"fn": name, "us_per_job": round(ct * per_job, 2)}
            for _tt, ct, _nc, name in by_cum
            if name.startswith("consumer/")
        ][:PROFILE_TOP],
    }


async def spy_fake(base: Settings, n: int, timeout_s: float, workload: str) -> dict[str, Any]:
    """The fake variant again under py-spy (`spy_run`)."""
    return await spy_run(f"fake-{workload}", lambda: fake_run(base, "spy", n, timeout_s))


async def spy_run(label: str, run: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
    """One service run (`run`, returning its figures) under py-spy: the top functions by their
    share of its samples (reading the output topic's timestamps afterwards left out); the
    samples in bench/out/spy-LABEL.txt."""
    # imported here: instructions_bench.py runs this file's workload against older trees
    from consumer.testing.sampling import SampledProfile

    spy = SampledProfile(REPO_ROOT / f"bench/out/spy-{label}.txt")
    with spy:
        res = await run()
    return {
        "items": res["items"],
        "items_per_s_sampled": res["items_per_s"],
        "samples": sum(count for _, count in spy.stacks(exclude=SPY_EXCLUDE)),
        "top_own_share": spy.top(PROFILE_TOP, exclude=SPY_EXCLUDE),
    }


#: the bench's own work in a sampled run, left out of its profile
SPY_EXCLUDE = ("record_timestamps_ms",)


def _short(filename: str) -> str:
    for marker in ("site-packages/", str(REPO_ROOT) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.basename(filename)


# ----------------------------------------------------------------------------------------------
# limiter vs ceiling


@dataclass
class Sampler:
    """Samples the simulator's counters (and optionally a service limit) every SAMPLE_INTERVAL_S."""

    sim: SimProcess
    limit_of: Callable[[], int | None] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def run(self) -> None:
        t0 = time.monotonic()
        while True:
            stats = await self.sim.stats()
            row = {
                "t_s": time.monotonic() - t0,
                "requests": stats["requests"],
                "status_429": stats["status_429"],
                "status_5xx": stats["status_5xx"],
                "answered": stats["items_answered"],
                "inflight": stats["inflight"],
                "tokens_admitted": stats.get("tokens_admitted", 0),
            }
            if self.limit_of is not None:
                row["limit"] = self.limit_of()
            self.samples.append(row)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Sampler]:
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            await asyncio.sleep(SAMPLE_INTERVAL_S * 1.5)  # one sample after the end
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _token_rate(
    s10: dict[str, Any], s90: dict[str, Any], token_limit_per_s: float | None
) -> dict[str, Any]:
    """For a run held by a token limit: the steady tokens/s and the rate against the ceiling
    they give (replacing the one in requests/s)."""
    span_s = s90["t_s"] - s10["t_s"]
    if token_limit_per_s is None or span_s <= 0:
        return {}
    tokens_per_s = (s90["tokens_admitted"] - s10["tokens_admitted"]) / span_s
    return {
        "steady_tokens_per_s": round(tokens_per_s, 1),
        "rate_vs_ceiling": round(tokens_per_s / token_limit_per_s, 3),
    }


def _crossing_s(samples: list[dict[str, Any]], key: str, value: float) -> float | None:
    """When samples[key] first reaches value (linear interpolation between samples)."""
    prev = None
    for s in samples:
        if s[key] >= value:
            if prev is None or s[key] == prev[key]:
                return float(s["t_s"])
            frac = (value - prev[key]) / (s[key] - prev[key])
            return float(prev["t_s"] + frac * (s["t_s"] - prev["t_s"]))
        prev = s
    return None


def summarize(
    samples: list[dict[str, Any]], n: int, ceiling_per_s: float, *, token_limit_per_s: float | None = None
) -> dict[str, Any]:
    """Steady rate (10%..90% of jobs answered), 429 share of all requests, totals.
    `token_limit_per_s`: the run is held by a token limit, so its rate against the ceiling is
    the tokens the simulator's limit counted per second in the steady part over that limit
    (requests differ in tokens: a rate in requests/s over one request's tokens is off by
    their spread)."""
    last = samples[-1]
    t10 = _crossing_s(samples, "answered", 0.1 * n)
    t90 = _crossing_s(samples, "answered", 0.9 * n)
    steady = 0.8 * n / (t90 - t10) if t10 is not None and t90 is not None and t90 > t10 else None
    # 429 share inside the same steady part, and over the whole run
    s10 = next((s for s in samples if s["t_s"] >= (t10 or 0)), samples[0])
    s90 = next((s for s in samples if s["t_s"] >= (t90 or last["t_s"])), last)
    req_steady = s90["requests"] - s10["requests"]
    out = {
        "answered": last["answered"],
        "requests": last["requests"],
        "status_429": last["status_429"],
        "status_5xx": last["status_5xx"],
        "share_429": round(last["status_429"] / last["requests"], 4) if last["requests"] else None,
        "share_429_steady": round((s90["status_429"] - s10["status_429"]) / req_steady, 4)
        if req_steady
        else None,
        "steady_rate_per_s": round(steady, 2) if steady else None,
        # first to last answer (for runs that never reach 90% of the jobs)
        "overall_rate_per_s": _overall_rate(samples),
        "rate_vs_ceiling": round(steady / ceiling_per_s, 3) if steady else None,
        **_token_rate(s10, s90, token_limit_per_s),
        "run_s": round(_crossing_s(samples, "answered", n) or last["t_s"], 2),
    }
    limits = [s["limit"] for s in samples if s.get("limit") is not None]
    if limits:
        steady_limits = [
            s["limit"]
            for s in samples
            if (t10 or 0) <= s["t_s"] <= (t90 or last["t_s"]) and s.get("limit") is not None
        ]
        out["limit_min_max_mean_steady"] = [
            min(steady_limits or limits),
            max(steady_limits or limits),
            round(sum(steady_limits or limits) / len(steady_limits or limits), 1),
        ]
    return out


def _overall_rate(samples: list[dict[str, Any]]) -> float | None:
    first = next((x for x in samples if x["answered"] > 0), None)
    last = samples[-1]
    if first is None or last["t_s"] <= first["t_s"]:
        return None
    end = _crossing_s(samples, "answered", last["answered"]) or last["t_s"]
    return round((last["answered"] - first["answered"]) / max(1e-3, end - first["t_s"]), 2)


async def direct_loop(
    tier: TierConfig, jobs: list[dict[str, Any]], concurrency: int, timeout_s: float
) -> dict[str, int]:
    """`concurrency` workers call the tier's adapter directly; 429/5xx/timeouts retried after
    Retry-After (else 0.5 s doubling to 10 s), like a careful hand-written client."""
    client = make_http_client(tier)
    provider = build_provider(TIER, tier, client)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    counts = {"ok": 0, "failed": 0, "retries": 0}
    deadline = time.monotonic() + timeout_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            request = request_for(job, tier.model)
            delay_s = 0.5
            while time.monotonic() < deadline:
                try:
                    await provider.complete(request)
                    counts["ok"] += 1
                    break
                except ProviderError as exc:
                    if not exc.retryable:
                        counts["failed"] += 1
                        break
                    counts["retries"] += 1
                    wait_s = exc.hint.retry_after_s if exc.hint.retry_after_s is not None else delay_s
                    delay_s = min(delay_s * 2, 10.0)
                    await asyncio.sleep(wait_s)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await provider.aclose()
        await client.close()
    return counts


async def tokens_per_request(tier: TierConfig, job: dict[str, Any]) -> int:
    """What one request for `job` costs the simulator's token bucket (its answer's usage)."""
    client = make_http_client(tier)
    provider = build_provider(TIER, tier, client)
    try:
        completion = await provider.complete(request_for(job, tier.model))
    finally:
        await provider.aclose()
        await client.close()
    return completion.usage.input_tokens + completion.usage.output_tokens


async def limiter_scenario(
    args: argparse.Namespace, base: Settings, scenario: dict[str, Any]
) -> dict[str, Any]:
    capacity, latency_ms = scenario["capacity"], scenario["latency_ms"]
    rpm, tpm = scenario.get("rpm", 0), scenario.get("tpm", 0)
    window_s = scenario["rate_window_s"]
    per_window = max(1, round(rpm / 60 * window_s)) if rpm else 0
    tokens_per_window = max(1, round(tpm / 60 * window_s)) if tpm else 0
    faults = {
        "seed": 1,
        "latency_ms": latency_ms,
        "jitter_ms": scenario.get("jitter_ms", 0),
        "capacity": capacity,
        "rpm": per_window,
        "tpm": tokens_per_window,
        "rate_window_s": window_s,
    }
    timeout_s = max(30.0, 4 * args.limiter_run_s)
    log_path = REPO_ROOT / f"bench/out/sim-limiter-{scenario['name']}.log"
    async with SimProcess(faults, log_path) as sim:
        tiers = tier_dict(f"{sim.base}/v1", batching=False)
        tier = TierConfig.model_validate(tiers["tiers"][TIER])
        ceilings = {"capacity": capacity * 1000.0 / latency_ms}
        if per_window:
            ceilings["rpm"] = per_window / window_s
        if tokens_per_window:
            # every bench job costs the same tokens (same prompt, inputs of one length class)
            tokens = await tokens_per_request(tier, make_jobs(1, batched_share=0.0, seed=2)[0])
            ceilings["tpm"] = tokens_per_window / window_s / tokens
        binding = min(ceilings, key=lambda k: ceilings[k])
        ceiling = ceilings[binding]
        token_limit = tokens_per_window / window_s if binding == "tpm" else None
        n = max(50, round(ceiling * args.limiter_run_s))
        jobs = make_jobs(n, batched_share=0.0, seed=2)
        out: dict[str, Any] = {
            "simulator": faults,
            "ceiling_per_s": round(ceiling, 2),
            "ceiling_binding": binding,
            "jobs": n,
            "targets": {"rate_vs_ceiling": 0.95, "share_429": 0.03},
        }
        if tokens_per_window:
            out["tokens_per_request"] = tokens
        # the service (own topics: a fresh jobs topic with only these jobs)
        settings = variant_settings(base, f"lim-{scenario['name']}")
        settings = settings.model_copy(update={"jobs_topic": f"bench-lim-jobs-{uuid.uuid4().hex[:6]}"})
        await ensure_topics(settings)
        await submit_jobs(
            settings, (orjson.dumps(j) for j in jobs), key_of=lambda v: orjson.loads(v)["id"].encode()
        )
        await sim.reset()
        sampler = Sampler(sim)

        seen: dict[str, Any] = {}

        async def watch(svc: InProcessService) -> None:
            tier_runtime = svc.pipeline.runner(TIER).tier
            seen["limiter"] = tier_runtime.limiter
            sampler.limit_of = lambda: tier_runtime.limiter.limit
            await asyncio.Event().wait()

        # the sampler starts with the service (join time counts as idle time before 10%)
        async with sampler.running():
            svc_res, _ = await service_run(settings, "svc", tiers, n, timeout_s, on_running=watch)
        out["service"] = {
            **summarize(sampler.samples, n, ceiling, token_limit_per_s=token_limit),
            "dead_letters": svc_res["dead_letters"],
            "service_rate_limited": svc_res["rate_limited"],
        }
        if "limiter" in seen:  # what the service learnt of the provider's bucket
            pacer = seen["limiter"].pacer
            out["service"]["pacer_rate_per_s"] = round(pacer.rate_per_s, 2) if pacer.rate_per_s else None
            out["service"]["pacer_capacity"] = round(pacer.capacity, 1) if pacer.capacity else None
        out["service_trace"] = _trace(sampler.samples)
        _progress("limiter %s service: %s", scenario["name"], out["service"])

        # await-each can do at most one request per latency: give it about limiter_run_s of work
        n_each = min(n, max(50, round(1000.0 / latency_ms * args.limiter_run_s)))
        for name, conc, count in (("fixed16", 16, n), ("await_each", 1, n_each)):
            await sim.reset()
            sampler = Sampler(sim)
            async with sampler.running():
                counts = await direct_loop(tier, jobs[:count], conc, timeout_s)
            summary = summarize(sampler.samples, count, ceiling, token_limit_per_s=token_limit)
            out[name] = {"jobs": count, **summary, **counts}
            out[f"{name}_trace"] = _trace(sampler.samples)
            _progress("limiter %s %s: %s", scenario["name"], name, out[name])
    return out


def _trace(samples: list[dict[str, Any]]) -> list[list[Any]]:
    """Compact timeline for plots: [t_s, answered, status_429, limit or -1]."""
    return [
        [
            round(s["t_s"], 2),
            s["answered"],
            s["status_429"],
            s.get("limit") if s.get("limit") is not None else -1,
        ]
        for s in samples
    ]


# ----------------------------------------------------------------------------------------------
# plot and main


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Each figure next to its target: the service's throughput at least 0.6 of raw aiokafka's
    (the batched workload with the in-memory provider is the one the service is held to; the
    others are shown against the same mark), unbatched through the simulator at least 8x the
    hand-written SDK consumer's; under a provider ceiling, an accepted rate of at least 0.95 of
    it, at most 3 % answers 429 and no dead letters. CPU per job is shown beside each ratio."""
    out: dict[str, Any] = {}
    tp = result.get("throughput") or {}
    for workload in WORKLOADS:
        for variant in ("sim", "fake"):
            entry = tp.get(workload, {}).get(variant, {})
            ratio = entry.get("ratio_vs_raw")
            if ratio is not None:
                out[f"{workload}_{variant}_ratio_vs_raw"] = {
                    "value": ratio,
                    "target": TARGET_RATIO,
                    "met": ratio >= TARGET_RATIO,
                    "cpu_us_per_job": entry.get("cpu_us_per_job_median"),
                    "cpu_us_per_item": entry.get("cpu_us_per_item_median"),
                }
    sdk_ratio = tp.get("unbatched", {}).get("sim", {}).get("ratio_vs_sdk")
    if sdk_ratio is not None:
        out["unbatched_sim_ratio_vs_sdk"] = {
            "value": sdk_ratio,
            "target": TARGET_SDK_RATIO,
            "met": sdk_ratio >= TARGET_SDK_RATIO,
        }
    for sc in result.get("limiter", []):
        svc = sc["service"]
        rate, share = svc.get("rate_vs_ceiling"), svc.get("share_429")
        dead = sum(svc.get("dead_letters", {}).values())
        out[f"limiter_{sc['name']}"] = {
            "rate_vs_ceiling": rate,
            "share_429": share,
            "dead_letters": dead,
            "met": rate is not None and rate >= 0.95 and share is not None and share <= 0.03 and dead == 0,
        }
    return out


def plot(result: dict[str, Any], path: Path) -> str:
    """Throughput bars and, per limiter scenario, accepted-request rate over time (+ the AIMD limit)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed"
    scenarios = result.get("limiter", [])
    tp = result.get("throughput")
    panels = (1 if tp else 0) + len(scenarios)
    fig, grid = plt.subplots(1, panels, figsize=(1 + 6 * panels, 4), squeeze=False)
    axes: list[Any] = list(grid[0])
    if tp:
        colors = {"raw": "grey", "sim": "C0", "fake": "C1"}
        names, rates, cols = [], [], []
        for workload in WORKLOADS:
            for variant, color in colors.items():
                if variant in tp.get(workload, {}):
                    names.append(f"{workload}\n{variant}")
                    rates.append(tp[workload][variant]["items_per_s_median"])
                    cols.append(color)
        bars = axes.pop(0)
        bars.bar(names, rates, color=cols)
        bars.set_ylabel("items/s (median)")
        bars.set_title(f"throughput, {tp['jobs']} jobs per run")
    for ax, sc in zip(axes, scenarios, strict=True):
        for i, name in enumerate(("service", "fixed16", "await_each")):
            trace = sc.get(f"{name}_trace") or []
            ts = [r[0] for r in trace]
            rate = [0.0] + [
                (trace[k][1] - trace[k - 1][1]) / max(1e-3, trace[k][0] - trace[k - 1][0])
                for k in range(1, len(trace))
            ]
            ax.plot(ts, _smooth(rate, 5), label=f"{name} ok/s", color=f"C{i}")
        ax.axhline(sc["ceiling_per_s"], color="k", linestyle="--", label="ceiling")
        ax.set_xlabel("s")
        ax.set_ylabel("answered requests/s")
        limits = ", ".join(f"{sc[k]} {k[:3]}" for k in ("rpm_per_min", "tpm_per_min") if sc.get(k))
        ax.set_title(f"{sc['name']}: capacity {sc['simulator']['capacity']}, {limits}")
        ax2 = ax.twinx()
        trace = sc.get("service_trace") or []
        ax2.step([r[0] for r in trace], [r[3] for r in trace], color="C0", alpha=0.4, where="post")
        ax2.set_ylabel("service AIMD limit", color="C0")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return str(path.relative_to(REPO_ROOT))


def _smooth(values: list[float], k: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


SCENARIOS = [
    # the brief's example: the RPM ceiling binds (20 requests/s need ~1 request in flight)
    {"name": "rpm1200", "capacity": 8, "latency_ms": 50, "rpm": 1200, "rate_window_s": 1.0},
    # a ceiling that needs real concurrency (~6 in flight) below the capacity of 8
    {"name": "rpm7200", "capacity": 8, "latency_ms": 50, "rpm": 7200, "rate_window_s": 1.0},
    # a token limit only: 600 tokens/s, ~29 of these requests/s (they cost ~21 tokens each)
    {"name": "tpm36000", "capacity": 8, "latency_ms": 50, "tpm": 36000, "rate_window_s": 1.0},
]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    # every variant runs under the GC settings the service gives its process (run_service
    # applies them at start; here they apply to raw from the start too)
    tune_gc()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    base = settings_from_env(service_env(bootstrap, partitions=4, PROMPTBUS_SHUTDOWN_TIMEOUT_S="30"))
    result: dict[str, Any] = {
        "bench": "pipeline_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
    }
    t0 = time.monotonic()
    if "throughput" in args.parts:
        result["throughput"] = await throughput(args, base)
    if "limiter" in args.parts:
        result["limiter"] = []
        for scenario in SCENARIOS[: 1 if args.quick else None]:
            sc = await limiter_scenario(args, base, scenario)
            limits = {f"{k}_per_min": scenario[k] for k in ("rpm", "tpm") if scenario.get(k)}
            result["limiter"].append({"name": scenario["name"], **limits, **sc})
    result["bench_s"] = round(time.monotonic() - t0, 1)
    result["summary"] = summary(result)
    if args.plot:
        result["plot"] = plot(result, REPO_ROOT / "bench/out/pipeline_bench.png")
    if not args.traces:
        for sc in result.get("limiter", []):
            for key in [k for k in sc if k.endswith("_trace")]:
                del sc[key]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="~1 minute: 12,000 jobs, one run each, one limiter scenario"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="throughput jobs per workload (default 50000; quick 12000, not a steady state)",
    )
    parser.add_argument(
        "--unbatched-jobs",
        type=int,
        default=6000,
        help="jobs of the unbatched workload (the sdk variant answers a few hundred a second)",
    )
    parser.add_argument(
        "--limiter-run-s",
        type=float,
        default=None,
        help="target seconds per limiter variant (default 20; quick 6)",
    )
    parser.add_argument(
        "--variant-timeout-s", type=float, default=120.0, help="bound of one throughput variant"
    )
    parser.add_argument("--parts", default="throughput,limiter", help="comma list: throughput, limiter")
    parser.add_argument(
        "--variants",
        default="raw,sim,fake,sdk",
        help="throughput variants, comma list: raw, sim, fake, sdk (sdk: unbatched workload only); "
        "each service variant also as KIND@SETTING=VALUE (fake@max_inflight=2000) or KIND@gc=default",
    )
    parser.add_argument(
        "--workloads",
        default="batched,mixed,unbatched",
        help="throughput workloads, comma list: batched (every job batch: true), mixed (half), unbatched",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each variant, interleaved (default 3; quick 1)"
    )
    parser.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="the event loop every variant runs on (auto: the service's default, uvloop where installed)",
    )
    parser.add_argument("--profile", action="store_true", help="also profile the fake variant (cProfile)")
    parser.add_argument(
        "--spy", action="store_true", help="also sample the fake variant with py-spy (the dev extra has it)"
    )
    parser.add_argument("--plot", action="store_true", help="draw bench/out/pipeline_bench.png")
    parser.add_argument("--traces", action="store_true", help="keep the limiter timelines in the JSON")
    add_save_option(parser)
    args = parser.parse_args(argv)
    args.parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    try:
        args.variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip() in WORKLOADS]
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.jobs is None:
        args.jobs = 12000 if args.quick else 50000
    if args.limiter_run_s is None:
        args.limiter_run_s = 6.0 if args.quick else 20.0
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # a fresh topic's first produce often meets NotLeaderForPartition while the leader is elected
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    # every variant runs on the loop the service runs on (`promptbus run`: PROMPTBUS_EVENT_LOOP)
    result = eventloop.run(main_async(args), args.loop)
    result["event_loop"] = args.loop
    name = "pipeline_bench_" + "_".join(p for p in ("throughput", "limiter") if p in args.parts)
    saved = emit_report(result, args.save, name=name)
    if saved is not None and result.get("plot"):
        shutil.copyfile(REPO_ROOT / result["plot"], saved.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
