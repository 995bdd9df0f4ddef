"""Sources in the registry formats, against a real Schema Registry (Apicurio, started by
`deploy/schema-registry/registry`) and the real broker: Avro and JSON Schema records written
by confluent-kafka's own serializers, Protobuf records framed as the wire format says, Debezium
change events, and a registry that goes away and comes back."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer, AsyncAvroSerializer
from confluent_kafka.schema_registry._async.json_schema import AsyncJSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from consumer.core.completion import Completion, CompletionRequest
from consumer.providers.fake import FakeProvider, text_completion
from consumer.registry.client import RegistryClient
from consumer.registry.protobuf import ProtoSchema
from consumer.testing.harness import InProcessService, service_env, settings_from_env
from consumer.testing.records import RawRecord, produce_records, read_records, wait_for_records
from consumer.testing.relay import TcpRelay
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for
from tests.service.test_sources import fake_answer, label, source_tiers
from tests.service.test_sources_offline import offline_tiers, recorded_batches

pytestmark = pytest.mark.integration

PARTITIONS = 3
#: confluent-kafka's serdes default to the ASSOCIATED strategy, whose endpoint Apicurio lacks
SERDE_CONF = {"subject.name.strategy.type": "TOPIC"}
def record_of(record: str, **fields: Any) -> dict[str, Any]:
    """An Avro record schema of `fields` (name -> type)."""
    return {"type": "record", "name": record, "fields": [{"name": k, "type": v} for k, v in fields.items()]}


REVIEW_SCHEMA = {
    **record_of(
        "Review",
        id="string",
        product=record_of("Product", name="string"),
        review=record_of("Text", text="string"),
        stars="int",
    ),
    "namespace": "shop",
}


def review_row(i: int) -> dict[str, Any]:
    return {
        "id": f"r{i}",
        "product": {"name": "kettle" if i % 2 else "toaster"},
        "review": {"text": "good value" if i % 3 else "broke fast"},
        "stars": i % 5,
    }


@pytest.fixture
async def env(kafka_bootstrap: str, schema_registry_url: str, create_topic: Any, topic_name: str) -> Any:
    registry = {"PROMPTBUS_SCHEMA_REGISTRY__URL": schema_registry_url}
    settings = settings_from_env(service_env(kafka_bootstrap, partitions=PARTITIONS, **registry))
    source_topic = await create_topic(f"{topic_name}-src", partitions=PARTITIONS)
    client = AsyncSchemaRegistryClient({"url": schema_registry_url, "timeout": 10})
    yield settings, source_topic, f"{topic_name}-out", client
    await client.aclose()


async def avro_values(
    client: AsyncSchemaRegistryClient, topic: str, rows: list[dict[str, Any]], schema: Any
) -> list[bytes]:
    """The rows as confluent-kafka's Avro serializer writes them (registering the schema)."""
    serializer = await AsyncAvroSerializer(client, orjson.dumps(schema).decode(), conf=SERDE_CONF)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [await serializer(row, ctx) for row in rows]


async def test_an_avro_topic_is_enriched_into_avro_under_the_input_schema_plus_the_field(env: Any) -> None:
    settings, source_topic, out_topic, client = env
    rows = [review_row(i) for i in range(30)]
    values = await avro_values(client, source_topic, rows, REVIEW_SCHEMA)
    records = [RawRecord(row["id"].encode(), value) for row, value in zip(rows, values, strict=True)]
    tiers = source_tiers(source_topic, out_topic, format="avro")
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    assert len(enriched) == len(rows)
    # the output is read back with confluent-kafka's own deserializer, through the registry
    deserializer = await AsyncAvroDeserializer(client, conf=SERDE_CONF)
    ctx = SerializationContext(out_topic, MessageField.VALUE)
    by_id = {row["id"]: row for row in rows}
    for record in enriched:
        out = await deserializer(record.value, ctx)
        assert out == {**by_id[out["id"]], "sentiment": label(out["review"]["text"])}
        assert record.key == out["id"].encode()
    latest = await client.get_latest_version(f"{out_topic}-value")
    fields = [f["name"] for f in orjson.loads(latest.schema.schema_str)["fields"]]
    assert fields == ["id", "product", "review", "stars", "sentiment"]


#: a structured answer's schema: in the Avro output a record, not JSON text
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
    "required": ["label", "score"],
    "additionalProperties": False,
}


