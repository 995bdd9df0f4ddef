"""OpenAI chat completions (`POST {base_url}/chat/completions`).

`build_chat_body`, `read_chat_completion` and `OPENAI_API` are shared by the online adapter, the
OpenAI-compatible adapter (`openai_compat.py`) and the Batch API (`batch_openai.py`), so a request
looks the same whichever way it is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from consumer.core.completion import CompletionRequest, Usage
from consumer.providers.embeddings import OpenAIEmbeddings
from consumer.providers.httpapi import HttpCompletionProvider, ProviderApi, ProviderHttp
from consumer.providers.keys import ApiKey
from consumer.providers.structured import (
    SCHEMA_NAME,
    STRUCTURED_MODES,
    TOOL_DESCRIPTION,
    StructuredMode,
    answer_text,
    root_schema,
    unwrap_json_text,
)
from consumer.providers.transport import HttpTransport

log = logging.getLogger(__name__)

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}


def bearer_auth(secret: str) -> dict[str, str]:
    """OpenAI-style auth header for a key."""
    return {"authorization": f"Bearer {secret}"}


def openai_http(
    transport: HttpTransport, *, base_url: str, api_key: ApiKey, name: str
) -> ProviderHttp:
    """The HTTP path for OpenAI and OpenAI-compatible servers: the base URL as given, bearer auth."""
    return ProviderHttp(
        transport, base_url=base_url, provider=name, api_key=api_key, auth_headers=bearer_auth
    )


def build_chat_body(
    request: CompletionRequest, *, structured_mode: StructuredMode, cache_key: bool = True
) -> dict[str, Any]:
    """The JSON body of one chat completion (also the `body` of a Batch API line).

    Options pass through verbatim (None values dropped). With an `answer_schema` and a mode
    other than `off`, the schema is enforced as the mode says (it overrides any
    `response_format` option). OpenAI caches prompt prefixes by itself; the request's
    `cache_key` goes as `prompt_cache_key`, so requests of one shared prefix reach one cache
    (unless `cache_key` is False, for servers that do not know the field, or the job's
    options set one).
    """
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
    }
    if cache_key and request.cache_key is not None:
        body["prompt_cache_key"] = request.cache_key
    body.update({k: v for k, v in request.options.items() if v is not None})
    schema = request.answer_schema
    if schema is None or structured_mode == "off":
        return body
    if structured_mode == "json_object":
        body["response_format"] = {"type": "json_object", "schema": dict(schema)}
    elif structured_mode == "json_schema":
        root, _ = root_schema(schema)
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "schema": root, "strict": True},
        }
    elif structured_mode == "tool":
        root, _ = root_schema(schema)
        body.pop("response_format", None)
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": SCHEMA_NAME, "description": TOOL_DESCRIPTION, "parameters": root},
            }
        ]
        body["tool_choice"] = {"type": "function", "function": {"name": SCHEMA_NAME}}
    else:
        raise ValueError(f"unknown structured mode {structured_mode!r}; expected one of {STRUCTURED_MODES}")
    return body


def read_chat_completion(
    payload: Any, request: CompletionRequest, structured_mode: StructuredMode
) -> tuple[str, str]:
    """The answer text and finish reason of a chat completion body (a Batch API line's too).

    Raises KeyError, TypeError and the like when the body is not a chat completion
    (`HttpAdapter.read_answer` turns them into MalformedResponse).
    """
    choice = payload["choices"][0]
    message = choice["message"]
    if not isinstance(message, Mapping):
        raise TypeError("message is not an object")
    raw_finish = choice.get("finish_reason") or "stop"
    text: str
    wrapped = request.answer_schema is not None and root_schema(request.answer_schema)[1]
    tool_calls = message.get("tool_calls") or []
    content = message.get("content")
    # a forced tool's arguments are the answer; also read them when the request is unknown
    # (batch results after a restart) and there is no text
    if tool_calls and ((structured_mode == "tool" and request.answer_schema is not None) or not content):
        arguments = tool_calls[0]["function"]["arguments"]
        try:
            value = orjson.loads(arguments) if isinstance(arguments, str) else arguments
            text = answer_text(value, wrapped=wrapped)
        except orjson.JSONDecodeError:
            # arguments cut by max_tokens are broken JSON: hand them on as text, so the
            # caller's validation can keep what is complete (finish_reason says "length")
            text = str(arguments)
    else:
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise TypeError("content is not a string")
        text = content
        if structured_mode in ("json_schema", "json_object") and request.answer_schema is not None:
            text = unwrap_json_text(text, wrapped=wrapped)
    return text, _FINISH_REASONS.get(str(raw_finish), str(raw_finish))


def read_chat_usage(usage: Mapping[str, Any]) -> Usage:
    """A chat completion's `usage`: `prompt_tokens` (cached ones included),
    `completion_tokens`, `prompt_tokens_details.cached_tokens`."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return Usage(
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_input_tokens=int(cached or 0),
    )


#: how every OpenAI adapter (online, OpenAI-compatible, Batch API) is set up and reads answers
OPENAI_API = ProviderApi(
    STRUCTURED_MODES, openai_http, answer="chat completion", read=read_chat_completion, usage=read_chat_usage
)


class OpenAIProvider(OpenAIEmbeddings, HttpCompletionProvider):
    """OpenAI chat completions and embeddings. Also the code behind `OpenAICompatProvider`.

    Takes `HttpAdapter`'s arguments: base_url up to and including `/v1` (e.g.
    `https://host/v1`); api_key sent as `Authorization: Bearer`; structured_mode how
    `answer_schema` is enforced (see `structured.py`).
    """

    api = OPENAI_API
    default_name: ClassVar[str] = "openai"
    default_structured_mode: ClassVar[StructuredMode] = "json_schema"
    path = "/chat/completions"
    #: OpenAI's API takes `prompt_cache_key`; OpenAI-compatible servers may refuse it
    sends_cache_key: ClassVar[bool] = True

    def build_body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body this adapter sends for `request`."""
        return build_chat_body(request, structured_mode=self.structured_mode, cache_key=self.sends_cache_key)
