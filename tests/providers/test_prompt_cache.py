"""Prompt caching and usage on the wire: the cache fields each API documents are sent (OpenAI
`prompt_cache_key`; Anthropic a `cache_control` breakpoint at the end of the shared prefix) and
the cached token counts are read back (OpenAI `usage.prompt_tokens_details.cached_tokens`;
Anthropic `cache_read_input_tokens` / `cache_creation_input_tokens`), online and in Batch API
results; then against the simulator, which caches the way each API does."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import SecretStr

from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.offline import BatchRequest
from consumer.providers.anthropic import (
    DEFAULT_MIN_CACHEABLE_TOKENS,
    AnthropicProvider,
    build_messages_body,
    min_cacheable_tokens,
)
from consumer.providers.batch_anthropic import AnthropicBatchProvider
from consumer.providers.batch_openai import OpenAIBatchProvider
from consumer.providers.openai import OpenAIProvider, build_chat_body
from consumer.providers.openai_compat import OpenAICompatProvider
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from tests.providers.recording import SECRET, client_session, recorder

#: a 1,500-token instruction (4 characters a token), the same bytes in every request
INSTRUCTION = "Label the sentiment of the text as positive or negative. " * 105 + "\nTEXT:\n"
SONNET = "claude-sonnet-4-5"


def cached_request(text: str, *, model: str = SONNET, key: str = "promptbus-abc") -> CompletionRequest:
    return CompletionRequest(
        (ChatMessage("user", INSTRUCTION + text),),
        model,
        {"max_tokens": 8},
        cache_prefix_chars=len(INSTRUCTION),
        cache_key=key,
    )


OPENAI_CACHED = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-x",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "positive"}, "finish_reason": "stop"}
    ],
    "usage": {
        "prompt_tokens": 1600,
        "completion_tokens": 2,
        "total_tokens": 1602,
        "prompt_tokens_details": {"cached_tokens": 1536},
    },
}
ANTHROPIC_CACHED = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": SONNET,
    "content": [{"type": "text", "text": "positive"}],
    "stop_reason": "end_turn",
    "usage": {
        "input_tokens": 60,
        "output_tokens": 2,
        "cache_read_input_tokens": 1500,
        "cache_creation_input_tokens": 40,
    },
}


# ---------------------------------------------------------------- OpenAI


async def test_openai_sends_prompt_cache_key_and_reads_cached_tokens() -> None:
    rec = recorder(200, OPENAI_CACHED)
    provider = OpenAIProvider(rec.client(), base_url=rec.base_url + "/v1", api_key=SecretStr(SECRET))
    completion = await provider.complete(cached_request("great"))
    body = rec.json()
    assert body["prompt_cache_key"] == "promptbus-abc"
    # the shared prefix goes first and unchanged: OpenAI caches the longest equal prefix
    assert body["messages"] == [{"role": "user", "content": INSTRUCTION + "great"}]
    usage = completion.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens) == (1600, 1536, 0)


async def test_openai_compatible_servers_get_no_prompt_cache_key() -> None:
    rec = recorder(200, OPENAI_CACHED)
    provider = OpenAICompatProvider(rec.client(), base_url=rec.base_url + "/v1")
    await provider.complete(cached_request("great"))
    assert "prompt_cache_key" not in rec.json()


def test_no_cache_key_without_one_and_a_jobs_own_key_wins() -> None:
    plain = CompletionRequest((ChatMessage("user", "hi"),), "gpt-x")
    assert "prompt_cache_key" not in build_chat_body(plain, structured_mode="json_schema")
    own = CompletionRequest(
        (ChatMessage("user", "hi"),), "gpt-x", {"prompt_cache_key": "mine"}, cache_key="k"
    )
    assert build_chat_body(own, structured_mode="json_schema")["prompt_cache_key"] == "mine"


# ---------------------------------------------------------------- Anthropic


async def test_anthropic_marks_the_end_of_the_shared_prefix_and_reads_cache_counts() -> None:
    rec = recorder(200, ANTHROPIC_CACHED)
    provider = AnthropicProvider(rec.client(), base_url=rec.base_url, api_key=SecretStr(SECRET))
    completion = await provider.complete(cached_request("great"))
    body = rec.json()
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": INSTRUCTION, "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "great"},
            ],
        }
    ]
    usage = completion.usage
    # Anthropic's input_tokens leaves the cache's tokens out; Usage counts every prompt token
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens) == (1600, 1500, 40)
    assert usage.output_tokens == 2


def test_anthropic_sends_no_breakpoint_below_the_models_minimum() -> None:
    assert min_cacheable_tokens("claude-sonnet-4-5-20250929") == 1024
    assert min_cacheable_tokens("claude-haiku-4-5") == 4096
    assert min_cacheable_tokens("claude-3-5-haiku-latest") == 2048
    assert min_cacheable_tokens("some-new-model") == DEFAULT_MIN_CACHEABLE_TOKENS == 4096
    # 1,500 tokens: cached on Sonnet 4.5, too short for Haiku 4.5 and for an unknown model
    for model in ("claude-haiku-4-5", "some-new-model"):
        body = build_messages_body(cached_request("x", model=model), structured_mode="tool")
        assert body["messages"][0]["content"] == INSTRUCTION + "x"
    off = CompletionRequest((ChatMessage("user", INSTRUCTION + "x"),), SONNET)  # prompt_cache off
    assert build_messages_body(off, structured_mode="tool")["messages"][0]["content"] == INSTRUCTION + "x"


def test_anthropic_prefix_of_earlier_messages_marks_the_system_or_the_message_before() -> None:
    system_only = CompletionRequest(
        (ChatMessage("system", INSTRUCTION), ChatMessage("user", "great")), SONNET, cache_prefix_chars=0
    )
    body = build_messages_body(system_only, structured_mode="tool")
    assert body["system"] == [{"type": "text", "text": INSTRUCTION, "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": "great"}]
    turns = CompletionRequest(
        (ChatMessage("user", INSTRUCTION), ChatMessage("assistant", "ok"), ChatMessage("user", "great")),
        SONNET,
        cache_prefix_chars=0,
    )
    body = build_messages_body(turns, structured_mode="tool")
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "ok", "cache_control": {"type": "ephemeral"}}
    ]


# ---------------------------------------------------------------- Batch APIs


async def test_batch_lines_carry_the_cache_fields_and_results_read_the_cached_counts() -> None:
    request = cached_request("great")
    submitted = {"job-1": BatchRequest("job-1", request)}
    openai_batch = OpenAIBatchProvider(client_session(), base_url="http://127.0.0.1:9/v1", api_key=None)
    anthropic_batch = AnthropicBatchProvider(client_session(), base_url="http://127.0.0.1:9", api_key=None)
    try:
        line = orjson.loads(openai_batch.jsonl_line(submitted["job-1"]))
        assert line["body"]["prompt_cache_key"] == "promptbus-abc"
        params = anthropic_batch.batch_item(submitted["job-1"])["params"]
        assert params["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}

        result = {
            "custom_id": "job-1",
            "response": {"status_code": 200, "body": OPENAI_CACHED},
            "error": None,
        }
        item = openai_batch._parse_line(orjson.dumps(result), submitted)
        assert item.completion is not None and item.completion.usage.cached_input_tokens == 1536
        result2: dict[str, Any] = {
            "custom_id": "job-1",
            "result": {"type": "succeeded", "message": ANTHROPIC_CACHED},
        }
        item2 = anthropic_batch._parse_line(orjson.dumps(result2), submitted)
        assert item2.completion is not None
        usage = item2.completion.usage
        assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_tokens) == (1600, 1500, 40)
    finally:
        await openai_batch.aclose()
        await anthropic_batch.aclose()


# ---------------------------------------------------------------- the simulator


async def test_simulator_caches_the_marked_prefix_like_anthropic() -> None:
    server = SimulatorServer(SimulatorConfig())
    url = await server.start()
    provider = AnthropicProvider(client_session(), base_url=url, api_key=None)
    try:
        first = await provider.complete(cached_request("great"))
        second = await provider.complete(cached_request("awful"))
        short = await provider.complete(cached_request("meh", model="claude-haiku-4-5"))
    finally:
        await provider.aclose()
        await server.stop()
    prefix_tokens = -(-len(INSTRUCTION) // 4)
    assert (first.usage.cache_write_tokens, first.usage.cached_input_tokens) == (prefix_tokens, 0)
    assert (second.usage.cache_write_tokens, second.usage.cached_input_tokens) == (0, prefix_tokens)
    assert second.usage.input_tokens == first.usage.input_tokens  # cached ones still counted
    assert (short.usage.cache_write_tokens, short.usage.cached_input_tokens) == (0, 0)


async def test_simulator_caches_a_shared_prefix_per_key_like_openai() -> None:
    server = SimulatorServer(SimulatorConfig())
    url = await server.start()
    provider = OpenAIProvider(client_session(), base_url=url + "/v1", api_key=None)
    try:
        first = await provider.complete(cached_request("great"))
        second = await provider.complete(cached_request("awful"))
        other_key = await provider.complete(cached_request("meh", key="promptbus-other"))
    finally:
        await provider.aclose()
        await server.stop()
    assert first.usage.cached_input_tokens == 0
    # the 1,500 shared tokens, in OpenAI's steps of 128 from 1,024 on
    assert second.usage.cached_input_tokens == 1408
    assert other_key.usage.cached_input_tokens == 0
