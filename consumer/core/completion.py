"""Provider-neutral completion request and answer: what flows between the pipeline and an adapter."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from consumer.core.errors import RateLimitHint

Role = Literal["system", "user", "assistant"]

#: a common rule of thumb for English text with OpenAI's and Anthropic's tokenizers
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """One provider call.

    messages: the conversation; adapters move `system` messages where their API wants them.
    model: the provider's model id.
    options: temperature, max_tokens, top_p, stop, seed, response_format, ... (already merged:
        tier options, then job options, then what batching sets).
    answer_schema: when set, a JSON Schema the answer must follow; adapters enforce it the
        way their provider can (json_schema response_format, a forced tool, ...).
    cache_prefix_chars: the request's shared prefix, for provider prompt caching: every
        message before the last plus this many leading characters of the last one (the
        instruction before the data section, byte-identical across requests of one prefix);
        None: no prompt caching asked (the tier's `prompt_cache: off`, or no shared prefix).
    cache_key: the same for every request of one shared prefix (OpenAI `prompt_cache_key`).
    """

    messages: tuple[ChatMessage, ...]
    model: str
    options: Mapping[str, Any] = field(default_factory=dict)
    answer_schema: Mapping[str, Any] | None = None
    cache_prefix_chars: int | None = None
    cache_key: str | None = None

    def cache_split(self) -> tuple[str, str] | None:
        """The last message's content as (shared prefix, the rest), when caching is asked."""
        if self.cache_prefix_chars is None or not self.messages:
            return None
        content = self.messages[-1].content
        cut = min(max(self.cache_prefix_chars, 0), len(content))
        return content[:cut], content[cut:]

    def shared_prefix_tokens(self) -> int:
        """The shared prefix's tokens, roughly (4 characters each); 0 without one."""
        split = self.cache_split()
        if split is None:
            return 0
        earlier = sum(len(m.content) for m in self.messages[:-1])
        return (earlier + len(split[0])) // CHARS_PER_TOKEN

    def estimated_tokens(self) -> int:
        """The prompt's tokens, roughly (4 characters each): what a token budget is paced by
        before the answer says what the request really cost."""
        return sum(len(m.content) for m in self.messages) // CHARS_PER_TOKEN + 1


@functools.lru_cache(maxsize=1024)
def prompt_cache_key(*parts: str) -> str:
    """A short, stable name for one shared prefix (e.g. a batch key's tier, prefix, variable):
    equal parts, equal key; it says nothing of the text itself. Requests of one prefix ask
    again and again: the names of recent ones are remembered."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()
    return "promptbus-" + digest[:24]


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens one request used, as its provider counted them.

    input_tokens: every prompt token, cached ones included (OpenAI's `prompt_tokens`; for
        Anthropic its `input_tokens` plus both cache counts, which it reports apart);
    cached_input_tokens: of those, read from the provider's prompt cache (OpenAI
        `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`);
    cache_write_tokens: of those, written to the prompt cache (Anthropic
        `cache_creation_input_tokens`; OpenAI bills no writes and reports none).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def share(self, n: int) -> Usage:
        """One of `n` equal shares (a batched request's member's), rounded down."""
        counts = (self.input_tokens, self.output_tokens, self.cached_input_tokens, self.cache_write_tokens)
        if n <= 1 and min(counts) >= 0:
            return self  # the whole of it: an unbatched request's
        n = max(n, 1)
        return Usage(
            max(self.input_tokens, 0) // n,
            max(self.output_tokens, 0) // n,
            max(self.cached_input_tokens, 0) // n,
            max(self.cache_write_tokens, 0) // n,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderAnswer:
    """What every provider answer carries besides its content (a `Completion`'s text,
    `consumer.core.embed.Embeddings`' vectors), given by keyword.

    usage: the tokens the provider counted for the request.
    provider, model: the adapter's name and the model that answered, as the provider said.
    request_id: the provider's request id (x-request-id / request-id / body id), if any.
    latency_ms: wall time of the HTTP call as measured by the adapter.
    rate_limit: the provider's rate-limit budget from the answer's headers, when it sent one
        (the limiter paces new requests by it, so they stop before a 429 rather than after).
    response_id: the answer body's own id (OpenAI `chatcmpl-...`, Anthropic `msg_...`), if any:
        what tracing reports as the completion's id (`gen_ai.response.id`).
    """

    usage: Usage
    provider: str
    model: str
    request_id: str | None = None
    latency_ms: float = 0.0
    rate_limit: RateLimitHint | None = None
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Completion(ProviderAnswer):
    """A provider's chat answer: `Completion(text, finish_reason, usage=..., provider=...,
    model=...)`.

    finish_reason: normalized to "stop", "length", "tool_use", "content_filter" or the
        provider's own word when none of these fits.
    """

    text: str
    finish_reason: str
