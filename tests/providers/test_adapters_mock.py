"""The online adapters against a recording HTTP server on 127.0.0.1: bodies sent, answers read,
errors mapped (status codes and real transport failures), no key leaks."""

from __future__ import annotations

import logging
import sys
import time
import traceback
from email.utils import formatdate
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    MalformedResponse,
    Overloaded,
    ProviderError,
    QuotaExhausted,
    RateLimited,
    Rejected,
    RequestTimeout,
    ServerError,
)
from consumer.providers.anthropic import AnthropicProvider
from consumer.providers.base import CompletionProvider
from consumer.providers.keys import ApiKey, CommandKey, FileKey
from consumer.providers.openai import OpenAIProvider
from consumer.providers.openai_compat import OpenAICompatProvider
from tests.providers.recording import (
    SECRET,
    Behaviour,
    Recorder,
    behaving,
    client_session,
    closed_port_url,
    make_request,
    recorder,
    unaccepting_url,
)

OPENAI_OK = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m-1-2024",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "positive"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13},
}
ANTHROPIC_OK = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m-1-2024",
    "content": [{"type": "text", "text": "posi"}, {"type": "text", "text": "tive"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 11, "output_tokens": 2},
}
SCHEMA = {
    "type": "object",
    "properties": {"a1": {"type": "string"}, "b2": {"type": "string"}},
    "required": ["a1", "b2"],
    "additionalProperties": False,
}


def openai(rec: Recorder, **kw: Any) -> OpenAIProvider:
    return OpenAIProvider(rec.client(), base_url=rec.base_url + "/v1", api_key=SecretStr(SECRET), **kw)


def compat(rec: Recorder, **kw: Any) -> OpenAICompatProvider:
    return OpenAICompatProvider(rec.client(), base_url=rec.base_url + "/v1", **kw)


def anthropic(rec: Recorder, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(rec.client(), base_url=rec.base_url, api_key=SecretStr(SECRET), **kw)


def at_url(name: str, base_url: str, *, timeout_s: float = 10.0, key: ApiKey = None) -> Any:
    """The adapter `name` on `base_url` (an origin; `/v1` added for the OpenAI shapes), with
    `key` (default: SECRET as a static key)."""
    client = client_session(timeout_s)
    api_key = key if key is not None else SecretStr(SECRET)
    if name == "anthropic":
        return AnthropicProvider(client, base_url=base_url, api_key=api_key)
    if name == "openai_compat":
        return OpenAICompatProvider(client, base_url=base_url + "/v1", api_key=api_key)
    return OpenAIProvider(client, base_url=base_url + "/v1", api_key=api_key)


def key_of_kind(kind: str, directory: Path) -> ApiKey:
    """SECRET as the tier file's key kinds give it: `api_key_env` (a static key),
    `api_key_file` (a FileKey), `api_key_command` (a CommandKey printing it as JSON)."""
    if kind == "api_key_env":
        return SecretStr(SECRET)
    if kind == "api_key_file":
        path = directory / "key"
        path.write_text(SECRET + "\n")
        source = FileKey(str(path), "tiers.t")
        source.prime()
        return source
    script = f"import json; print(json.dumps({{'token': {SECRET!r}, 'expires_at': 4102444800}}))"
    command = CommandKey([sys.executable, "-c", script], "tiers.t", timeout_s=10)
    command.prime()
    return command


def openai_error(message: str, etype: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


def anthropic_error(message: str, etype: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": etype, "message": message}}


# ---------------------------------------------------------------- success


async def test_openai_success_body_and_answer() -> None:
    rec = recorder(200, OPENAI_OK, {"x-request-id": "req_9"})
    provider = openai(rec)
    request = make_request(options={"temperature": 0, "max_tokens": 5, "seed": 1, "top_p": None})
    completion = await provider.complete(request)
    assert completion.text == "positive"
    assert completion.finish_reason == "stop"
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (11, 2)
    assert completion.provider == "openai" and completion.model == "m-1-2024"
    assert completion.request_id == "req_9"
    assert completion.latency_ms >= 0
    sent = rec.requests[0]
    assert str(sent.url) == rec.base_url + "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {SECRET}"
    body = rec.json()
    assert body == {
        "model": "m-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Classify:\nhello"},
        ],
        "temperature": 0,
        "max_tokens": 5,
        "seed": 1,
    }
    assert isinstance(provider, CompletionProvider)


async def test_answer_headers_are_case_insensitive_and_carry_the_budget() -> None:
    """Request id and rate-limit budget come from the answer's headers, whatever their case."""
    headers = {
        "X-Request-ID": "req_C",
        "X-RateLimit-Remaining-Requests": "59",
        "X-RateLimit-Reset-Requests": "1s",
    }
    completion = await openai(recorder(200, OPENAI_OK, headers)).complete(make_request())
    assert completion.request_id == "req_C"
    assert completion.rate_limit is not None
    assert completion.rate_limit.remaining_requests == 59 and completion.rate_limit.reset_requests_s == 1.0
    plain = await openai(recorder(200, OPENAI_OK)).complete(make_request())
    assert plain.rate_limit is None and plain.request_id == "chatcmpl-1"  # the body's id


async def test_requests_in_a_row_share_one_connection() -> None:
    rec = recorder(200, OPENAI_OK)
    provider = openai(rec)
    for _ in range(3):
        await provider.complete(make_request())
    assert len(rec.requests) == 3
    assert len({r.peer for r in rec.requests}) == 1 and rec.requests[0].peer is not None  # kept alive
    await provider.aclose()
    assert provider.http.transport.closed
    await provider.aclose()  # idempotent


async def test_openai_compat_sends_no_auth_without_key() -> None:
    rec = recorder(200, OPENAI_OK)
    completion = await compat(rec).complete(make_request())
    assert completion.provider == "openai_compat"
    assert "authorization" not in rec.requests[0].headers


async def test_openai_finish_reasons_and_missing_usage() -> None:
    body = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "cut"}, "finish_reason": "length"}
        ]
    }
    completion = await compat(recorder(200, body)).complete(make_request())
    assert completion.finish_reason == "length"
    assert completion.usage.input_tokens == 0
    assert completion.model == "m-1"  # the request's model when the body names none


