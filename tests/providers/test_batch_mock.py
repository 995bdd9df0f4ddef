"""The Batch API adapters against a recording HTTP server on 127.0.0.1: what is sent, splitting,
statuses, result files."""

from __future__ import annotations

import logging
import traceback
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    MalformedResponse,
    ProviderError,
    RateLimited,
    Rejected,
    RequestTimeout,
)
from consumer.core.offline import BatchRequest, BatchStatus
from consumer.providers.base import BatchProvider
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from tests.providers.recording import (
    SECRET,
    Behaviour,
    Recorder,
    Reply,
    SentRequest,
    behaving,
    client_session,
    make_request,
    recorder,
    reply,
)

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string"}},
    "required": ["a"],
    "additionalProperties": False,
}


def items(n: int, prefix: str = "job") -> list[BatchRequest]:
    return [BatchRequest(f"{prefix}-{i}", make_request(f"Classify:\ntext {i}")) for i in range(n)]


def chat_body(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "m-1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


class FakeOpenAI:
    """Just enough of the OpenAI files + batches API, with scripted result files."""

    def __init__(self) -> None:
        self.uploads: list[tuple[dict[str, str], bytes]] = []
        self.file_parts: list[tuple[str | None, str]] = []
        self.creates: list[dict[str, Any]] = []
        self.batch: dict[str, Any] = {}
        self.files: dict[str, bytes] = {}

    def __call__(self, request: SentRequest) -> Reply:
        path = request.url.path
        if request.method == "POST" and path == "/v1/files":
            msg = BytesParser(policy=HTTP).parsebytes(
                b"Content-Type: " + request.headers["content-type"].encode() + b"\r\n\r\n" + request.content
            )
            fields: dict[str, str] = {}
            content = b""
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True)
                if name == "file":
                    content = payload
                    self.file_parts.append((part.get_filename(), part.get_content_type()))
                else:
                    fields[str(name)] = payload.decode()
            self.uploads.append((fields, content))
            return reply(200, {"id": f"file-{len(self.uploads)}", "object": "file", "purpose": "batch"})
        if request.method == "POST" and path == "/v1/batches":
            body = orjson.loads(request.content)
            self.creates.append(body)
            n = len(self.creates)
            return reply(
                200,
                {
                    "id": f"batch_{n}",
                    "object": "batch",
                    "status": "validating",
                    "request_counts": {"total": 0, "completed": 0, "failed": 0},
                },
            )
        if request.method == "GET" and path.startswith("/v1/batches/"):
            return reply(200, self.batch)
        if request.method == "POST" and path.endswith("/cancel"):
            return reply(200, {**self.batch, "status": "cancelling"})
        if request.method == "GET" and path.startswith("/v1/files/"):
            return Reply(200, self.files[path.split("/")[3]])
        return reply(404, {"error": {"message": "no route", "type": "invalid_request_error"}})


def openai_batch(fake: Any, **kw: Any) -> tuple[OpenAIBatchProvider, Recorder]:
    rec = Recorder(fake)
    provider = OpenAIBatchProvider(
        rec.client(), base_url=rec.base_url + "/v1", api_key=SecretStr(SECRET), **kw
    )
    return provider, rec


async def test_openai_submit_uploads_jsonl_and_creates_batch() -> None:
    fake = FakeOpenAI()
    provider, rec = openai_batch(fake, structured_mode="json_schema")
    assert isinstance(provider, BatchProvider)
    reqs = [*items(2), BatchRequest("with-schema", make_request("Classify:\nz", answer_schema=SCHEMA))]
    jobs = await provider.submit(reqs)
    assert [j.id for j in jobs] == ["batch_1"] and jobs[0].status is BatchStatus.PENDING
    fields, content = fake.uploads[0]
    assert fields == {"purpose": "batch"}
    assert fake.file_parts == [("batch.jsonl", "application/jsonl")]
    assert rec.requests[0].headers["content-type"].startswith("multipart/form-data; boundary=")
    lines = [orjson.loads(line) for line in content.splitlines()]
    assert [line["custom_id"] for line in lines] == ["job-0", "job-1", "with-schema"]
    assert all(line["method"] == "POST" and line["url"] == "/v1/chat/completions" for line in lines)
    assert lines[0]["body"]["messages"][-1] == {"role": "user", "content": "Classify:\ntext 0"}
    assert lines[2]["body"]["response_format"]["type"] == "json_schema"  # the online body builder
    assert fake.creates == [
        {"input_file_id": "file-1", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ]
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in rec.requests)


