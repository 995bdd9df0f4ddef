"""Provider-neutral completion request and answer: what flows between the pipeline and an adapter."""

from __future__ import annotations

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
    """

    messages: tuple[ChatMessage, ...]
    model: str
    options: Mapping[str, Any] = field(default_factory=dict)
    answer_schema: Mapping[str, Any] | None = None

    def estimated_tokens(self) -> int:
        """The prompt's tokens, roughly (4 characters each): what a token budget is paced by
        before the answer says what the request really cost."""
        return sum(len(m.content) for m in self.messages) // CHARS_PER_TOKEN + 1


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Completion:
    """A provider's answer.

    finish_reason: normalized to "stop", "length", "tool_use", "content_filter" or the
        provider's own word when none of these fits.
    request_id: the provider's request id (x-request-id / request-id / body id), if any.
    latency_ms: wall time of the HTTP call as measured by the adapter.
    rate_limit: the provider's rate-limit budget from the answer's headers, when it sent one
        (the limiter paces new requests by it, so they stop before a 429 rather than after).
    """

    text: str
    finish_reason: str
    usage: Usage
    provider: str
    model: str
    request_id: str | None = None
    latency_ms: float = 0.0
    rate_limit: RateLimitHint | None = None
