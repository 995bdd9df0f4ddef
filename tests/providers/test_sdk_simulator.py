"""The official openai and anthropic SDKs against the simulator over real HTTP (127.0.0.1).

This is what proves the simulator speaks the real wire formats. Besides the SDKs' own parsing
(which is lenient), the raw JSON is validated strictly with the SDKs' pydantic models.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

KEY = "sim-test-key-0001"
BATCH_SIZE = 12
POLLS = 200  # bounded polling: 200 x 20 ms at most


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    config = SimulatorConfig(
        seed=7, api_key=KEY, batch_delay_s=0.2, batch_error_rate=0.25, batch_expire_rate=0.25
    )
    with run_simulator(config) as url:
        yield url


def test_openai_chat_and_structured(sim_url: str) -> None:
    client = openai.OpenAI(base_url=sim_url + "/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(
        model="gpt-sim",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say:\nhello"}],
    )
    assert chat.choices[0].message.content == answer_for("hello")
    assert chat.choices[0].finish_reason == "stop" and chat.model == "gpt-sim"
    assert chat.usage is not None and chat.usage.prompt_tokens > 0

    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["pos", "neg"]}},
        "required": ["label"],
        "additionalProperties": False,
    }
    structured = client.chat.completions.create(
        model="gpt-sim",
        messages=[{"role": "user", "content": "Say:\nhello"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert orjson.loads(structured.choices[0].message.content or "")["label"] in ("pos", "neg")

    tool = client.chat.completions.create(
        model="gpt-sim",
        messages=[{"role": "user", "content": "Say:\nhello"}],
        tools=[{"type": "function", "function": {"name": "answer", "parameters": schema}}],
        tool_choice={"type": "function", "function": {"name": "answer"}},
    )
    call = tool.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "answer" and orjson.loads(call.function.arguments)["label"] in ("pos", "neg")

    raw = httpx.post(
        sim_url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    ChatCompletion.model_validate(raw.json(), strict=False)

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=sim_url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )


def test_openai_batch_round_trip(sim_url: str) -> None:
    client = openai.OpenAI(base_url=sim_url + "/v1", api_key=KEY, max_retries=0)
    lines = b"".join(
        orjson.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-sim", "messages": [{"role": "user", "content": f"Say:\nitem {i}"}]},
            }
        )
        + b"\n"
        for i in range(BATCH_SIZE)
    )
    uploaded = client.files.create(file=("batch.jsonl", io.BytesIO(lines)), purpose="batch")
    FileObject.model_validate(uploaded.model_dump())
    assert uploaded.purpose == "batch" and uploaded.bytes == len(lines)

    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.input_file_id == uploaded.id
    seen = {batch.status}
    for _ in range(POLLS):
        batch = client.batches.retrieve(batch.id)
        seen.add(batch.status)
        if batch.status in ("completed", "expired", "failed", "cancelled"):
            break
        time.sleep(0.02)
    Batch.model_validate(batch.model_dump())
    assert batch.status in ("completed", "expired")
    assert batch.request_counts is not None and batch.request_counts.total == BATCH_SIZE
    assert batch.output_file_id and batch.error_file_id

    answered: dict[str, str] = {}
    for line in client.files.content(batch.output_file_id).text.splitlines():
        record = orjson.loads(line)
        assert record["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(record["response"]["body"])
        answered[record["custom_id"]] = completion.choices[0].message.content or ""
    errors: dict[str, str] = {}
    for line in client.files.content(batch.error_file_id).text.splitlines():
        record = orjson.loads(line)
        errors[record["custom_id"]] = (
            record["error"]["code"] if record["error"] else str(record["response"]["status_code"])
        )
    assert set(answered) | set(errors) == {f"c{i}" for i in range(BATCH_SIZE)}
    assert not set(answered) & set(errors)
    assert all(answered[c] == answer_for(f"item {c[1:]}") for c in answered)
    assert set(errors.values()) <= {"batch_expired", "400"} and errors
    assert batch.request_counts.completed == len(answered) and batch.request_counts.failed == len(errors)


def test_openai_batch_cancel() -> None:
    with run_simulator(SimulatorConfig(api_key=KEY, batch_delay_s=3600)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        line = orjson.dumps(
            {
                "custom_id": "c0",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            }
        )
        uploaded = client.files.create(file=("b.jsonl", io.BytesIO(line)), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert client.batches.retrieve(batch.id).status == "in_progress"
        cancelled = client.batches.cancel(batch.id)
        assert cancelled.status == "cancelled" and cancelled.output_file_id is None
        assert client.batches.retrieve(batch.id).status == "cancelled"


def test_anthropic_messages_and_tool(sim_url: str) -> None:
    client = anthropic.Anthropic(base_url=sim_url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="claude-sim",
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say:\nhello"}],
    )
    assert message.content[0].type == "text" and message.content[0].text == answer_for("hello")
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0

    schema = {"type": "object", "properties": {"a1": {"type": "string"}}, "required": ["a1"]}
    batched_prompt = 'Do:\n[{"id":"a1","input":"first"}]'
    forced = client.messages.create(
        model="claude-sim",
        max_tokens=100,
        messages=[{"role": "user", "content": batched_prompt}],
        tools=[{"name": "answer", "description": "d", "input_schema": schema}],
        tool_choice={"type": "tool", "name": "answer"},
    )
    block = forced.content[0]
    assert block.type == "tool_use" and block.input == {"a1": answer_for("first")}
    assert forced.stop_reason == "tool_use"

    cut = client.messages.create(
        model="claude-sim", max_tokens=2, messages=[{"role": "user", "content": "Say:\nhello"}]
    )
    assert cut.stop_reason == "max_tokens"

    raw = httpx.post(
        sim_url + "/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    )
    Message.model_validate(raw.json())
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=sim_url, api_key="wrong", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )


def test_anthropic_batch_round_trip(sim_url: str) -> None:
    client = anthropic.Anthropic(base_url=sim_url, api_key=KEY, max_retries=0)
    requests = [
        {
            "custom_id": f"c{i}",
            "params": {
                "model": "claude-sim",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": f"Say:\nitem {i}"}],
            },
        }
        for i in range(BATCH_SIZE)
    ]
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == BATCH_SIZE
    for _ in range(POLLS):
        batch = client.messages.batches.retrieve(batch.id)
        if batch.processing_status == "ended":
            break
        time.sleep(0.02)
    MessageBatch.model_validate(batch.model_dump())
    assert batch.processing_status == "ended" and batch.results_url
    counts = batch.request_counts
    assert counts.succeeded + counts.errored + counts.expired == BATCH_SIZE
    kinds: dict[str, str] = {}
    for result in client.messages.batches.results(batch.id):
        MessageBatchIndividualResponse.model_validate(result.model_dump())
        kinds[result.custom_id] = result.result.type
        if result.result.type == "succeeded":
            text = result.result.message.content[0]
            assert text.type == "text" and text.text == answer_for(f"item {result.custom_id[1:]}")
        elif result.result.type == "errored":
            assert result.result.error.error.type == "invalid_request_error"
    assert set(kinds) == {f"c{i}" for i in range(BATCH_SIZE)}
    assert sum(k == "succeeded" for k in kinds.values()) == counts.succeeded
    assert sum(k == "errored" for k in kinds.values()) == counts.errored
    assert sum(k == "expired" for k in kinds.values()) == counts.expired
    assert counts.errored and counts.expired  # seeded: both fault kinds happen


def test_anthropic_batch_cancel() -> None:
    with run_simulator(SimulatorConfig(api_key=KEY, batch_delay_s=3600)) as url:
        client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        params = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        batch = client.messages.batches.create(
            requests=[{"custom_id": f"c{i}", "params": params} for i in range(3)]
        )  # type: ignore[misc]
        assert client.messages.batches.retrieve(batch.id).processing_status == "in_progress"
        cancelled = client.messages.batches.cancel(batch.id)
        assert cancelled.processing_status == "ended" and cancelled.cancel_initiated_at is not None
        assert cancelled.request_counts.canceled == 3
        assert [r.result.type for r in client.messages.batches.results(batch.id)] == ["canceled"] * 3


# ----------------------------------------------------------------------------------------------
# refusals: the simulator answers 400 where the real APIs do, in each provider's error shape

USER = [{"role": "user", "content": "Say:\nhello"}]


def _stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/_sim/stats").json())


@pytest.mark.parametrize(
    ("changes", "message", "param", "code"),
    [
        (
            {"messages": []},
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        ),
        ({"model": openai.omit}, "you must provide a model parameter", None, None),
        (
            {"max_tokens": 0},
            "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead.",
            "max_tokens",
            "integer_below_min_value",
        ),
        (
            {"max_completion_tokens": -3},
            "Invalid 'max_completion_tokens': integer below minimum value. Expected a value >= 1, "
            "but got -3 instead.",
            "max_completion_tokens",
            "integer_below_min_value",
        ),
        (
            {"messages": [{"role": "system", "content": "Be brief."}, {"role": "model", "content": "x"}]},
            "Invalid value: 'model'. Supported values are: 'system', 'assistant', 'user', 'function', "
            "'tool', and 'developer'.",
            "messages[1].role",
            "invalid_value",
        ),
    ],
    ids=["empty_messages", "no_model", "max_tokens_0", "max_completion_tokens_negative", "unknown_role"],
)
def test_openai_refuses_what_the_api_refuses(
    sim_url: str, changes: dict[str, Any], message: str, param: str | None, code: str | None
) -> None:
    client = openai.OpenAI(base_url=sim_url + "/v1", api_key=KEY, max_retries=0)
    before = _stats(sim_url)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**{"model": "gpt-sim", "messages": USER, **changes})
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
    after = _stats(sim_url)
    assert after["requests"] == before["requests"] + 1  # counted, never answered
    assert after["items_answered"] == before["items_answered"]


def test_openai_accepts_every_role_it_knows(sim_url: str) -> None:
    client = openai.OpenAI(base_url=sim_url + "/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(
        model="gpt-sim",
        max_completion_tokens=1000,
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": "Answer in English."},
            {"role": "user", "content": "Say:\nfirst"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "Say:\nhello"},
        ],
    )
    assert chat.choices[0].message.content == answer_for("hello")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"messages": []}, "messages: at least one message is required"),
        ({"model": anthropic.omit}, "model: Field required"),
        ({"max_tokens": -1}, "max_tokens: Input should be greater than or equal to 0"),
        (
            {"messages": [{"role": "system", "content": "Be brief."}, *USER]},
            'messages: Unexpected role "system". The Messages API accepts a top-level `system` '
            'parameter, not "system" as an input message role.',
        ),
        (
            {"messages": [*USER, {"role": "tool", "content": "x"}]},
            "messages.1.role: Input should be 'user' or 'assistant'",
        ),
    ],
    ids=["empty_messages", "no_model", "max_tokens_negative", "system_role", "unknown_role"],
)
def test_anthropic_refuses_what_the_api_refuses(sim_url: str, changes: dict[str, Any], message: str) -> None:
    client = anthropic.Anthropic(base_url=sim_url, api_key=KEY, max_retries=0)
    before = _stats(sim_url)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**{"model": "claude-sim", "max_tokens": 50, "messages": USER, **changes})
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }
    after = _stats(sim_url)
    assert after["requests"] == before["requests"] + 1
    assert after["items_answered"] == before["items_answered"]


def test_anthropic_requires_max_tokens(sim_url: str) -> None:
    # messages.create computes its timeout from max_tokens, so the body goes out through post()
    client = anthropic.Anthropic(base_url=sim_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.post("/v1/messages", body={"model": "claude-sim", "messages": USER}, cast_to=Message)
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


def test_anthropic_max_tokens_0_generates_nothing(sim_url: str) -> None:
    # the Messages API takes max_tokens 0 to fill the prompt cache without generating
    client = anthropic.Anthropic(base_url=sim_url, api_key=KEY, max_retries=0)
    message = client.messages.create(model="claude-sim", max_tokens=0, messages=USER)
    assert message.content == [] and message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 0 and message.usage.input_tokens > 0


def test_openai_batch_reports_each_refused_line_in_the_error_file() -> None:
    bodies: dict[str, dict[str, Any]] = {
        "ok": {"model": "gpt-sim", "messages": [{"role": "user", "content": "Say:\nitem ok"}]},
        "empty": {"model": "gpt-sim", "messages": []},
        "no_model": {"messages": USER},
        "max_tokens_0": {"model": "gpt-sim", "messages": USER, "max_tokens": 0},
        "bad_role": {"model": "gpt-sim", "messages": [{"role": "robot", "content": "x"}]},
    }
    expected = {
        "empty": ("messages", "empty_array"),
        "no_model": (None, None),
        "max_tokens_0": ("max_tokens", "integer_below_min_value"),
        "bad_role": ("messages[0].role", "invalid_value"),
    }
    lines = b"".join(
        orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
        + b"\n"
        for cid, body in bodies.items()
    )
    with run_simulator(SimulatorConfig(api_key=KEY)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        uploaded = client.files.create(file=("batch.jsonl", io.BytesIO(lines)), purpose="batch")
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch = client.batches.retrieve(created.id)  # batch_delay_s 0: ended at the first look
        assert batch.status == "completed" and batch.output_file_id and batch.error_file_id
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (1, len(expected))
        outputs = [orjson.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
        errors = [orjson.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert [o["custom_id"] for o in outputs] == ["ok"]
    completion = ChatCompletion.model_validate(outputs[0]["response"]["body"])
    assert completion.choices[0].message.content == answer_for("item ok")
    refused = {}
    for record in errors:
        assert record["error"] is None and record["response"]["status_code"] == 400
        error = record["response"]["body"]["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        refused[record["custom_id"]] = (error["param"], error["code"])
    assert refused == expected


def test_anthropic_batch_ends_each_refused_request_errored() -> None:
    params: dict[str, dict[str, Any]] = {
        "ok": {
            "model": "claude-sim",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "Say:\nitem"}],
        },
        "empty": {"model": "claude-sim", "max_tokens": 50, "messages": []},
        "no_max_tokens": {"model": "claude-sim", "messages": USER},
        "max_tokens_0": {"model": "claude-sim", "max_tokens": 0, "messages": USER},
        "system_role": {
            "model": "claude-sim",
            "max_tokens": 50,
            "messages": [{"role": "system", "content": "x"}],
        },
    }
    expected = {
        "empty": "messages: at least one message is required",
        "no_max_tokens": "max_tokens: Field required",
        # max_tokens 0 only fills the prompt cache, which a batch cannot use: refused there
        "max_tokens_0": "max_tokens: Input should be greater than or equal to 1",
        "system_role": 'messages: Unexpected role "system". The Messages API accepts a top-level '
        '`system` parameter, not "system" as an input message role.',
    }
    with run_simulator(SimulatorConfig(api_key=KEY)) as url:
        client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
        requests = [{"custom_id": cid, "params": p} for cid, p in params.items()]
        created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
        batch = client.messages.batches.retrieve(created.id)  # batch_delay_s 0: ended at the first look
        assert batch.processing_status == "ended"
        assert (batch.request_counts.succeeded, batch.request_counts.errored) == (1, len(expected))
        results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    ok = results.pop("ok")
    assert ok.type == "succeeded"
    assert ok.message.content[0].type == "text" and ok.message.content[0].text == answer_for("item")
    refused = {}
    for cid, result in results.items():
        assert result.type == "errored" and result.error.error.type == "invalid_request_error"
        refused[cid] = result.error.error.message
    assert refused == expected