def verdict_answer(request: CompletionRequest) -> Completion:
    """A verdict for a review that reads well; for any other, an answer its schema refuses."""
    if "good" in request.messages[-1].content:
        return text_completion('{"label": "positive", "score": 0.9}')
    return text_completion('{"label": "negative"}')


async def test_a_structured_answer_is_written_as_a_typed_avro_record_and_a_failure_as_an_error_record(
    env: Any,
) -> None:
    settings, source_topic, out_topic, client = env
    rows = [review_row(i) for i in range(6)]
    values = await avro_values(client, source_topic, rows, REVIEW_SCHEMA)
    records = [RawRecord(row["id"].encode(), value) for row, value in zip(rows, values, strict=True)]
    response_format = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA}}
    tiers = source_tiers(
        source_topic, out_topic, format="avro", batch=False, response_format=response_format, on_error="field"
    )
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(verdict_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    assert len(enriched) == len(rows)
    deserializer = await AsyncAvroDeserializer(client, conf=SERDE_CONF)
    ctx = SerializationContext(out_topic, MessageField.VALUE)
    outs = {out["id"]: out for out in [await deserializer(r.value, ctx) for r in enriched]}
    assert set(outs) == {row["id"] for row in rows}
    for row in rows:
        out = outs[row["id"]]
        if "good" in row["review"]["text"]:
            assert out["sentiment"] == {"label": "positive", "score": 0.9} and out["sentiment_error"] is None
        else:  # refused by its schema on every attempt: null, and the error object beside it
            assert out["sentiment"] is None
            assert out["sentiment_error"]["kind"] == "output_invalid", out
            assert "score" in out["sentiment_error"]["message"]
    latest = orjson.loads((await client.get_latest_version(f"{out_topic}-value")).schema.schema_str)
    added = {f["name"]: f["type"] for f in latest["fields"][-2:]}
    assert added["sentiment"][1]["type"] == "record"
    assert [f["name"] for f in added["sentiment"][1]["fields"]] == ["label", "score"]
    assert added["sentiment_error"][1]["type"] == "record"


async def test_an_offline_avro_source_is_collected_by_an_instance_that_never_read_its_schema(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instance that submitted the batch stops; the next one decodes the stored Avro values
    with a schema it reads from the registry then, and writes them back in Avro."""
    settings, source_topic, out_topic, client = env
    monkeypatch.setenv("PB_TEST_BATCH_KEY", "k")
    rows = [review_row(i) for i in range(8)]
    values = await avro_values(client, source_topic, rows, REVIEW_SCHEMA)
    records = [RawRecord(row["id"].encode(), value) for row, value in zip(rows, values, strict=True)]
    async with SimulatorServer(SimulatorConfig(seed=4, batch_delay_s=4.0)) as base_url:
        into = {"topic": out_topic, "field": "sentiment"}
        source = {"topic": source_topic, "format": "avro", "mode": "offline", "into": into}
        tiers = offline_tiers(base_url, {"reviews": source})
        async with InProcessService(settings, tiers):
            await produce_records(settings, source_topic, records)
            recorded: list[dict[str, Any]] = []
            for _ in range(150):
                recorded = await recorded_batches(settings)
                if recorded:
                    break
                await asyncio.sleep(0.2)
            assert recorded, "the batch was recorded"
        assert await read_records(settings, out_topic) == []
        async with InProcessService(settings, tiers):
            enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    assert len(enriched) == len(rows)
    deserializer = await AsyncAvroDeserializer(client, conf=SERDE_CONF)
    ctx = SerializationContext(out_topic, MessageField.VALUE)
    by_id = {row["id"]: row for row in rows}
    for record in enriched:
        out = await deserializer(record.value, ctx)
        assert out == {**by_id[out["id"]], "sentiment": answer_for(out["review"]["text"])}
        assert record.key == out["id"].encode()


async def test_a_json_schema_topic_is_enriched_in_the_wire_format(env: Any) -> None:
    settings, source_topic, out_topic, client = env
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "review": {"type": "object"}, "product": {"type": "object"}},
        "required": ["id"],
    }
    serializer = await AsyncJSONSerializer(orjson.dumps(schema).decode(), client, conf=SERDE_CONF)
    ctx = SerializationContext(source_topic, MessageField.VALUE)
    rows = [review_row(i) for i in range(10)]
    records = [RawRecord(r["id"].encode(), await serializer(r, ctx)) for r in rows]
    tiers = source_tiers(source_topic, out_topic, format="json_schema")
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    out_id = (await client.get_latest_version(f"{out_topic}-value")).schema_id
    for record in enriched:
        value = record.value or b""
        assert value[0] == 0 and int.from_bytes(value[1:5], "big") == out_id
        row = orjson.loads(value[5:])
        assert row["sentiment"] == label(row["review"]["text"])


async def test_a_protobuf_topic_is_enriched_with_one_more_string_field(
    env: Any, schema_registry_url: str
) -> None:
    settings, source_topic, out_topic, _client = env
    text = (
        'syntax = "proto3";\npackage shop;\n'
        "message Product { string name = 1; }\n"
        "message Text { string text = 1; }\n"
        "message Review {\n  string id = 1;\n  Product product = 2;\n  Text review = 3;\n"
        "  int32 stars = 4;\n}\n"
    )
    registry = RegistryClient(schema_registry_url)
    schema_id = await registry.register(f"{source_topic}-value", "PROTOBUF", text)
    schema = ProtoSchema(text)
    rows = [review_row(i) for i in range(10)]
    # message indexes [2]: Review is the third top-level message
    header = b"\x00" + schema_id.to_bytes(4, "big") + b"\x02\x04"
    records = [RawRecord(r["id"].encode(), header + schema.encode((2,), r)) for r in rows]
    tiers = source_tiers(source_topic, out_topic, format="protobuf")
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    assert len(enriched) == len(rows)
    for record in enriched:
        value = record.value or b""
        out_schema = await registry.schema(int.from_bytes(value[1:5], "big"))
        assert "string sentiment = 5;" in out_schema.text
        row = ProtoSchema(out_schema.text).decode((2,), value[7:])
        assert row["sentiment"] == label(row["review"]["text"])
        assert row["id"].encode() == record.key
    await registry.aclose()


async def test_a_nested_protobuf_message_is_enriched_in_place(env: Any, schema_registry_url: str) -> None:
    settings, source_topic, out_topic, _client = env
    text = (
        'syntax = "proto3";\npackage shop;\nmessage Product { string name = 1; }\n'
        "message Feedback {\n  message Review {\n    string id = 1;\n    Product product = 2;\n"
        "    message Text { string text = 1; }\n    Text review = 3;\n  }\n  Review review = 1;\n}\n"
    )
    registry = RegistryClient(schema_registry_url)
    schema_id = await registry.register(f"{source_topic}-value", "PROTOBUF", text)
    schema = ProtoSchema(text)
    rows = [{k: v for k, v in review_row(i).items() if k != "stars"} for i in range(6)]
    # message indexes [1, 0]: Feedback.Review
    header = b"\x00" + schema_id.to_bytes(4, "big") + b"\x04\x02\x00"
    records = [RawRecord(r["id"].encode(), header + schema.encode((1, 0), r)) for r in rows]
    tiers = source_tiers(source_topic, out_topic, format="protobuf")
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records)
        enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
    assert len(enriched) == len(rows)
    for record in enriched:
        value = record.value or b""
        assert value[5:8] == b"\x04\x02\x00"
        out_schema = ProtoSchema((await registry.schema(int.from_bytes(value[1:5], "big"))).text)
        row = out_schema.decode((1, 0), value[8:])
        assert row["sentiment"] == label(row["review"]["text"]) and row["id"].encode() == record.key
        assert "sentiment" not in out_schema.descriptor((1,)).fields_by_name
    await registry.aclose()


async def test_debezium_changes_create_update_and_delete(env: Any) -> None:
    settings, source_topic, out_topic, client = env
    row = record_of(
        "Row", id="string", product=record_of("P", name="string"), review=record_of("T", text="string")
    )
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "dbserver1.shop.reviews",
        "fields": [
            {"name": "before", "type": ["null", row], "default": None},
            {"name": "after", "type": ["null", "Row"], "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }

    def change(op: str, before: Any, after: Any) -> dict[str, Any]:
        return {"before": before, "after": after, "op": op, "ts_ms": 1}

    a1 = {"id": "a", "product": {"name": "kettle"}, "review": {"text": "good"}}
    a2 = {**a1, "review": {"text": "broke"}}
    b1 = {"id": "b", "product": {"name": "mug"}, "review": {"text": "good"}}
    changes = [("a", change("c", None, a1)), ("b", change("r", None, b1)), ("a", change("u", a1, a2)),
               ("b", change("d", b1, None))]
    values = await avro_values(client, source_topic, [c for _, c in changes], envelope)
    records = [RawRecord(k.encode(), v) for (k, _), v in zip(changes, values, strict=True)]
    tiers = source_tiers(source_topic, out_topic, format="avro", envelope="debezium", batch=False)
    deserializer = await AsyncAvroDeserializer(client, conf=SERDE_CONF)
    ctx = SerializationContext(out_topic, MessageField.VALUE)
    latest: dict[bytes | None, Any] = {}
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}) as svc:
        await produce_records(settings, source_topic, records)
        deadline = asyncio.get_running_loop().time() + 60
        # a's first version may be answered after its update was written: then it is dropped,
        # so the topic ends with three records or four
        while b"b" not in latest or latest.get(b"a", {}).get("op") != "u":
            assert asyncio.get_running_loop().time() < deadline, latest
            await asyncio.sleep(0.3)
            for record in await read_records(settings, out_topic):
                latest[record.key] = None if record.value is None else await deserializer(record.value, ctx)
        snapshot = svc.stats_snapshot()
    assert latest[b"b"] is None  # deleted: a tombstone
    assert latest[b"a"]["after"] == a2 and latest[b"a"]["op"] == "u"
    assert latest[b"a"]["sentiment"] == "negative"
    assert snapshot["sources"]["reviews"]["tombstones"] == 1


async def test_undecodable_records_are_dead_letters_and_never_block_their_partition(env: Any) -> None:
    settings, source_topic, out_topic, client = env
    good = await avro_values(client, source_topic, [review_row(1), review_row(2)], REVIEW_SCHEMA)
    records = [
        RawRecord(b"k", good[0]),
        RawRecord(b"k", b"\x07not the wire format"),
        RawRecord(b"k", b"\x00\x7f\xff\xff\xf0unknown id"),
        RawRecord(b"k", good[0][:5] + b"\xff"),  # a known id, bytes its schema cannot read
        RawRecord(b"k", good[1]),
    ]
    await produce_records(settings, source_topic, [records[0]])
    tiers = source_tiers(source_topic, out_topic, format="avro")
    async with InProcessService(settings, tiers, providers={"small": FakeProvider(fake_answer)}):
        await produce_records(settings, source_topic, records[1:])
        dead = await wait_for_records(settings, settings.dlq_topic, 3, timeout_s=60)
        enriched = await wait_for_records(settings, out_topic, 2, timeout_s=60)
    assert len(enriched) == 2
    messages = sorted(orjson.loads(r.value or b"")["error"]["message"] for r in dead)
    assert [orjson.loads(r.value or b"")["error"]["kind"] for r in dead] == ["undecodable"] * 3
    assert any("magic byte 7" in m for m in messages)
    assert any("no schema id 2147483632" in m for m in messages)
    assert any("cannot read the value" in m for m in messages)


async def test_a_registry_that_is_down_holds_the_records_and_loses_none(
    env: Any, schema_registry_url: str
) -> None:
    settings, source_topic, out_topic, client = env
    rows = [review_row(i) for i in range(8)]
    values = await avro_values(client, source_topic, rows, REVIEW_SCHEMA)
    url = urlsplit(schema_registry_url)
    async with TcpRelay(url.hostname or "127.0.0.1", url.port or 80) as relay:
        relay.disconnect()
        relayed = settings.model_copy(
            update={"schema_registry": settings.schema_registry.model_copy(
                update={"url": f"http://127.0.0.1:{relay.port}{url.path}"})}
        )
        tiers = source_tiers(source_topic, out_topic, format="avro")
        async with InProcessService(relayed, tiers, providers={"small": FakeProvider(fake_answer)}) as svc:
            await produce_records(settings, source_topic, [RawRecord(r["id"].encode(), v)
                                                           for r, v in zip(rows, values, strict=True)])
            deadline = asyncio.get_running_loop().time() + 30
            while svc.stats_snapshot()["sources"].get("reviews", {}).get("held", 0) < len(rows):
                assert asyncio.get_running_loop().time() < deadline, svc.stats_snapshot()["sources"]
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)  # a few retries against the cut registry
            assert await read_records(settings, out_topic) == []
            assert await read_records(settings, settings.dlq_topic) == []
            relay.reconnect()
            enriched = await wait_for_records(settings, out_topic, len(rows), timeout_s=60)
            snapshot = svc.stats_snapshot()
    assert {r.key for r in enriched} == {r["id"].encode() for r in rows}
    assert snapshot["sources"]["reviews"]["held"] == 0
    assert await read_records(settings, settings.dlq_topic) == []
