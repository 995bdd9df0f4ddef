"""Sources: an Avro topic enriched by the service, against a raw loop on the same serdes.

    .venv/bin/python bench/sources_bench.py [--records 50000] [--repeats 2] [--unchanged skip|ask]
        [--loop auto|uvloop|asyncio] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092) and a Schema Registry
(SCHEMA_REGISTRY_URL, else `deploy/schema-registry/registry start`'s). Prints one JSON object on
stdout; progress goes to stderr.

N Avro review records (the Confluent wire format, their schema registered by confluent-kafka's
own serializer) are produced once to a fresh 4-partition topic, keyed by id. Then, each run with
its own consumer group and output topic, interleaved `--repeats` times:

    raw      an aiokafka loop: getmany -> each record decoded and its row encoded back with one
             more field (the same `SourceCodec` the service uses: fastavro under the registry's
             schemas, the output schema registered once) -> produced under its key (acks=all,
             idempotent) -> acks awaited -> commit: the floor cost of consume, decode, encode,
             produce;
    service  `promptbus run`'s pipeline in this process with the topic as a batched source
             (max_items 20) and the in-memory `FakeProvider` answering every pack at once: the
             service's own cost of a source (decode, mapping, windows, packing, the limiter,
             the per-key order, encode, produce, commit).

Both run on the event loop `promptbus run` runs on (`--loop auto`: uvloop where installed), as
pipeline_bench's variants do; `--loop asyncio` measures both on the standard loop.

Records/s is counted from the output records' own Kafka timestamps (first to last), so start-up
and group join are left out alike; `ratio_vs_raw` = median service rate / median raw rate
(target >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from pipeline_bench import fake_answer, rate_from_stamps, record_timestamps_ms

from consumer.kafka.admin import ensure_topics
from consumer.kafka.connection import client_kwargs
from consumer.kafka.sink import kafka_producer_factory
from consumer.providers.fake import FakeProvider
from consumer.registry.client import RegistryClient
from consumer.registry.codecs import SourceCodec
from consumer.runtime import eventloop
from consumer.settings import Settings
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.cluster import create_topic_on
from consumer.testing.harness import InProcessService, service_env, settings_from_env, tier_file_dict
from consumer.testing.paths import REPO_ROOT
from consumer.testing.records import RawRecord, produce_records

TARGET_RATIO = 0.5
PARTITIONS = 4
FIELD = "sentiment"
def _string(name: str) -> dict[str, str]:
    return {"name": name, "type": "string"}


SCHEMA = {
    "type": "record",
    "name": "Review",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "product", "type": {"type": "record", "name": "P", "fields": [_string("name")]}},
        {"name": "review", "type": {"type": "record", "name": "T", "fields": [_string("text")]}},
        {"name": "stars", "type": "int"},
    ],
}
WORDS = "good bad slow fast cold warm fine rude kind late early cheap dear clean loud calm".split()


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def registry_url() -> str:
    url = os.environ.get("SCHEMA_REGISTRY_URL")
    if url:
        return url
    out = subprocess.run(
        [str(REPO_ROOT / "deploy" / "schema-registry" / "registry"), "start"],
        capture_output=True, text=True, check=True, timeout=600,
    )
    return out.stdout.strip().splitlines()[-1]


async def produce_reviews(settings: Settings, url: str, topic: str, n: int) -> None:
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
    from confluent_kafka.schema_registry._async.avro import AsyncAvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = AsyncSchemaRegistryClient({"url": url, "timeout": 10})
    serializer = await AsyncAvroSerializer(
        client, orjson.dumps(SCHEMA).decode(), conf={"subject.name.strategy.type": "TOPIC"}
    )
    ctx = SerializationContext(topic, MessageField.VALUE)
    records = []
    for i in range(n):
        row = {
            "id": f"r{i}",
            "product": {"name": ("kettle", "toaster", "mug")[i % 3]},
            "review": {"text": f"{i} " + " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(5))},
            "stars": i % 5,
        }
        records.append(RawRecord(row["id"].encode(), await serializer(row, ctx)))
    await client.aclose()
    await produce_records(settings, topic, records)


async def raw_loop(settings: Settings, url: str, topic: str, out_topic: str, n: int) -> dict[str, Any]:
    """consume -> decode -> encode with the field -> produce -> acks -> commit."""
    registry = RegistryClient(url)
    codec = SourceCodec("avro", registry, out_topic=out_topic, out_format="same", fields=(FIELD,))
    consumer = AIOKafkaConsumer(
        topic,
        group_id=f"bench-raw-{uuid.uuid4().hex[:6]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **client_kwargs(settings),
    )
    producer = kafka_producer_factory(settings, client_id="bench-raw")(transactional_id=None)
    await producer.start()
    await consumer.start()
    t0 = time.monotonic()
    done = 0
    try:
        while done < n and time.monotonic() - t0 < 300:
            batches = await consumer.getmany(timeout_ms=50, max_records=500)
            futures = []
            for records in batches.values():
                for r in records:
                    missing = codec.missing(r.value)
                    if missing is not None:
                        await codec.prepare(missing)
                    row, writer = codec.decode(r.value)
                    value = codec.encode({**row, FIELD: "positive"}, writer)
                    futures.append(await producer.send(out_topic, value, key=r.key))
            if futures:
                await asyncio.gather(*futures)
                await consumer.commit()
                done += len(futures)
    finally:
        await consumer.stop()
        await producer.stop()
        await registry.aclose()
    return await _rate(settings, out_topic, time.monotonic() - t0)


async def service_run(
    settings: Settings, url: str, topic: str, out_topic: str, n: int, unchanged: str = "skip"
) -> dict[str, Any]:
    tiers = tier_file_dict("http://127.0.0.1:9/v1", max_items=20)
    tiers["sources"] = {
        "reviews": {
            "topic": topic,
            "tier": "small",
            "format": "avro",
            "prompt": "Classify the sentiment of this review of a ${product.name}.\nREVIEW:\n${review.text}",
            "batch": True,
            "into": {"topic": out_topic, "field": FIELD},
            "unchanged": unchanged,
        }
    }
    run = uuid.uuid4().hex[:6]
    run_settings = settings.model_copy(
        update={
            # a fresh group, and a fresh memo: a run after another would find every record
            # unchanged and ask nothing (the skip path is not what this bench measures)
            "group_id": f"bench-svc-{run}",
            "enrichments_topic": f"bench-enrichments-{run}",
            "schema_registry": settings.schema_registry.model_copy(update={"url": url}),
        }
    )
    t0 = time.monotonic()
    async with InProcessService(run_settings, tiers, providers={"small": FakeProvider(fake_answer)}) as svc:
        while time.monotonic() - t0 < 300:
            source = svc.stats_snapshot()["sources"].get("reviews", {})
            ended = source.get("enriched", 0) + source.get("skipped_unchanged", 0)
            if ended + sum((source.get("dead_letters") or {}).values()) >= n:
                break
            await asyncio.sleep(0.05)
        snapshot = svc.stats_snapshot()
    out = await _rate(settings, out_topic, time.monotonic() - t0)
    out["source"] = snapshot["sources"].get("reviews")
    out["provider_requests"] = snapshot["tiers"]["small"]["provider_requests"]
    return out


async def _rate(settings: Settings, out_topic: str, wall_s: float) -> dict[str, Any]:
    stamps = await record_timestamps_ms(settings, out_topic)
    span_s, rate = rate_from_stamps(stamps)
    return {"records": len(stamps), "span_s": round(span_s, 3), "records_per_s": round(rate, 1),
            "wall_s": round(wall_s, 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    url = registry_url()
    settings = settings_from_env(service_env(bootstrap, partitions=PARTITIONS))
    await ensure_topics(settings)
    topic = f"bench-reviews-{uuid.uuid4().hex[:6]}"
    await create_topic_on(bootstrap, topic, PARTITIONS)
    _progress(f"producing {args.records} Avro records to {topic}")
    await produce_reviews(settings, url, topic, args.records)
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], "service": []}
    for i in range(args.repeats):
        for name in ("raw", "service"):
            out_topic = f"{topic}-{name}-{i}"
            if name == "raw":
                result = await raw_loop(settings, url, topic, out_topic, args.records)
            else:
                result = await service_run(settings, url, topic, out_topic, args.records, args.unchanged)
            _progress(f"{name} #{i + 1}: {result}")
            runs[name].append(result)
    medians = {name: statistics.median(r["records_per_s"] for r in rs) for name, rs in runs.items()}
    ratio = round(medians["service"] / medians["raw"], 3) if medians["raw"] else None
    return {
        "bench": "sources_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "records": args.records,
        "repeats": args.repeats,
        "unchanged": args.unchanged,
        "event_loop": args.loop,
        "runs": runs,
        "median_records_per_s": medians,
        "ratio_vs_raw": ratio,
        "target": TARGET_RATIO,
        "met": ratio is not None and ratio >= TARGET_RATIO,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--unchanged", choices=("skip", "ask"), default="skip",
        help="the source's unchanged: skip (the default: each key's memo is kept) or ask",
    )
    parser.add_argument(
        "--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
        help="the event loop both run on (auto: the service's default, uvloop where installed)",
    )
    add_save_option(parser)
    args = parser.parse_args()
    result = eventloop.run(main_async(args), args.loop)
    emit_report(result, args.save, name="sources_bench")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