async def test_anthropic_success_body_and_answer() -> None:
    rec = recorder(200, ANTHROPIC_OK, {"request-id": "req_a"})
    request = make_request(
        options={"temperature": 0.2, "stop": "END", "seed": 3, "response_format": {"x": 1}}
    )
    completion = await anthropic(rec).complete(request)
    assert completion.text == "positive"
    assert completion.finish_reason == "stop"
    assert completion.request_id == "req_a"
    sent = rec.requests[0]
    assert str(sent.url) == rec.base_url + "/v1/messages"
    assert sent.headers["x-api-key"] == SECRET
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert rec.json() == {
        "model": "m-1",
        "max_tokens": 1024,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Classify:\nhello"}],
        "temperature": 0.2,
        "stop_sequences": ["END"],
    }


async def test_anthropic_base_url_with_v1_and_max_tokens_from_options() -> None:
    rec = recorder(200, {**ANTHROPIC_OK, "stop_reason": "max_tokens"})
    provider = AnthropicProvider(rec.client(), base_url=rec.base_url + "/v1/", api_key=None)
    completion = await provider.complete(make_request(options={"max_tokens": 7}))
    assert str(rec.requests[0].url) == rec.base_url + "/v1/messages"
    assert rec.json()["max_tokens"] == 7
    assert completion.finish_reason == "length"


# ---------------------------------------------------------------- errors

PROVIDERS = {"openai": openai, "anthropic": anthropic, "openai_compat": compat}


def _err_body(name: str, message: str, etype: str, code: str | None = None) -> dict[str, Any]:
    return anthropic_error(message, etype) if name == "anthropic" else openai_error(message, etype, code)


@pytest.mark.parametrize("name", PROVIDERS)
async def test_429_with_retry_after_seconds(name: str) -> None:
    rec = recorder(429, _err_body(name, "Rate limit reached", "rate_limit_error"), {"retry-after": "2"})
    with pytest.raises(RateLimited) as info:
        await PROVIDERS[name](rec).complete(make_request())
    assert info.value.hint.retry_after_s == 2.0
    assert info.value.status_code == 429 and info.value.provider == name
    assert info.value.retryable


