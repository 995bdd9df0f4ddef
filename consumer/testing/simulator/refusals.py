"""Request validation: what the real APIs refuse with a 400 before any model runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

#: the message roles the Chat Completions API accepts, in the order its refusal names them
OPENAI_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
#: the roles of Anthropic's `messages[]`; a system prompt is the top-level `system` field
ANTHROPIC_ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a provider refuses a request body (HTTP 400 `invalid_request_error`)."""

    message: str  # the provider's own wording
    param: str | None = None  # OpenAI's `param`: the offending field, e.g. "messages[0].role"
    code: str | None = None  # OpenAI's `code`, e.g. "empty_array"


#: JSON types as OpenAI's invalid_type refusals name them; bool before int, which it subclasses
_JSON_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a decimal"),
    (str, "a string"),
    (list, "an array"),
)


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong_type(param: str, expected: str, value: Any) -> Refusal:
    got = "null" if value is None else next((n for t, n in _JSON_KINDS if isinstance(value, t)), "an object")
    return Refusal(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type"
    )


def _openai_refusal(body: Mapping[str, Any]) -> Refusal | None:
    model = body.get("model")
    if model is None or model == "":
        return Refusal("you must provide a model parameter")
    if not isinstance(model, str):
        return _wrong_type("model", "a string", model)
    messages = body.get("messages")
    if messages is None:
        return Refusal("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        return _wrong_type("messages", "an array", messages)
    if not messages:
        return Refusal(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "messages",
            "empty_array",
        )
    supported = ", ".join(f"'{r}'" for r in OPENAI_ROLES[:-1]) + f", and '{OPENAI_ROLES[-1]}'"
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, Mapping):
            return _wrong_type(where, "an object", message)
        role = message.get("role")
        if role is None:
            return Refusal(
                f"Missing required parameter: '{where}.role'.", f"{where}.role", "missing_required_parameter"
            )
        if role not in OPENAI_ROLES:
            return Refusal(
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                f"{where}.role",
                "invalid_value",
            )
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not is_int(value):
            return _wrong_type(name, "an integer", value)
        if value is not None and value < 1:
            return Refusal(
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1, "
                f"but got {value} instead.",
                name,
                "integer_below_min_value",
            )
    return None


def _anthropic_refusal(body: Mapping[str, Any], *, in_batch: bool) -> Refusal | None:
    model = body.get("model")
    if model is None:
        return Refusal("model: Field required")
    if not isinstance(model, str):
        return Refusal("model: Input should be a valid string")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        return Refusal("max_tokens: Field required")
    if not is_int(max_tokens):
        return Refusal("max_tokens: Input should be a valid integer")
    # 0 only fills the prompt cache; a batch runs too late for that, so there it must be >= 1
    least = 1 if in_batch else 0
    if max_tokens < least:
        return Refusal(f"max_tokens: Input should be greater than or equal to {least}")
    messages = body.get("messages")
    if messages is None:
        return Refusal("messages: Field required")
    if not isinstance(messages, list):
        return Refusal("messages: Input should be a valid list")
    if not messages:
        return Refusal("messages: at least one message is required")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return Refusal(f"messages.{index}: Input should be a valid dictionary")
        role = message.get("role")
        if role is None:
            return Refusal(f"messages.{index}.role: Field required")
        if role == "system":
            return Refusal(
                'messages: Unexpected role "system". The Messages API accepts a top-level `system` '
                'parameter, not "system" as an input message role.'
            )
        if role not in ANTHROPIC_ROLES:
            return Refusal(f"messages.{index}.role: Input should be 'user' or 'assistant'")
    return None


def request_refusal(body: Any, kind: str, *, in_batch: bool = False) -> Refusal | None:
    """What the real API would refuse in a chat (`kind` "openai") or messages ("anthropic")
    request body, checked the way the provider reports it; None when it would be served.

    Checked: `model` present, `messages` a non-empty list of objects whose `role` the provider
    knows, the output-token limits (OpenAI `max_tokens` / `max_completion_tokens` >= 1 when
    set; Anthropic `max_tokens` required, >= 0, >= 1 inside a Message Batch). `in_batch`: the
    body is an OpenAI batch line's `body` or an Anthropic batch request's `params`.
    """
    if not isinstance(body, Mapping):
        return Refusal("the request body must be a JSON object")
    if kind == "openai":
        return _openai_refusal(body)
    return _anthropic_refusal(body, in_batch=in_batch)
