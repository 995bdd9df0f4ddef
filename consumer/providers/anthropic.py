"""Anthropic messages (`POST {base_url}/v1/messages`).

`x-api-key` and `anthropic-version` headers; system messages go to the top-level `system`
field; `max_tokens` is always set (the API requires it). With an `answer_schema` in `tool` mode
the request forces one tool whose `input_schema` is the schema, and the `tool_use` block's input
becomes the Completion text (compact JSON). A job's `options.response_format` (a JSON object, or
a schema) is enforced the same way: Anthropic has no such option.

`build_messages_body`, `read_message` and `ANTHROPIC_API` also serve the Message Batches API
(`batch_anthropic.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Unpack

from consumer.core.completion import CompletionRequest, Usage
from consumer.core.output import response_format_schema
from consumer.providers.httpapi import AdapterOptions, HttpCompletionProvider, ProviderApi, ProviderHttp
from consumer.providers.keys import ApiKey
from consumer.providers.structured import (
    SCHEMA_NAME,
    TOOL_DESCRIPTION,
    StructuredMode,
    answer_text,
    root_schema,
)
from consumer.providers.transport import HttpTransport

log = logging.getLogger(__name__)

ANTHROPIC_VERSION = "2023-06-01"
#: used when neither the job nor the tier sets max_tokens (the API requires one)
DEFAULT_MAX_TOKENS = 1024
ANTHROPIC_STRUCTURED_MODES: tuple[str, ...] = ("tool", "off")

#: options Anthropic accepts as they are; `stop` is renamed; `response_format` becomes a forced
#: tool (`answer_schema_of`); others (seed, ...) dropped
_PASSTHROUGH_OPTIONS = frozenset(
    {"temperature", "top_p", "top_k", "stop_sequences", "metadata", "service_tier"}
)

_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_use",
    "refusal": "content_filter",
}


#: the shortest prompt prefix each model caches (Anthropic's prompt caching docs): a shorter
#: one is processed uncached, so no breakpoint is sent for it. First matching model id prefix
#: wins; dated ids (`claude-sonnet-4-20250514`) match their family's entry.
MIN_CACHEABLE_TOKENS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096),
    ("claude-opus-4-5", 4096),
    ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048),
    ("claude-opus-4-1", 1024),
    ("claude-sonnet-4-5", 1024),
    ("claude-opus-4-0", 1024),
    ("claude-opus-4-2", 1024),
    ("claude-sonnet-4-0", 1024),
    ("claude-sonnet-4-2", 1024),
    ("claude-3-7-sonnet", 1024),
    ("claude-3-5-sonnet", 1024),
    ("claude-3-opus", 1024),
    ("claude-3-5-haiku", 2048),
    ("claude-3-haiku", 2048),
)
#: a model the table does not know: the largest minimum of any model, so a breakpoint is only
#: sent where every current model would cache
DEFAULT_MIN_CACHEABLE_TOKENS = 4096
CACHE_CONTROL: dict[str, str] = {"type": "ephemeral"}


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix (tokens) `model` caches; conservative for models it does not know."""
    for prefix, tokens in MIN_CACHEABLE_TOKENS:
        if model.startswith(prefix):
            return tokens
    return DEFAULT_MIN_CACHEABLE_TOKENS


def _mark_cache_breakpoint(request: CompletionRequest, body: dict[str, Any]) -> None:
    """A `cache_control` breakpoint at the end of the request's shared prefix, when it is long
    enough for the model to cache: the last message split into the prefix block (marked) and
    the rest; a prefix ending with an earlier message marks that message (or the system)."""
    split = request.cache_split()
    if split is None or request.shared_prefix_tokens() < min_cacheable_tokens(request.model):
        return
    prefix, rest = split
    messages = body["messages"]
    if prefix and messages:
        blocks = [_marked(prefix)]
        if rest:
            blocks.append({"type": "text", "text": rest})
        messages[-1]["content"] = blocks
    elif len(messages) > 1:
        messages[-2]["content"] = [_marked(messages[-2]["content"])]
    elif body.get("system"):
        body["system"] = [_marked(body["system"])]


def _marked(text: str) -> dict[str, Any]:
    """A text block that ends a cached prefix."""
    return {"type": "text", "text": text, "cache_control": dict(CACHE_CONTROL)}


def anthropic_auth(secret: str) -> dict[str, str]:
    """Anthropic's auth header for a key."""
    return {"x-api-key": secret}


def answer_schema_of(request: CompletionRequest) -> Mapping[str, Any] | None:
    """The schema the answer is forced into: the request's own `answer_schema` (a batched
    request's), else what a job's `options.response_format` asks for, since Anthropic has no
    such option."""
    if request.answer_schema is not None:
        return request.answer_schema
    return response_format_schema(request.options.get("response_format"))


