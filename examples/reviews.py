"""The example shop's reviews as a company's topic holds them, and its enriched topic read back
(docs/sources.md walks through both).

    .venv/bin/python examples/reviews.py produce --topic shop.reviews [--avro]
    .venv/bin/python examples/reviews.py read --topic shop.reviews.enriched [--count N] [--timeout-s S]

`produce` writes examples/reviews.jsonl to the topic, each record keyed by its `id`: as JSON, or
with --avro in the Confluent wire format through the Schema Registry at
PROMPTBUS_SCHEMA_REGISTRY__URL (examples/review.avsc, registered under TOPIC-value by
confluent-kafka's own serializer). `read` prints each record of a topic as a JSON line, its key
and value (a wire-format value decoded through the registry), waiting until it holds `--count`
records (bounded by --timeout-s); it exits 1 when fewer came. KAFKA_BOOTSTRAP_SERVERS names the
brokers (default 127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
#: confluent-kafka's serdes default to the ASSOCIATED subject strategy, which not every registry
#: serves (Apicurio lacks its endpoint): the topic's subject, TOPIC-value, as everywhere else
SERDE_CONF = {"subject.name.strategy.type": "TOPIC"}


def _registry() -> object:
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

    url = os.environ.get("PROMPTBUS_SCHEMA_REGISTRY__URL")
    if not url:
        sys.exit("set PROMPTBUS_SCHEMA_REGISTRY__URL (deploy/schema-registry/registry start prints it)")
    return AsyncSchemaRegistryClient({"url": url, "timeout": 10})


def _settings() -> object:
    from consumer.settings import load_settings

    return load_settings()


async def produce(topic: str, avro: bool) -> int:
    from confluent_kafka.serialization import MessageField, SerializationContext

    from consumer.testing.records import RawRecord, produce_records

    rows = [orjson.loads(line) for line in (HERE / "reviews.jsonl").read_text().splitlines() if line.strip()]
    if avro:
        from confluent_kafka.schema_registry._async.avro import AsyncAvroSerializer

        client = _registry()
        serializer = await AsyncAvroSerializer(client, (HERE / "review.avsc").read_text(), conf=SERDE_CONF)
        ctx = SerializationContext(topic, MessageField.VALUE)
        values = [await serializer(row, ctx) for row in rows]
        await client.aclose()  # type: ignore[attr-defined]
    else:
        values = [orjson.dumps(row) for row in rows]
    records = [RawRecord(row["id"].encode(), value) for row, value in zip(rows, values, strict=True)]
    produced = await produce_records(_settings(), topic, records)  # type: ignore[arg-type]
    print(f"produced {len(produced)} reviews to {topic}" + (" (Avro, through the registry)" if avro else ""))
    return 0


async def read(topic: str, count: int, timeout_s: float) -> int:
    from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from consumer.testing.records import wait_for_records

    records = await wait_for_records(_settings(), topic, count, timeout_s=timeout_s)  # type: ignore[arg-type]
    deserializer = None
    for record in records:
        value = record.value
        if value is None:
            shown = None
        elif value[:1] == b"\x00":
            if deserializer is None:
                client = _registry()
                deserializer = await AsyncAvroDeserializer(client, conf=SERDE_CONF)
            shown = await deserializer(value, SerializationContext(topic, MessageField.VALUE))
        else:
            shown = orjson.loads(value)
        key = record.key.decode() if record.key is not None else None
        print(orjson.dumps({"key": key, "partition": record.partition, "value": shown}).decode())
    if len(records) < count:
        print(f"only {len(records)} of {count} records after {timeout_s:g} s", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--topic", required=True)
    p.add_argument("--avro", action="store_true")
    r = sub.add_parser("read")
    r.add_argument("--topic", required=True)
    r.add_argument("--count", type=int, default=6)
    r.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    if args.command == "produce":
        return asyncio.run(produce(args.topic, args.avro))
    return asyncio.run(read(args.topic, args.count, args.timeout_s))


if __name__ == "__main__":
    sys.exit(main())