@pytest.mark.parametrize("name", PROVIDERS)
async def test_429_with_retry_after_http_date(name: str) -> None:
    date = formatdate(time.time() + 120, usegmt=True)
    rec = recorder(429, _err_body(name, "slow down", "rate_limit_error"), {"retry-after": date})
    with pytest.raises(RateLimited) as info:
        await PROVIDERS[name](rec).complete(make_request())
    assert info.value.hint.retry_after_s == pytest.approx(120, abs=3)


async def test_openai_billing_429() -> None:
    body = openai_error(
        "You exceeded your current quota, please check your plan", "insufficient_quota", "insufficient_quota"
    )
    with pytest.raises(QuotaExhausted) as info:
        await openai(recorder(429, body)).complete(make_request())
    assert "insufficient_quota" in info.value.message
    assert not info.value.retryable


async def test_anthropic_spend_limit_429() -> None:
    body = anthropic_error("You have reached your specified API usage limits.", "rate_limit_error")
    with pytest.raises(QuotaExhausted):
        await anthropic(recorder(429, body)).complete(make_request())


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    ("status", "etype", "cls"),
    [
        (529, "overloaded_error", Overloaded),
        (503, "overloaded_error", Overloaded),
        (500, "api_error", ServerError),
        (400, "invalid_request_error", Rejected),
        (401, "authentication_error", AuthFailed),
        (403, "permission_error", AuthFailed),
        (404, "not_found_error", Rejected),
        (413, "request_too_large", Rejected),
        (422, "invalid_request_error", Rejected),
        (408, "timeout", RequestTimeout),
    ],
)
async def test_status_errors(name: str, status: int, etype: str, cls: type[ProviderError]) -> None:
    rec = recorder(status, _err_body(name, f"something {status}", etype))
    with pytest.raises(cls) as info:
        await PROVIDERS[name](rec).complete(make_request())
    assert type(info.value) is cls
    assert info.value.status_code == status
    assert f"something {status}" in info.value.message
    assert etype in info.value.message