@pytest.mark.parametrize(
    "bad",
    [
        [BatchRequest("a", make_request()), BatchRequest("a", make_request())],
        [BatchRequest("", make_request())],
        [BatchRequest("   ", make_request())],
        [],
    ],
)
async def test_bad_custom_ids_rejected_before_any_request(bad: list[BatchRequest]) -> None:
    for make in (openai_batch, anthropic_batch):
        provider, rec = make(FakeOpenAI())
        with pytest.raises(ValueError):
            await provider.submit(bad)
        assert rec.requests == []


async def test_anthropic_custom_id_format_checked_before_sending() -> None:
    provider, rec = anthropic_batch(FakeOpenAI())
    with pytest.raises(ValueError, match="does not match"):
        await provider.submit([BatchRequest("has space", make_request())])
    assert rec.requests == []


async def test_openai_split_by_count_and_bytes() -> None:
    fake = FakeOpenAI()
    provider, _ = openai_batch(fake, max_requests=2)
    jobs = await provider.submit(items(5))
    assert len(jobs) == 3
    assert [len(c.splitlines()) for _, c in fake.uploads] == [2, 2, 1]

    fake = FakeOpenAI()
    one = len(provider.jsonl_line(items(1)[0]))
    provider, _ = openai_batch(fake, max_bytes=one * 3 + 5)
    jobs = await provider.submit(items(7))
    sizes = [len(c) for _, c in fake.uploads]
    assert len(jobs) == 3 and all(s <= one * 3 + 5 for s in sizes)
    ids = [orjson.loads(line)["custom_id"] for _, c in fake.uploads for line in c.splitlines()]
    assert ids == [f"job-{i}" for i in range(7)]  # every item once, in order


async def test_openai_item_over_the_byte_limit_is_rejected_before_sending() -> None:
    provider, rec = openai_batch(FakeOpenAI(), max_bytes=50)
    with pytest.raises(ValueError, match="byte"):
        await provider.submit(items(1))
    assert rec.requests == []


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        ("validating", BatchStatus.PENDING),
        ("in_progress", BatchStatus.RUNNING),
        ("finalizing", BatchStatus.RUNNING),
        ("cancelling", BatchStatus.RUNNING),
        ("completed", BatchStatus.COMPLETED),
        ("failed", BatchStatus.FAILED),
        ("expired", BatchStatus.EXPIRED),
        ("cancelled", BatchStatus.CANCELLED),
    ],
)
async def test_openai_status_mapping(raw: str, status: BatchStatus) -> None:
    fake = FakeOpenAI()
    fake.batch = {"id": "batch_1", "status": raw, "request_counts": {"total": 4, "completed": 3, "failed": 1}}
    provider, _ = openai_batch(fake)
    job = await provider.status("batch_1")
    assert (job.status, job.total, job.completed, job.failed) == (status, 4, 3, 1)
    assert job.status.done == (status not in (BatchStatus.PENDING, BatchStatus.RUNNING))


async def test_openai_results_read_output_and_error_files() -> None:
    fake = FakeOpenAI()
    provider, _ = openai_batch(fake)
    jobs = await provider.submit(items(5))
    fake.batch = {
        "id": jobs[0].id,
        "status": "expired",
        "output_file_id": "out",
        "error_file_id": "err",
        "request_counts": {"total": 5, "completed": 2, "failed": 2},
    }
    fake.files["out"] = (
        b"\n".join(
            orjson.dumps(
                {
                    "id": f"r{i}",
                    "custom_id": f"job-{i}",
                    "error": None,
                    "response": {
                        "status_code": 200,
                        "request_id": f"req_{i}",
                        "body": chat_body(f"answer {i}"),
                    },
                }
            )
            for i in (0, 1)
        )
        + b"\n"
    )
    fake.files["err"] = b"\n".join(
        [
            orjson.dumps(
                {
                    "id": "r2",
                    "custom_id": "job-2",
                    "error": None,
                    "response": {
                        "status_code": 400,
                        "request_id": "req_2",
                        "body": {"error": {"message": "bad item", "type": "invalid_request_error"}},
                    },
                }
            ),
            orjson.dumps(
                {
                    "id": "r3",
                    "custom_id": "job-3",
                    "response": None,
                    "error": {"code": "batch_expired", "message": "not run before the window expired"},
                }
            ),
        ]
    )
    results = {r.custom_id: r for r in await provider.results(jobs[0].id)}
    assert set(results) == {"job-0", "job-1", "job-2", "job-3", "job-4"}
    assert results["job-0"].ok and results["job-0"].completion.text == "answer 0"  # type: ignore[union-attr]
    assert results["job-1"].completion.request_id == "req_1"  # type: ignore[union-attr]
    assert isinstance(results["job-2"].error, Rejected) and "bad item" in results["job-2"].error.message
    assert not results["job-2"].expired
    assert results["job-3"].expired and results["job-3"].error is not None
    # job-4 is in neither file: the batch expired, so it is reported expired
    assert results["job-4"].expired and not results["job-4"].ok