def build_messages_body(
    request: CompletionRequest,
    *,
    structured_mode: StructuredMode,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> dict[str, Any]:
    """The JSON body of one Messages call (also a Message Batches `params`)."""
    system = "\n\n".join(m.content for m in request.messages if m.role == "system")
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": int(request.options.get("max_tokens") or default_max_tokens),
        "messages": [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"],
    }
    if system:
        body["system"] = system
    dropped = []
    for key, value in request.options.items():
        if value is None or key == "max_tokens":
            continue
        if key in _PASSTHROUGH_OPTIONS:
            body[key] = value
        elif key == "stop":
            body["stop_sequences"] = [value] if isinstance(value, str) else list(value)
        elif key == "response_format" and structured_mode == "tool":
            continue  # enforced below as a forced tool
        else:
            dropped.append(key)
    if dropped:
        log.debug("anthropic: options not sent (no Anthropic equivalent): %s", sorted(dropped))
    schema = answer_schema_of(request)
    if schema is not None and structured_mode != "off":
        if structured_mode != "tool":
            raise ValueError(f"anthropic supports structured modes {ANTHROPIC_STRUCTURED_MODES}")
        root, _ = root_schema(schema)
        body["tools"] = [{"name": SCHEMA_NAME, "description": TOOL_DESCRIPTION, "input_schema": root}]
        body["tool_choice"] = {"type": "tool", "name": SCHEMA_NAME}
    _mark_cache_breakpoint(request, body)
    return body


def read_message(
    payload: Any, request: CompletionRequest, structured_mode: StructuredMode
) -> tuple[str, str]:
    """The answer text and finish reason of a Message body (a Message Batches result's too).

    Text blocks are concatenated; in tool mode the forced tool's input is the answer. Raises
    KeyError, TypeError and the like when the body is not a message (`HttpAdapter.read_answer`
    turns them into MalformedResponse).
    """
    if not isinstance(payload, Mapping) or payload.get("type", "message") != "message":
        raise TypeError("not a message")
    blocks = payload["content"]
    if not isinstance(blocks, list):
        raise TypeError("content is not a list")
    texts: list[str] = []
    tool_input: Any = None
    for block in blocks:
        if block.get("type") == "text":
            texts.append(str(block["text"]))
        elif block.get("type") == "tool_use" and tool_input is None:
            tool_input = block["input"]
    schema = answer_schema_of(request)
    forced = structured_mode == "tool" and schema is not None
    if tool_input is not None and (forced or not texts):
        wrapped = schema is not None and root_schema(schema)[1]
        text = answer_text(tool_input, wrapped=wrapped)
    else:
        text = "".join(texts)
    raw_stop = payload.get("stop_reason") or "end_turn"
    return text, _STOP_REASONS.get(str(raw_stop), str(raw_stop))


def anthropic_http(
    transport: HttpTransport, *, base_url: str, api_key: ApiKey, name: str
) -> ProviderHttp:
    """The HTTP path for Anthropic: a base URL given with a trailing `/v1` is accepted too."""
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return ProviderHttp(
        transport,
        base_url=base,
        provider=name,
        api_key=api_key,
        auth_headers=anthropic_auth,
        extra_headers={"anthropic-version": ANTHROPIC_VERSION},
    )


def read_message_usage(usage: Mapping[str, Any]) -> Usage:
    """A Message's `usage`. Anthropic's `input_tokens` leaves out the prompt cache's tokens
    (`cache_read_input_tokens`, `cache_creation_input_tokens`); they are added back, so
    `Usage.input_tokens` counts every prompt token as it does for OpenAI."""
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    return Usage(
        input_tokens=int(usage.get("input_tokens") or 0) + read + written,
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_input_tokens=read,
        cache_write_tokens=written,
    )


#: how both Anthropic adapters (Messages, Message Batches) are set up and read answers
ANTHROPIC_API = ProviderApi(
    ANTHROPIC_STRUCTURED_MODES, anthropic_http, answer="message", read=read_message, usage=read_message_usage
)


class AnthropicProvider(HttpCompletionProvider):
    """Anthropic Messages API.

    `HttpAdapter`'s arguments (base_url: the API root, `https://api.anthropic.com`;
    `/v1/messages` is appended; structured_mode `tool`, a forced tool, or `off`), and
    default_max_tokens: sent when the request's options carry no max_tokens.
    """

    def __init__(
        self,
        transport: HttpTransport,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        **adapter: Unpack[AdapterOptions],
    ) -> None:
        super().__init__(transport, **adapter)
        self.default_max_tokens = default_max_tokens

    api = ANTHROPIC_API
    default_name: ClassVar[str] = "anthropic"
    default_structured_mode: ClassVar[StructuredMode] = "tool"
    path = "/v1/messages"
    models_path = "/v1/models"

    def build_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body this adapter sends for `request`."""
        return build_messages_body(
            request, structured_mode=self.structured_mode, default_max_tokens=self.default_max_tokens
        )