def _chained(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions a traceback would show with it (cause, unsuppressed context)."""
    seen: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in seen:
        seen.append(node)
        node = node.__cause__ or (None if node.__suppress_context__ else node.__context__)
    return seen


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    ("behaviour", "cls"),
    [
        (Behaviour.HANG, RequestTimeout),  # no answer within the read timeout
        (Behaviour.DROP, ConnectionFailed),  # connection closed without an answer
        (Behaviour.GARBAGE, ConnectionFailed),  # an answer that is not HTTP
        (Behaviour.TRUNCATE, ConnectionFailed),  # the body ends before its Content-Length
    ],
)
async def test_transport_failures(name: str, behaviour: Behaviour, cls: type[ProviderError]) -> None:
    rec = behaving(behaviour)
    with pytest.raises(cls) as info:
        await at_url(name, rec.base_url, timeout_s=0.3).complete(make_request())
    assert type(info.value) is cls and info.value.provider == name and info.value.retryable
    assert len(rec.requests) == 1  # it reached the server: the failure is the server's doing
    # the aiohttp exception (whose request_info carries the auth header) is not chained
    assert info.value.__cause__ is None and info.value.__context__ is None


@pytest.mark.parametrize("name", PROVIDERS)
async def test_connect_timeout_is_a_timeout(name: str) -> None:
    with pytest.raises(RequestTimeout) as info:
        await at_url(name, unaccepting_url(), timeout_s=0.3).complete(make_request())
    assert info.value.provider == name and info.value.retryable
    assert "connect to 127.0.0.1" in info.value.message
    assert info.value.__cause__ is None and info.value.__context__ is None


@pytest.mark.parametrize("name", PROVIDERS)
async def test_closed_port_is_a_connection_failure(name: str) -> None:
    with pytest.raises(ConnectionFailed) as info:
        await at_url(name, closed_port_url()).complete(make_request())
    assert info.value.provider == name and info.value.retryable
    assert info.value.__cause__ is None and info.value.__context__ is None


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize(
    "body",
    [b"<html>not json</html>", {"unexpected": True}, {"choices": []}, {"content": "x"}, [1, 2], b""],
)
async def test_malformed_2xx(name: str, body: Any) -> None:
    with pytest.raises(MalformedResponse) as info:
        await PROVIDERS[name](recorder(200, body)).complete(make_request())
    assert info.value.retryable


# ---------------------------------------------------------------- structured modes


async def test_openai_json_schema_mode() -> None:
    answer = {
        **OPENAI_OK,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": '{"a1":"x","b2":"y"}'},
            }
        ],
    }
    rec = recorder(200, answer)
    completion = await openai(rec).complete(
        make_request(answer_schema=SCHEMA, options={"response_format": {"type": "text"}})
    )
    assert rec.json()["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    assert completion.text == '{"a1":"x","b2":"y"}'


async def test_json_schema_mode_wraps_and_unwraps_a_non_object_schema() -> None:
    answer = {
        **OPENAI_OK,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": '{"answer":"positive"}'},
            }
        ],
    }
    rec = recorder(200, answer)
    completion = await openai(rec).complete(
        make_request(answer_schema={"type": "string", "enum": ["positive"]})
    )
    sent = rec.json()["response_format"]["json_schema"]["schema"]
    assert sent["type"] == "object" and sent["required"] == ["answer"]
    assert completion.text == "positive"


async def test_compat_json_object_mode_is_llama_cpp_shape() -> None:
    rec = recorder(200, OPENAI_OK)
    await compat(rec).complete(make_request(answer_schema=SCHEMA))
    assert rec.json()["response_format"] == {"type": "json_object", "schema": SCHEMA}


async def test_compat_can_use_json_schema_for_vllm() -> None:
    rec = recorder(200, OPENAI_OK)
    await compat(rec, structured_mode="json_schema").complete(make_request(answer_schema=SCHEMA))
    assert rec.json()["response_format"]["type"] == "json_schema"


async def test_off_mode_sends_no_schema() -> None:
    rec = recorder(200, OPENAI_OK)
    await openai(rec, structured_mode="off").complete(make_request(answer_schema=SCHEMA))
    assert "response_format" not in rec.json() and "tools" not in rec.json()
    rec = recorder(200, ANTHROPIC_OK)
    await anthropic(rec, structured_mode="off").complete(make_request(answer_schema=SCHEMA))
    assert "tools" not in rec.json()


async def test_openai_tool_mode_reads_function_arguments() -> None:
    answer = {
        **OPENAI_OK,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "answer", "arguments": '{"a1": "x", "b2": "y"}'},
                        }
                    ],
                },
            }
        ],
    }
    rec = recorder(200, answer)
    completion = await openai(rec, structured_mode="tool").complete(make_request(answer_schema=SCHEMA))
    body = rec.json()
    assert body["tools"][0]["function"]["parameters"] == SCHEMA
    assert body["tool_choice"] == {"type": "function", "function": {"name": "answer"}}
    assert completion.text == '{"a1":"x","b2":"y"}'
    assert completion.finish_reason == "tool_use"


async def test_anthropic_forced_tool_body_and_answer() -> None:
    answer = {
        **ANTHROPIC_OK,
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"b2": "y", "a1": "x"}}],
    }
    rec = recorder(200, answer)
    completion = await anthropic(rec).complete(make_request(answer_schema=SCHEMA))
    body = rec.json()
    assert body["tools"] == [
        {"name": "answer", "description": body["tools"][0]["description"], "input_schema": SCHEMA}
    ]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert orjson.loads(completion.text) == {"a1": "x", "b2": "y"}
    assert " " not in completion.text  # compact JSON
    assert completion.finish_reason == "tool_use"


async def test_anthropic_tool_answer_of_a_wrapped_string_schema() -> None:
    answer = {
        **ANTHROPIC_OK,
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"answer": "negative"}}],
    }
    completion = await anthropic(recorder(200, answer)).complete(
        make_request(answer_schema={"type": "string"})
    )
    assert completion.text == "negative"


async def test_anthropic_enforces_a_jobs_response_format_as_a_forced_tool() -> None:
    """Anthropic has no response_format: a job's schema (or a plain JSON object) becomes the
    forced tool's input schema, and the tool input is the answer."""
    label = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    as_schema = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": label}}}
    answer = {
        **ANTHROPIC_OK,
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"label": "pos"}}],
    }
    rec = recorder(200, answer)
    completion = await anthropic(rec).complete(make_request(options=as_schema))
    body = rec.json()
    assert "response_format" not in body
    assert body["tools"][0]["input_schema"] == label
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert completion.text == '{"label":"pos"}'

    rec = recorder(200, {**answer, "content": [{**answer["content"][0], "input": {"any": 1}}]})
    completion = await anthropic(rec).complete(
        make_request(options={"response_format": {"type": "json_object"}})
    )
    assert rec.json()["tools"][0]["input_schema"] == {"type": "object"}
    assert completion.text == '{"any":1}'

    # a string schema is wrapped for the tool and unwrapped from its answer
    string = {"response_format": {"type": "json_object", "schema": {"type": "string"}}}
    rec = recorder(200, {**answer, "content": [{**answer["content"][0], "input": {"answer": "neg"}}]})
    completion = await anthropic(rec).complete(make_request(options=string))
    assert rec.json()["tools"][0]["input_schema"]["properties"] == {"answer": {"type": "string"}}
    assert completion.text == "neg"

    # with structured output off the option is dropped, as before
    rec = recorder(200, ANTHROPIC_OK)
    await anthropic(rec, structured_mode="off").complete(make_request(options=as_schema))
    assert "tools" not in rec.json() and "response_format" not in rec.json()