async def test_openai_results_item_errors_map_like_online_errors() -> None:
    fake = FakeOpenAI()
    provider, _ = openai_batch(fake)
    fake.batch = {"id": "b", "status": "completed", "error_file_id": "err", "output_file_id": "out"}
    fake.files["err"] = orjson.dumps(
        {
            "custom_id": "x",
            "response": {
                "status_code": 429,
                "body": {"error": {"message": "slow", "type": "requests", "code": "rate_limit_exceeded"}},
            },
        }
    )
    fake.files["out"] = orjson.dumps(
        {"custom_id": "y", "response": {"status_code": 200, "body": {"nope": 1}}}
    )
    results = {r.custom_id: r for r in await provider.results("b")}
    assert isinstance(results["x"].error, RateLimited)
    assert isinstance(results["y"].error, MalformedResponse)


async def test_openai_unreadable_result_lines_cost_only_themselves(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeOpenAI()
    provider, _ = openai_batch(fake)
    jobs = await provider.submit(items(4))
    fake.batch = {"id": jobs[0].id, "status": "completed", "output_file_id": "out"}
    good = [
        {"custom_id": f"job-{i}", "response": {"status_code": 200, "body": chat_body(f"answer {i}")}}
        for i in (0, 1)
    ]
    odd_status = {"custom_id": "job-2", "response": {"status_code": "two hundred", "body": {}}}
    fake.files["out"] = b"\n".join(
        [
            orjson.dumps(good[0]),
            b"{cut",
            orjson.dumps({"response": {}}),
            orjson.dumps(odd_status),
            orjson.dumps(good[1]),
        ]
    )
    results = {r.custom_id: r for r in await provider.results(jobs[0].id)}
    assert results["job-0"].completion is not None and results["job-0"].completion.text == "answer 0"
    assert results["job-1"].completion is not None and results["job-1"].completion.text == "answer 1"
    assert isinstance(results["job-2"].error, MalformedResponse)
    # job-3's line was one of the unreadable ones: reported like a request the file left out
    assert results["job-3"].error is not None and not results["job-3"].ok
    skipped = [r.getMessage() for r in caplog.records if "results line" in r.getMessage()]
    assert [m.split(":")[1].strip() for m in skipped] == ["results line 2 skipped", "results line 3 skipped"]


async def test_openai_cancel_and_http_errors() -> None:
    fake = FakeOpenAI()
    fake.batch = {"id": "b", "status": "in_progress"}
    provider, rec = openai_batch(fake)
    job = await provider.cancel("b")
    assert job.status is BatchStatus.RUNNING and rec.requests[-1].url.path == "/v1/batches/b/cancel"
    denied = Recorder(lambda _r: reply(401, {"error": {"message": "no", "type": "invalid_request_error"}}))
    provider = OpenAIBatchProvider(
        denied.client(), base_url=denied.base_url + "/v1", api_key=SecretStr(SECRET)
    )
    with pytest.raises(AuthFailed) as info:
        await provider.submit(items(1))
    assert SECRET not in str(info.value)


# ---------------------------------------------------------------- Anthropic


def message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "m-1",
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": text}],
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }


