"""The providers' wire formats: what a request body asks and the bodies the SDKs parse."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from consumer.testing.simulator.model import SimAnswer, compact
from consumer.testing.simulator.refusals import is_int


def now_iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).isoformat().replace("+00:00", "Z")


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data -> {field: (filename, content)} (starlette's form parser needs an extra dep)."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    out: dict[str, tuple[str | None, bytes]] = {}
    if not message.is_multipart():
        return out
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        payload = part.get_payload(decode=True)
        out[str(name)] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return out


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    """The output-token limit of a request that passed `request_refusal`: `max_tokens`, else
    OpenAI's `max_completion_tokens`; None when neither is set."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if is_int(value):
            return value
    return None


def request_view(
    body: Mapping[str, Any], kind: str, *, ignore_structured: bool
) -> tuple[str, Mapping[str, Any] | None, bool, str]:
    """(last user message text, schema or None, answer-as-tool, all message text) of a request body."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    texts = [message_text(m.get("content")) for m in messages]
    prompt = next(
        (message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    all_text = "".join(texts) + (message_text(body.get("system")) if kind == "anthropic" else "")
    schema: Mapping[str, Any] | None = None
    tool = False
    if not ignore_structured:
        if kind == "openai":
            fmt = body.get("response_format")
            if isinstance(fmt, Mapping):
                if fmt.get("type") == "json_schema":
                    schema = (fmt.get("json_schema") or {}).get("schema")
                elif fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), Mapping):
                    schema = fmt["schema"]
            choice = body.get("tool_choice")
            if isinstance(choice, Mapping) and choice.get("type") == "function":
                name = (choice.get("function") or {}).get("name")
                for t in body.get("tools") or []:
                    fn = t.get("function") or {}
                    if fn.get("name") == name:
                        schema, tool = fn.get("parameters") or {"type": "object"}, True
        else:
            choice = body.get("tool_choice")
            if isinstance(choice, Mapping) and choice.get("type") == "tool":
                for t in body.get("tools") or []:
                    if t.get("name") == choice.get("name"):
                        schema, tool = t.get("input_schema") or {"type": "object"}, True
    return prompt, schema, tool, all_text


def openai_completion_body(
    answer: SimAnswer, model: str, tin: int, tout: int, cid: str, cached: int = 0
) -> dict[str, Any]:
    """A chat.completion object for `answer` (the shape the openai SDK parses); `cached` of
    the `tin` prompt tokens came from the prompt cache."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
    finish = answer.finish
    if answer.value is not None:
        args = compact(answer.value)
        if answer.finish == "length":
            args = args[: max(1, len(args) - 2)]  # a cut tool call is cut JSON
        message["content"] = None
        message["tool_calls"] = [
            {"id": "call_" + cid[-12:], "type": "function", "function": {"name": "answer", "arguments": args}}
        ]
        finish = "length" if answer.finish == "length" else "tool_calls"
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": tin,
            "completion_tokens": tout,
            "total_tokens": tin + tout,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        },
        "system_fingerprint": "sim",
    }


def anthropic_message_body(
    answer: SimAnswer, model: str, tin: int, tout: int, mid: str, cache_read: int = 0, cache_write: int = 0
) -> dict[str, Any]:
    """A Message object for `answer` (the shape the anthropic SDK parses). Of the `tin` prompt
    tokens, `cache_read` came from the prompt cache and `cache_write` went into it; Anthropic's
    `input_tokens` counts only the others."""
    if answer.value is not None:
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": "toolu_" + mid[-12:], "name": "answer", "input": answer.value}
        ]
        stop = "max_tokens" if answer.finish == "length" else "tool_use"
    else:
        content = [{"type": "text", "text": answer.text}] if answer.text else []
        stop = "max_tokens" if answer.finish == "length" else "end_turn"
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(tin - cache_read - cache_write, 0),
            "output_tokens": tout,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        },
    }


def file_object(file_id: str, filename: str, size: int, purpose: str) -> dict[str, Any]:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
    }