async def test_anthropic_rejects_modes_it_has_not() -> None:
    with pytest.raises(ValueError):
        anthropic(recorder(200, {}), structured_mode="json_schema")


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("kind", ["api_key_env", "api_key_file", "api_key_command"])
async def test_key_never_in_reprs_errors_or_logs(
    caplog: pytest.LogCaptureFixture, kind: str, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    key = key_of_kind(kind, tmp_path)
    seen += [repr(key), str(key)]
    for name in ("openai", "anthropic"):
        # the provider echoes the key back in its error message, as OpenAI's 401 does (masked)
        echo = _err_body(name, f"Incorrect API key provided: {SECRET}", "authentication_error")
        for rec in (
            recorder(401, echo),
            recorder(429, echo),
            recorder(200, b"junk " + SECRET.encode()),
            # transport failures: aiohttp's exceptions hold request_info with our headers
            behaving(Behaviour.HANG),
            behaving(Behaviour.DROP),
            behaving(Behaviour.GARBAGE),
            behaving(Behaviour.TRUNCATE),
        ):
            provider = at_url(name, rec.base_url, timeout_s=0.3, key=key)
            seen += [repr(provider), str(provider), repr(provider.http)]
            with pytest.raises(ProviderError) as info:
                await provider.complete(make_request())
            seen += [str(info.value), repr(info.value), info.value.message]
            seen += ["".join(traceback.format_exception(info.value))]
            seen += [repr(vars(e)) for e in _chained(info.value)]
            sent = rec.requests[0].headers
            # it WAS sent: the test would catch a leak
            assert SECRET in sent.get("authorization", "") + sent.get("x-api-key", "")
        for url in (closed_port_url(), unaccepting_url()):
            with pytest.raises(ProviderError) as info:
                await at_url(name, url, timeout_s=0.3, key=key).complete(make_request())
            seen += [str(info.value), repr(info.value), "".join(traceback.format_exception(info.value))]
    seen += [record.getMessage() for record in caplog.records]
    seen.append(caplog.text)
    assert caplog.records, "adapters log at DEBUG; nothing captured means the check is empty"
    assert [text for text in seen if SECRET in text] == []


async def test_unserializable_option_is_rejected_without_sending() -> None:
    rec = recorder(200, OPENAI_OK)
    with pytest.raises(Rejected, match="JSON-serializable"):
        await openai(rec).complete(make_request(options={"stop": {1, 2}}))
    assert rec.requests == []


async def test_openai_cut_tool_arguments_are_text_not_an_error() -> None:
    answer = {
        **OPENAI_OK,
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "answer", "arguments": '{"a1": "x", "b2'},
                        }
                    ],
                },
            }
        ],
    }
    completion = await openai(recorder(200, answer), structured_mode="tool").complete(
        make_request(answer_schema=SCHEMA)
    )
    assert completion.text == '{"a1": "x", "b2' and completion.finish_reason == "length"