class FakeAnthropic:
    def __init__(self) -> None:
        self.creates: list[dict[str, Any]] = []
        self.batch: dict[str, Any] = {}
        self.results = b""

    def __call__(self, request: SentRequest) -> Reply:
        path = request.url.path
        if request.method == "POST" and path == "/v1/messages/batches":
            self.creates.append(orjson.loads(request.content))
            return reply(
                200,
                {
                    "id": f"msgbatch_{len(self.creates)}",
                    "type": "message_batch",
                    "processing_status": "in_progress",
                    "request_counts": {"processing": len(self.creates[-1]["requests"])},
                },
            )
        if path.endswith("/results"):
            return Reply(200, self.results)
        if request.method == "POST" and path.endswith("/cancel"):
            return reply(200, {**self.batch, "processing_status": "canceling"})
        if request.method == "GET" and path.startswith("/v1/messages/batches/"):
            return reply(200, self.batch)
        return reply(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})


def anthropic_batch(fake: Any, **kw: Any) -> tuple[AnthropicBatchProvider, Recorder]:
    rec = Recorder(fake)
    provider = AnthropicBatchProvider(rec.client(), base_url=rec.base_url, api_key=SecretStr(SECRET), **kw)
    return provider, rec


async def test_anthropic_submit_inline_params() -> None:
    fake = FakeAnthropic()
    provider, rec = anthropic_batch(fake)
    reqs = [*items(2), BatchRequest("s", make_request(answer_schema=SCHEMA, options={"max_tokens": 9}))]
    jobs = await provider.submit(reqs)
    assert jobs[0].id == "msgbatch_1" and jobs[0].status is BatchStatus.RUNNING and jobs[0].total == 3
    sent = fake.creates[0]["requests"]
    assert [r["custom_id"] for r in sent] == ["job-0", "job-1", "s"]
    assert sent[0]["params"]["system"] == "Be brief." and sent[0]["params"]["max_tokens"] == 1024
    assert sent[2]["params"]["tool_choice"] == {"type": "tool", "name": "answer"}  # the online body builder
    assert sent[2]["params"]["max_tokens"] == 9
    assert rec.requests[0].headers["x-api-key"] == SECRET


async def test_anthropic_split_by_count_and_bytes() -> None:
    fake = FakeAnthropic()
    provider, _ = anthropic_batch(fake, max_requests=3)
    assert len(await provider.submit(items(7))) == 3
    assert [len(c["requests"]) for c in fake.creates] == [3, 3, 1]
    fake = FakeAnthropic()
    provider, rec = anthropic_batch(fake, max_bytes=600)
    await provider.submit(items(6))
    assert len(fake.creates) > 1
    assert all(len(r.content) <= 600 for r in rec.requests)
    assert [x["custom_id"] for c in fake.creates for x in c["requests"]] == [f"job-{i}" for i in range(6)]


@pytest.mark.parametrize(
    ("batch", "status"),
    [
        ({"processing_status": "in_progress", "request_counts": {"processing": 3}}, BatchStatus.RUNNING),
        ({"processing_status": "canceling", "request_counts": {"processing": 3}}, BatchStatus.RUNNING),
        (
            {"processing_status": "ended", "request_counts": {"succeeded": 2, "errored": 1}},
            BatchStatus.COMPLETED,
        ),
        (
            {
                "processing_status": "ended",
                "cancel_initiated_at": "2026-01-01T00:00:00Z",
                "request_counts": {"canceled": 3},
            },
            BatchStatus.CANCELLED,
        ),
        ({"processing_status": "ended", "request_counts": {"expired": 3}}, BatchStatus.EXPIRED),
    ],
)
async def test_anthropic_status_mapping(batch: dict[str, Any], status: BatchStatus) -> None:
    fake = FakeAnthropic()
    fake.batch = {"id": "b", "type": "message_batch", **batch}
    provider, _ = anthropic_batch(fake)
    job = await provider.status("b")
    assert job.status is status and job.total == 3


async def test_anthropic_results_all_kinds() -> None:
    fake = FakeAnthropic()
    provider, rec = anthropic_batch(fake)
    await provider.submit(items(4))
    fake.batch = {
        "id": "msgbatch_1",
        "processing_status": "ended",
        "request_counts": {"succeeded": 1, "errored": 1, "canceled": 1, "expired": 1},
        "results_url": rec.base_url + "/v1/messages/batches/msgbatch_1/results",
    }
    fake.results = b"\n".join(
        orjson.dumps(x)
        for x in [
            {"custom_id": "job-0", "result": {"type": "succeeded", "message": message("ok 0")}},
            {
                "custom_id": "job-1",
                "result": {
                    "type": "errored",
                    "error": {
                        "type": "error",
                        "error": {"type": "invalid_request_error", "message": "prompt is too long"},
                    },
                },
            },
            {"custom_id": "job-2", "result": {"type": "canceled"}},
            {"custom_id": "job-3", "result": {"type": "expired"}},
        ]
    )
    results = {r.custom_id: r for r in await provider.results("msgbatch_1")}
    assert results["job-0"].completion is not None and results["job-0"].completion.text == "ok 0"
    assert (
        isinstance(results["job-1"].error, Rejected)
        and "prompt is too long" in results["job-1"].error.message
    )
    assert isinstance(results["job-2"].error, ProviderError) and not results["job-2"].expired
    assert results["job-3"].expired
    assert rec.requests[-1].headers["x-api-key"] == SECRET


async def test_anthropic_unreadable_result_lines_cost_only_themselves() -> None:
    fake = FakeAnthropic()
    provider, rec = anthropic_batch(fake)
    await provider.submit(items(2))
    fake.batch = {
        "id": "msgbatch_1",
        "processing_status": "ended",
        "results_url": rec.base_url + "/v1/messages/batches/msgbatch_1/results",
    }
    fake.results = b"\n".join(
        [
            b"not json",
            orjson.dumps({"custom_id": "job-0", "result": {"type": "succeeded", "message": message("ok 0")}}),
            orjson.dumps({"custom_id": "job-9", "result": "succeeded"}),
            orjson.dumps({"custom_id": "job-1", "result": {"type": "errored", "error": "overloaded"}}),
        ]
    )
    results = {r.custom_id: r for r in await provider.results("msgbatch_1")}
    assert set(results) == {"job-0", "job-1"}
    assert results["job-0"].completion is not None and results["job-0"].completion.text == "ok 0"
    assert isinstance(results["job-1"].error, ProviderError)


async def test_anthropic_results_url_on_another_origin_is_not_sent_the_key() -> None:
    fake = FakeAnthropic()
    provider, rec = anthropic_batch(fake)
    evil = recorder(200, b"")  # another origin: same host, another port
    fake.batch = {
        "id": "b",
        "processing_status": "ended",
        "request_counts": {"succeeded": 1},
        "results_url": evil.base_url + "/steal",
    }
    fake.results = orjson.dumps({"custom_id": "a", "result": {"type": "succeeded", "message": message("x")}})
    results = await provider.results("b")
    assert results[0].ok
    assert evil.requests == []
    assert all(r.url.port == rec.port for r in rec.requests)
    assert rec.requests[-1].url.path == "/v1/messages/batches/b/results"


async def test_anthropic_unfinished_batch_has_no_results_and_cancel() -> None:
    fake = FakeAnthropic()
    fake.batch = {"id": "b", "processing_status": "in_progress", "request_counts": {"processing": 2}}
    provider, rec = anthropic_batch(fake)
    assert await provider.results("b") == []
    job = await provider.cancel("b")
    assert job.status is BatchStatus.RUNNING and rec.requests[-1].url.path == "/v1/messages/batches/b/cancel"


async def test_malformed_batch_object() -> None:
    fake = FakeAnthropic()
    fake.batch = {"id": "b", "processing_status": "weird"}
    provider, _ = anthropic_batch(fake)
    with pytest.raises(MalformedResponse):
        await provider.status("b")
    fake2 = FakeOpenAI()
    fake2.batch = {"status": "completed"}
    provider2, _ = openai_batch(fake2)
    with pytest.raises(MalformedResponse):
        await provider2.status("b")


async def test_batch_adapters_never_leak_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    echo_openai = {"error": {"message": f"bad key {SECRET}", "type": "invalid_request_error"}}
    echo_anthropic = {
        "type": "error",
        "error": {"type": "authentication_error", "message": f"bad key {SECRET}"},
    }
    for cls, path, body in (
        (OpenAIBatchProvider, "/v1", echo_openai),
        (AnthropicBatchProvider, "", echo_anthropic),
    ):
        rec = Recorder(lambda _r, body=body: reply(401, body))
        provider = cls(rec.client(), base_url=rec.base_url + path, api_key=SecretStr(SECRET))
        seen += [repr(provider), str(provider)]
        for call in (
            provider.submit(items(2)),
            provider.status("b"),
            provider.results("b"),
            provider.cancel("b"),
        ):
            with pytest.raises(AuthFailed) as info:
                await call
            seen += [str(info.value), repr(info.value)]
        sent = rec.requests[0].headers
        assert SECRET in sent.get("authorization", "") + sent.get("x-api-key", "")
    seen += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert caplog.records
    assert all(SECRET not in text for text in seen)


@pytest.mark.parametrize(
    ("behaviour", "cls"),
    [
        (Behaviour.HANG, RequestTimeout),
        (Behaviour.DROP, ConnectionFailed),
        (Behaviour.GARBAGE, ConnectionFailed),
        (Behaviour.TRUNCATE, ConnectionFailed),
    ],
)
async def test_batch_transport_failures_map_and_never_leak_the_key(
    behaviour: Behaviour, cls: type[ProviderError], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for provider_cls, path in ((OpenAIBatchProvider, "/v1"), (AnthropicBatchProvider, "")):
        rec = behaving(behaviour)
        provider = provider_cls(client_session(0.3), base_url=rec.base_url + path, api_key=SecretStr(SECRET))
        for call in (
            provider.submit(items(2)),
            provider.status("b"),
            provider.results("b"),
            provider.cancel("b"),
        ):
            with pytest.raises(cls) as info:
                await call
            # nothing chains back to aiohttp's exception (its request_info holds our headers)
            assert info.value.__cause__ is None and info.value.__context__ is None
            seen += [str(info.value), repr(info.value), "".join(traceback.format_exception(info.value))]
        # each call reached the server (aiohttp resends a GET once when the server hangs up on it)
        assert {(r.method, r.url.path.removeprefix("/v1")) for r in rec.requests} == (
            {("POST", "/files"), ("GET", "/batches/b"), ("POST", "/batches/b/cancel")}
            if provider_cls is OpenAIBatchProvider
            else {
                ("POST", "/messages/batches"),
                ("GET", "/messages/batches/b"),
                ("POST", "/messages/batches/b/cancel"),
            }
        )
        sent = rec.requests[0].headers
        assert SECRET in sent.get("authorization", "") + sent.get("x-api-key", "")
    seen += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert caplog.records
    assert [text for text in seen if SECRET in text] == []


@pytest.mark.parametrize("behaviour", [Behaviour.DROP, Behaviour.TRUNCATE])
async def test_openai_result_file_download_cut_is_a_connection_failure(behaviour: Behaviour) -> None:
    fake = FakeOpenAI()
    fake.batch = {"id": "b", "status": "completed", "output_file_id": "out"}
    fake.files["out"] = orjson.dumps(
        {"custom_id": "x", "response": {"status_code": 200, "body": chat_body("a")}}
    )
    rec = Recorder(lambda r: behaviour if r.url.path.startswith("/v1/files/") else fake(r))
    provider = OpenAIBatchProvider(rec.client(), base_url=rec.base_url + "/v1", api_key=SecretStr(SECRET))
    with pytest.raises(ConnectionFailed):
        await provider.results("b")
    # (aiohttp resends a GET once when the server hangs up on it)
    assert {r.url.path for r in rec.requests} == {"/v1/batches/b", "/v1/files/out/content"}
    rec.respond = fake  # the same download, answered in full
    [item] = await provider.results("b")
    assert item.ok and item.completion is not None and item.completion.text == "a"


async def test_openai_batch_requests_are_kept_until_its_results_are_read() -> None:
    """A results download that fails keeps the batch's requests: the next call still reports the
    request neither file mentions; once read, a finished batch's requests are forgotten."""
    fake = FakeOpenAI()

    def respond(request: SentRequest) -> Reply | Behaviour:
        if request.method == "GET" and request.url.path.startswith("/v1/files/"):
            return Behaviour.DROP
        return fake(request)

    rec = Recorder(respond)
    provider = OpenAIBatchProvider(rec.client(), base_url=rec.base_url + "/v1", api_key=SecretStr(SECRET))
    [job] = await provider.submit(items(2))
    fake.batch = {"id": job.id, "status": "completed", "output_file_id": "out"}
    fake.files["out"] = orjson.dumps(
        {"custom_id": "job-0", "response": {"status_code": 200, "body": chat_body("a")}}
    )
    with pytest.raises(ConnectionFailed):
        await provider.results(job.id)
    rec.respond = fake
    results = {r.custom_id: r for r in await provider.results(job.id)}
    assert results["job-0"].ok
    assert not results["job-1"].ok and not results["job-1"].expired
    assert [r.custom_id for r in await provider.results(job.id)] == ["job-0"]
