"""A fake LLM provider: OpenAI and Anthropic wire formats on 127.0.0.1, with seeded faults.

Routes (the official `openai` and `anthropic` SDKs parse the answers):

    OpenAI     POST /v1/chat/completions      POST /v1/files            GET /v1/files/{id}/content
               POST /v1/batches               GET  /v1/batches/{id}     POST /v1/batches/{id}/cancel
    Anthropic  POST /v1/messages              POST /v1/messages/batches GET /v1/messages/batches/{id}
               GET  /v1/messages/batches/{id}/results                   POST /v1/messages/batches/{id}/cancel
    Control    GET  /_sim/stats (counters as JSON)                      POST /_sim/reset
               POST /_sim/config {knob: value, ...} changes faults while running (names as in --faults)

The model (deterministic, so a test can check every answer went to the right job)
---------------------------------------------------------------------------------
The prompt is the text of the LAST user message.

* Ordinary prompt: its input is `extract_input(prompt)`: the text after the last line that
  ends with ":" (the template's data-marker line), stripped; the whole message stripped when no
  line ends with ":". The answer is `answer_for(input)` = "sim:" + the first 12 hex digits of
  sha256(input) (distinct per input).
* Batched prompt (DESIGN.md rule 6): the last line of the message that is a JSON array of
  objects `{"id": ALIAS, "input": ...}` lists the items; the answer is ONE compact JSON object
  `{ALIAS: answer_for(input), ...}` (`batched_answer`).
* Structured requests (OpenAI/vLLM `response_format` json_schema, llama.cpp json_object +
  schema, OpenAI function tool forced by `tool_choice`, Anthropic tool forced by `tool_choice`):
  the answer is `value_for_schema(schema, input)` — strings are `answer_for(input)`, enums pick
  a member by the input's hash, integers are len(input), objects fill every property; a batched
  request fills each ALIAS property with its own item's input (an alias-free schema, whose
  `additionalProperties` gives every answer's schema, fills every alias of the prompt).
  Forced tools answer with a tool call / `tool_use` block; the others as JSON text.
  `ignore_structured` answers as if no schema had been sent.
* Usage: input tokens = ceil(characters of all messages / 4); output tokens = ceil(len(answer) / 4).
* Prompt caching (`PromptCache`), as each API reports it. Anthropic: a `cache_control`
  breakpoint caches everything up to it (tools, system, message blocks) when that prefix has
  at least the model's minimum (`anthropic.min_cacheable_tokens`); the first request writes it
  (`cache_creation_input_tokens`), one with the same prefix within `CACHE_TTL_S` reads it
  (`cache_read_input_tokens`), and `input_tokens` counts the rest. OpenAI: automatic, per
  `prompt_cache_key`: the longest prefix a recent request of that key shared with this one
  (tools and response_format first, then the messages), from 1,024 tokens on in steps of 128,
  is `usage.prompt_tokens_details.cached_tokens` (included in `prompt_tokens`).
  An answer longer than `max_tokens` tokens (max_tokens * 4 characters) is cut and ends with
  finish_reason "length" / stop_reason "max_tokens".

Refusals: a chat/messages request body the real API refuses (`request_refusal`: no `model`, an
empty `messages` list, an unknown message role, an output-token limit below the minimum) is
answered 400 in the provider's error shape before any fault is drawn; in an offline batch the
same request ends errored (OpenAI: a 400 line of the error file; Anthropic: an `errored` result).

Faults (`SimulatorConfig`, seeded by `seed`) are decided per chat/messages request in this
order: auth (401 when `api_key` is set and not presented), billing 429 (quota), a shared 429
(`shared_429_rate`: another client of the key spent its budget, which no header announced;
Retry-After only), rate limit 429 (`rpm`/`tpm` per `rate_window_s`, each a token bucket
refilled continuously, with Retry-After, retry-after-ms and x-ratelimit-* /
anthropic-ratelimit-* headers), then the
request waits for a capacity slot and its latency, then drop (connection closed with no
response), hang (sleeps `hang_s`), 5xx (500) and overload (503 OpenAI / 529 Anthropic).
Batched answers may then be malformed (not JSON), truncated (cut JSON, finish_reason
length), missing one alias or carrying an extra alias. Offline
batches finish `batch_delay_s` after creation, with `batch_error_rate` items errored and
`batch_expire_rate` items expired (an OpenAI batch with any expired item ends "expired").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, TypeGuard

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from consumer.providers.anthropic import min_cacheable_tokens
from consumer.providers.ratelimit import format_duration

log = logging.getLogger(__name__)

#: the retry-after-ms of a shared 429 (Retry-After says 1 s: whole seconds, at least 1)
SHARED_429_RETRY_MS = 200

# ----------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """Every knob of the simulator. Rates are probabilities in [0, 1]; 0 disables a fault."""

    seed: int = 0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    capacity: int = 0
    load_ms: float = 0.0
    rpm: int = 0
    tpm: int = 0
    rate_window_s: float = 60.0
    error_rate: float = 0.0
    overload_rate: float = 0.0
    hang_rate: float = 0.0
    hang_s: float = 300.0
    drop_rate: float = 0.0
    malformed_rate: float = 0.0
    truncated_rate: float = 0.0
    missing_rate: float = 0.0
    extra_rate: float = 0.0
    billing_rate: float = 0.0
    shared_429_rate: float = 0.0
    api_key: str | None = field(default=None, repr=False)
    ignore_structured: bool = False
    batch_delay_s: float = 0.0
    batch_error_rate: float = 0.0
    batch_expire_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Knob:
    """One SimulatorConfig field as the CLI shows it: `--faults` names and help."""

    field: str
    names: tuple[str, ...]
    help: str


KNOBS: tuple[Knob, ...] = (
    Knob("seed", ("seed",), "seed of every random decision (default 0)"),
    Knob("latency_ms", ("latency", "latency_ms"), "mean service time of a chat request, ms (default 0)"),
    Knob("jitter_ms", ("jitter", "jitter_ms"), "latency is uniform in latency_ms +/- jitter_ms (default 0)"),
    Knob(
        "capacity",
        ("capacity",),
        "chat requests served at once; beyond it they queue and latency rises (0 = unlimited)",
    ),
    Knob(
        "load_ms",
        ("load", "load_ms"),
        "extra latency per other request being served, like a continuous-batching server (default 0)",
    ),
    Knob(
        "rpm",
        ("429_rpm", "rpm"),
        "request bucket: holds rpm, refills rpm per rate window; empty -> 429 + Retry-After (0 = no limit)",
    ),
    Knob(
        "tpm",
        ("429_tpm", "tpm"),
        "token bucket: holds tpm, refills tpm per rate window; short -> 429 + Retry-After (0 = no limit)",
    ),
    Knob(
        "rate_window_s",
        ("rate_window", "rate_window_s"),
        "seconds in which the rpm/tpm buckets refill from empty to full (default 60)",
    ),
    Knob("error_rate", ("5xx", "500", "error_rate"), "share of chat requests answered 500"),
    Knob(
        "overload_rate",
        ("overload", "503", "529", "overload_rate"),
        "share answered 503 (OpenAI) / 529 (Anthropic) overloaded",
    ),
    Knob("hang_rate", ("hang", "hang_rate"), "share that hang for hang_s (past the client's timeout)"),
    Knob("hang_s", ("hang_s",), "how long a hanging request sleeps before answering, s (default 300)"),
    Knob("drop_rate", ("drop", "drop_rate"), "share whose connection is closed with no response"),
    Knob("malformed_rate", ("malformed", "malformed_rate"), "share of batched answers that are not JSON"),
    Knob(
        "truncated_rate",
        ("truncated", "truncated_rate"),
        "share of batched answers cut short (finish_reason length / stop_reason max_tokens)",
    ),
    Knob(
        "missing_rate",
        ("missing", "missing_alias", "missing_rate"),
        "share of batched answers missing an alias",
    ),
    Knob(
        "extra_rate", ("extra", "extra_alias", "extra_rate"), "share of batched answers with an extra alias"
    ),
    Knob(
        "shared_429_rate",
        ("shared_429", "shared_429_rate"),
        "share answered 429 + Retry-After though the buckets hold them (another client of the key)",
    ),
    Knob(
        "billing_rate",
        ("billing", "quota", "billing_rate"),
        "share answered 429 quota exhausted (OpenAI insufficient_quota, Anthropic spend limit)",
    ),
    Knob(
        "api_key",
        ("auth", "api_key"),
        "require this key (Authorization: Bearer / x-api-key), else 401 (default: no auth)",
    ),
    Knob(
        "ignore_structured",
        ("ignore_structured",),
        "answer as if no response_format / forced tool had been sent (true/false)",
    ),
    Knob(
        "batch_delay_s",
        ("batch_delay", "batch_delay_s"),
        "an offline batch finishes this long after creation, s",
    ),
    Knob(
        "batch_error_rate", ("batch_errored", "batch_error_rate"), "share of offline batch items that error"
    ),
    Knob(
        "batch_expire_rate",
        ("batch_expired", "batch_expire_rate"),
        "share of offline batch items that expire",
    ),
)
_KNOB_BY_NAME = {name: k.field for k in KNOBS for name in k.names}
_FIELD_TYPES = {f.name: f.type for f in fields(SimulatorConfig)}


def _convert(field_name: str, raw: str) -> Any:
    kind = str(_FIELD_TYPES[field_name])
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"{field_name}: expected true/false, got {raw!r}")
        return lowered in ("1", "true", "yes", "on")
    if kind == "int":
        return int(float(raw))
    if kind == "float":
        return float(raw)
    return raw or None


def parse_faults(text: str, base: SimulatorConfig | None = None) -> SimulatorConfig:
    """`"5xx=0.05,429_rpm=600,malformed=0.1"` -> a SimulatorConfig (over `base`). ValueError on bad input."""
    changes: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"fault {part!r} is not name=value")
        key = _KNOB_BY_NAME.get(name.strip().lower().replace("-", "_"))
        if key is None:
            raise ValueError(f"unknown fault {name!r}; known: {sorted(_KNOB_BY_NAME)}")
        changes[key] = _convert(key, value.strip())
    return replace(base or SimulatorConfig(), **changes)


# ----------------------------------------------------------------------------------------------
# the deterministic model


def answer_for(text: str) -> str:
    """The simulator's answer to one input: "sim:" + sha256(input)[:12] (distinct per input)."""
    return "sim:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def extract_input(prompt_text: str) -> str:
    """An ordinary prompt's input: the text after the last line ending with ":", stripped;
    the whole text stripped when no line ends with ":"."""
    lines = prompt_text.split("\n")
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].rstrip().endswith(":"):
            return "\n".join(lines[index + 1 :]).strip()
    return prompt_text.strip()


def parse_batch_items(prompt_text: str) -> list[tuple[str, str]] | None:
    """A batched prompt's items [(alias, input)] from its JSON-array line; None when not batched."""
    for line in reversed(prompt_text.split("\n")):
        stripped = line.strip()
        if not (stripped.startswith("[") and stripped.endswith("]")):
            continue
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            continue
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) and isinstance(v.get("id"), str) and "input" in v for v in value)
        ):
            return [
                (v["id"], v["input"] if isinstance(v["input"], str) else orjson.dumps(v["input"]).decode())
                for v in value
            ]
    return None


def _digest_int(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


def value_for_schema(schema: Any, text: str, _depth: int = 0) -> Any:
    """A value obeying `schema`, determined by `text` (see the module docstring)."""
    if not isinstance(schema, Mapping) or _depth > 8:
        return answer_for(text)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[_digest_int(text) % len(enum)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for_schema(options[0], text, _depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {name: value_for_schema(sub, text, _depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [value_for_schema(schema.get("items", {}), text, _depth + 1)]
    if kind == "integer":
        return len(text)
    if kind == "number":
        return float(len(text))
    if kind == "boolean":
        return len(text) % 2 == 0
    if kind == "null":
        return None
    return answer_for(text)


def batched_answer(
    items: Sequence[tuple[str, str]], schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The correct answer to a batched prompt: {alias: value}; string values are answer_for(input)."""
    props = (schema or {}).get("properties") or {}
    # an alias-free schema (a map whose values follow additionalProperties) fits every alias
    extra = (schema or {}).get("additionalProperties")
    default = extra if isinstance(extra, Mapping) else {"type": "string"}
    return {alias: value_for_schema(props.get(alias, default), text) for alias, text in items}


def estimate_tokens(text: str) -> int:
    """Usage tokens ~ len(text) / 4 (at least 1 for non-empty text)."""
    return math.ceil(len(text) / 4)


#: how long a cached prefix lives after its last use (Anthropic's default, ephemeral 5 minutes)
CACHE_TTL_S = 300.0
#: OpenAI caches prompts of at least this many tokens, in steps of OPENAI_CACHE_STEP_TOKENS
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128
#: recent prompts remembered per OpenAI prompt_cache_key
OPENAI_CACHE_PROMPTS = 64


def _anthropic_blocks(content: Any) -> list[tuple[str, bool]]:
    """(text, ends a cached prefix) of each text block of a system or message content."""
    if isinstance(content, str):
        return [(content, False)]
    if not isinstance(content, list):
        return []
    return [
        (str(part.get("text", "")), isinstance(part.get("cache_control"), Mapping))
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    ]


def _common_prefix_chars(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest equal prefix, by halving (slices compare in C)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptCache:
    """The simulator's prompt cache: what a request reads from it and writes to it (tokens)."""

    def __init__(self) -> None:
        self._anthropic: dict[str, float] = {}
        self._openai: dict[str | None, list[tuple[str, str]]] = {}

    def anthropic(self, body: Mapping[str, Any], now_s: float) -> tuple[int, int]:
        """(cache_read_input_tokens, cache_creation_input_tokens) of a Messages body."""
        texts: list[str] = []
        cached_chars: int | None = None
        blocks = _anthropic_blocks(body.get("system")) + [
            block
            for m in body.get("messages") or []
            if isinstance(m, Mapping)
            for block in _anthropic_blocks(m.get("content"))
        ]
        for text, marked in blocks:
            texts.append(text)
            if marked:
                cached_chars = sum(len(t) for t in texts)
        if cached_chars is None:
            return 0, 0
        prefix = "".join(texts)[:cached_chars]
        tokens = estimate_tokens(prefix)
        if tokens < min_cacheable_tokens(str(body.get("model") or "")):
            return 0, 0
        tools = orjson.dumps(body.get("tools") or [], option=orjson.OPT_SORT_KEYS).decode()
        digest = hashlib.sha256(f"{body.get('model')}\0{tools}\0{prefix}".encode()).hexdigest()
        last = self._anthropic.get(digest)
        self._anthropic[digest] = now_s
        if last is not None and now_s - last <= CACHE_TTL_S:
            return tokens, 0
        return 0, tokens

    def openai(self, body: Mapping[str, Any], prompt_text: str) -> int:
        """`cached_tokens` of a chat completion body whose messages' text is `prompt_text`."""
        head = orjson.dumps(
            [body.get("model"), body.get("tools"), body.get("response_format")], option=orjson.OPT_SORT_KEYS
        ).decode()
        key = body.get("prompt_cache_key")
        recent = self._openai.setdefault(key if isinstance(key, str) else None, [])
        best = 0
        for seen_head, seen_text in recent:
            if seen_head == head:
                best = max(best, _common_prefix_chars(seen_text, prompt_text))
        recent.append((head, prompt_text))
        del recent[:-OPENAI_CACHE_PROMPTS]
        tokens = best // 4  # whole tokens of the shared characters
        if tokens < OPENAI_CACHE_MIN_TOKENS:
            return 0
        stepped = tokens // OPENAI_CACHE_STEP_TOKENS * OPENAI_CACHE_STEP_TOKENS
        return min(stepped, estimate_tokens(prompt_text))

    def usage(self, kind: str, body: Mapping[str, Any], all_text: str, now_s: float) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it) of one request of either API."""
        if kind == "anthropic":
            return self.anthropic(body, now_s)
        return self.openai(body, all_text), 0


@dataclass(slots=True)
class SimAnswer:
    """What the model produced for one request."""

    text: str
    value: Any  # structured value for tool answers (None: answer as text)
    finish: str  # "stop" | "length"
    items: int
    batched: bool
    fault: str | None = None


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _partial(value: dict[str, Any], max_chars: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        out[key] = item
        if len(_compact(out)) > max_chars:
            del out[key]
            break
    return out


def model_answer(
    prompt_text: str,
    schema: Mapping[str, Any] | None,
    *,
    tool: bool,
    max_tokens: int | None,
    rng: random.Random | None = None,
    config: SimulatorConfig | None = None,
) -> SimAnswer:
    """Answer one prompt. With `rng` and `config`, batched answers may carry the configured faults."""
    items = parse_batch_items(prompt_text)
    fault: str | None = None
    finish = "stop"
    if items is not None:
        value: Any = batched_answer(items, schema)
        if rng is not None and config is not None:
            roll = rng.random()
            edges = (
                ("malformed", config.malformed_rate),
                ("truncated", config.truncated_rate),
                ("missing", config.missing_rate),
                ("extra", config.extra_rate),
            )
            acc = 0.0
            for name, rate in edges:
                acc += rate
                if roll < acc:
                    fault = name
                    break
        if fault == "missing":
            del value[rng.choice(sorted(value)) if rng else next(iter(value))]
        elif fault == "extra":
            value["x" + format(rng.getrandbits(24) if rng else 0, "06x")] = answer_for("extra")
        text = _compact(value)
        if fault == "malformed":
            text = "Sure! Here are the answers:\n" + "\n".join(f"- {a}: {answer_for(t)}" for a, t in items)
            value = None
        elif fault == "truncated":
            text = text[: max(1, len(text) // 2)]
            value = _partial(value, len(text))
            finish = "length"
        n_items = len(items)
    else:
        value = value_for_schema(schema, extract_input(prompt_text)) if schema is not None else None
        text = _compact(value) if value is not None else answer_for(extract_input(prompt_text))
        n_items = 1
    if max_tokens is not None and estimate_tokens(text) > max_tokens:
        text = text[: max_tokens * 4]
        if isinstance(value, dict):
            value = _partial(value, len(text))
        finish = "length"
    if not tool or not text:
        value = None  # max_tokens 0 (Anthropic: only fill the prompt cache) generates nothing
    return SimAnswer(text, value, finish, n_items, items is not None, fault)


# ----------------------------------------------------------------------------------------------
# request validation: what the real APIs refuse with a 400 before any model runs

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


def _is_int(value: Any) -> TypeGuard[int]:
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
        if value is not None and not _is_int(value):
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
    if not _is_int(max_tokens):
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


# ----------------------------------------------------------------------------------------------
# server state


def _now_iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).isoformat().replace("+00:00", "Z")


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def _parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
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


class TokenBucket:
    """One rate limit as a token bucket: at most `capacity`, refilled continuously at
    `rate_per_s`, full at the start (a fresh API key has its whole budget)."""

    def __init__(self) -> None:
        self.capacity = 0.0
        self.rate_per_s = 0.0
        self.level = 0.0
        self.at_s: float | None = None

    def configure(self, count: int, window_s: float, now_s: float) -> None:
        """Take the limit (`count` per `window_s`) and refill up to `now_s`."""
        capacity, rate_per_s = float(count), count / window_s if window_s > 0 else 0.0
        if self.at_s is None or self.capacity <= 0:
            self.level = capacity
        elif rate_per_s > 0:
            self.level = min(self.level + (now_s - self.at_s) * self.rate_per_s, capacity)
        self.capacity, self.rate_per_s, self.at_s = capacity, rate_per_s, now_s

    def holds(self, amount: float) -> bool:
        """True if `amount` can be taken now (float rounding of the refill forgiven)."""
        return self.level >= amount - 1e-9

    def wait_for_s(self, amount: float) -> float:
        """Seconds until the bucket holds `amount`."""
        return max(0.0, (amount - self.level) / self.rate_per_s) if self.rate_per_s > 0 else math.inf

    def full_in_s(self) -> float:
        """Seconds until the bucket is full again (the providers' "reset")."""
        return self.wait_for_s(self.capacity)

    def take(self, amount: float) -> None:
        """Count an admitted request."""
        self.level -= amount


@dataclass
class _Batch:
    id: str
    kind: str  # "openai" | "anthropic"
    created_s: float
    lines: list[dict[str, Any]]  # openai: input lines; anthropic: {custom_id, params}
    input_file_id: str | None = None
    endpoint: str = "/v1/chat/completions"
    completion_window: str = "24h"
    status: str = "in_progress"
    cancelled_s: float | None = None
    ended_s: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)  # anthropic result lines
    counts: Counter[str] = field(default_factory=Counter)


class _Stats:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.routes: Counter[str] = Counter()
        self.inflight = 0
        self.max_inflight = 0

    def snapshot(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        keys = (
            "requests",
            "items_answered",
            "batched_requests",
            "status_429",
            "quota_429",
            "shared_429",
            "status_5xx",
            "status_401",
            "hangs",
            "drops",
            "malformed",
            "truncated",
            "missing",
            "extra",
            "structured_requests",
            "batches_created",
            "batch_items",
            "cached_tokens",
            "cache_write_tokens",
        )
        out: dict[str, Any] = {k: self.counters.get(k, 0) for k in keys}
        out["routes"] = dict(self.routes)
        out["inflight"] = self.inflight
        out["max_inflight"] = self.max_inflight
        return out


class _Dropped(Exception):
    """The handler closed the connection: send nothing."""


@dataclass(frozen=True, slots=True)
class _Call:
    """What the shared endpoint preamble hands a provider route's handler."""

    kind: str  # "openai" | "anthropic": whose wire format and error shape
    parsed: dict[str, Any] | None = None  # the JSON object body, on routes that take one
    found: _Batch | None = None  # the path's batch, on /batches/{batch_id} routes

    @property
    def body(self) -> dict[str, Any]:
        """The parsed JSON object body (routes declared with `body=True`)."""
        if self.parsed is None:
            raise RuntimeError("this route does not parse a body")
        return self.parsed

    @property
    def batch(self) -> _Batch:
        """The batch named by the path (routes declared with `batch=True`)."""
        if self.found is None:
            raise RuntimeError("this route does not look up a batch")
        return self.found


_Handler = Callable[["SimulatorApp", Request, _Call], Awaitable[Response]]
_Route = Callable[["SimulatorApp", Request], Awaitable[Response]]


def _endpoint(
    kind: str, *, body: bool = False, batch: bool = False, chat: bool = False
) -> Callable[[_Handler], _Route]:
    """Give a provider route the preamble every one of them shares (`SimulatorApp._preamble`):
    the handler runs only for an authorized request whose body and batch were found, and a
    dropped connection answers nothing. `chat`: the route counts as a model request."""

    def wrap(handler: _Handler) -> _Route:
        @functools.wraps(handler)
        async def route(self: SimulatorApp, request: Request) -> Response:
            try:
                call = await self._preamble(request, kind, body=body, batch=batch, chat=chat)
                return call if isinstance(call, Response) else await handler(self, request, call)
            except _Dropped:
                return Response(status_code=500)  # never sent: the connection is gone

        return route

    return wrap


class SimulatorApp:
    """The Starlette app and its state. `server` (a uvicorn.Server) is set when served, so drops
    can close the client's connection."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.server: uvicorn.Server | None = None
        self._stop = asyncio.Event()
        self.reset()
        routes = [
            Route("/v1/chat/completions", self.openai_chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/files", self.openai_upload, methods=["POST"]),
            Route("/v1/files/{file_id}/content", self.openai_file_content, methods=["GET"]),
            Route("/v1/batches", self.openai_create_batch, methods=["POST"]),
            Route("/v1/batches/{batch_id}", self.openai_get_batch, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.openai_cancel_batch, methods=["POST"]),
            Route("/v1/messages", self.anthropic_messages, methods=["POST"]),
            Route("/v1/messages/batches", self.anthropic_create_batch, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}", self.anthropic_get_batch, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/results", self.anthropic_results, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/cancel", self.anthropic_cancel_batch, methods=["POST"]),
            Route("/_sim/stats", self.stats, methods=["GET"]),
            Route("/_sim/reset", self.reset_route, methods=["POST"]),
            Route("/_sim/config", self.config_route, methods=["GET", "POST"]),
        ]
        self.app = Starlette(routes=routes)

    def reset(self) -> None:
        """Forget counters, rate windows, files and batches; re-seed the rng."""
        self.rng = random.Random(self.config.seed)
        self.stats_ = _Stats()
        self.buckets = {"requests": TokenBucket(), "tokens": TokenBucket()}
        self.limited_by = "requests"
        self.files: dict[str, tuple[str, bytes]] = {}
        self.batches: dict[str, _Batch] = {}
        self.prompt_cache = PromptCache()
        self._ids = 0
        self._sem = asyncio.Semaphore(self.config.capacity) if self.config.capacity > 0 else None

    def configure(self, config: SimulatorConfig) -> None:
        """Use `config` from now on (counters, files and batches are kept; requests already
        waiting for a capacity slot keep the old limit)."""
        capacity_changed = config.capacity != self.config.capacity
        self.config = config
        if capacity_changed:
            self._sem = asyncio.Semaphore(config.capacity) if config.capacity > 0 else None

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids:06d}{self.rng.getrandbits(32):08x}"

    # -------- control routes

    async def stats(self, request: Request) -> Response:
        """GET /_sim/stats."""
        return JSONResponse(self.stats_.snapshot())

    async def reset_route(self, request: Request) -> Response:
        """POST /_sim/reset."""
        self.reset()
        return JSONResponse({"ok": True})

    async def config_route(self, request: Request) -> Response:
        """GET /_sim/config: the knobs; POST {knob: value, ...} (names as in --faults) changes them."""
        if request.method == "POST":
            try:
                changes = orjson.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("body must be a JSON object of knob: value")
                text = ",".join(
                    f"{k}={'' if v is None else str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in changes.items()
                )
                self.configure(parse_faults(text, self.config))
            except (orjson.JSONDecodeError, ValueError) as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        shown = {f.name: getattr(self.config, f.name) for f in fields(SimulatorConfig)}
        shown["api_key"] = "(set)" if self.config.api_key else None
        return JSONResponse(shown)

    # -------- shared request path

    def _count(self, request: Request) -> None:
        route_obj = request.scope.get("route")
        path = getattr(route_obj, "path", None) or request.url.path
        route = f"{request.method} {path}"
        self.stats_.routes[route] += 1

    def _authorized(self, request: Request, kind: str) -> bool:
        wanted = self.config.api_key
        if not wanted:
            return True
        bearer = request.headers.get("authorization") == f"Bearer {wanted}"
        if kind == "openai":
            return bearer
        # Anthropic: x-api-key; recent anthropic SDKs send the key as a bearer token instead
        return request.headers.get("x-api-key") == wanted or bearer

    def _unauthorized(self, kind: str) -> Response:
        """The 401 each provider sends for a missing or wrong key, in its own words."""
        if kind == "openai":
            return self._error(
                kind, 401, "invalid_request_error", "Incorrect API key provided.", code="invalid_api_key"
            )
        return self._error(kind, 401, "authentication_error", "invalid x-api-key")

    def _error(
        self,
        kind: str,
        status: int,
        etype: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        if kind == "openai":
            body: dict[str, Any] = {
                "error": {"message": message, "type": etype, "param": param, "code": code}
            }
        else:
            body = {"type": "error", "error": {"type": etype, "message": message}}
        if status == 429:
            self.stats_.counters["status_429"] += 1
        elif status >= 500:
            self.stats_.counters["status_5xx"] += 1
        elif status == 401:
            self.stats_.counters["status_401"] += 1
        return JSONResponse(body, status_code=status, headers=dict(headers or {}))

    def _refuse(self, kind: str, refusal: Refusal) -> Response:
        """The 400 a provider sends for a body it refuses, in its own error shape."""
        return self._error(
            kind, 400, "invalid_request_error", refusal.message, code=refusal.code, param=refusal.param
        )

    async def _preamble(
        self, request: Request, kind: str, *, body: bool, batch: bool, chat: bool
    ) -> _Call | Response:
        """The steps every provider route takes before its own, in this order: count the route
        (and, on a chat route, the request, refused or not), check the key (401), parse the body
        as a JSON object (400), find the path's batch of this provider and bring it up to date
        (404). Returns what the handler needs, or the error response to send instead."""
        self._count(request)
        if chat:
            self.stats_.counters["requests"] += 1
        if not self._authorized(request, kind):
            return self._unauthorized(kind)
        parsed: dict[str, Any] | None = None
        if body:
            try:
                value = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                value = None
            if not isinstance(value, dict):
                return self._error(
                    kind, 400, "invalid_request_error", "the request body is not a JSON object"
                )
            parsed = value
        found: _Batch | None = None
        if batch:
            found = self.batches.get(request.path_params["batch_id"])
            if found is None or found.kind != kind:
                return self._error(
                    kind,
                    404,
                    "not_found_error" if kind == "anthropic" else "invalid_request_error",
                    "batch not found",
                )
            self._advance(found)
        return _Call(kind, parsed, found)

    def _rate_headers(
        self, kind: str, now_s: float, tokens_needed: int
    ) -> tuple[dict[str, str], float | None]:
        """Rate-limit headers and, when over a limit, seconds until the request would fit.

        Each limit is a token bucket, as OpenAI and Anthropic document theirs: it holds at most
        the per-window count (`rpm`, `tpm`), refills continuously at count / `rate_window_s`
        per second, and an admitted request takes 1 request and its tokens. Headers: the limit,
        what remains after this request (rounded down), and the reset: the time until the bucket
        is full again (OpenAI: a duration; Anthropic: an RFC 3339 time). A request that does not
        fit is not counted; its 429 carries Retry-After (whole seconds, at least 1) and, OpenAI
        style, retry-after-ms: the time until it would fit (a request larger than the token
        limit never fits: it is told the time until the bucket is full).
        """
        cfg = self.config
        if not cfg.rpm and not cfg.tpm:
            return {}, None
        window_s = cfg.rate_window_s
        req_bucket = self.buckets["requests"]
        tok_bucket = self.buckets["tokens"]
        req_bucket.configure(cfg.rpm, window_s, now_s)
        tok_bucket.configure(cfg.tpm, window_s, now_s)
        wait_s: float | None = None
        if cfg.rpm and not req_bucket.holds(1):
            wait_s = req_bucket.wait_for_s(1)
            self.limited_by = "requests"
        if cfg.tpm and not tok_bucket.holds(tokens_needed):
            tok_wait_s = tok_bucket.wait_for_s(min(tokens_needed, cfg.tpm))
            if wait_s is None or tok_wait_s > wait_s:
                self.limited_by = "tokens"
            wait_s = max(wait_s or 0.0, tok_wait_s)
        if wait_s is None:
            if cfg.rpm:
                req_bucket.take(1)
            if cfg.tpm:
                tok_bucket.take(tokens_needed)
        headers: dict[str, str] = {}
        for what, limit, bucket in (("requests", cfg.rpm, req_bucket), ("tokens", cfg.tpm, tok_bucket)):
            if not limit:
                continue
            remaining = str(max(0, math.floor(bucket.level)))
            if kind == "openai":
                headers[f"x-ratelimit-limit-{what}"] = str(limit)
                headers[f"x-ratelimit-remaining-{what}"] = remaining
                headers[f"x-ratelimit-reset-{what}"] = format_duration(bucket.full_in_s())
            else:
                headers[f"anthropic-ratelimit-{what}-limit"] = str(limit)
                headers[f"anthropic-ratelimit-{what}-remaining"] = remaining
                headers[f"anthropic-ratelimit-{what}-reset"] = _now_iso(time.time() + bucket.full_in_s())
        if wait_s is not None:
            wait_s = max(wait_s, 0.001)
            headers["retry-after"] = str(max(1, math.ceil(wait_s)))
            if kind == "openai":
                headers["retry-after-ms"] = str(max(1, math.ceil(wait_s * 1000)))
        return headers, wait_s

    def _drop(self, request: Request) -> None:
        server = self.server
        if server is not None:
            for conn in list(server.server_state.connections):
                if getattr(conn, "scope", None) is request.scope:
                    transport = getattr(conn, "transport", None)
                    if transport is not None:
                        transport.close()
                        return
        raise _Dropped("no connection to drop")

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _chat(self, request: Request, call: _Call) -> Response:
        """The shared path of /v1/chat/completions and /v1/messages, after the preamble."""
        kind, body = call.kind, call.body
        cfg, counters = self.config, self.stats_.counters
        refusal = request_refusal(body, kind)
        if refusal is not None:
            return self._refuse(kind, refusal)
        if body.get("stream"):
            return self._error(kind, 400, "invalid_request_error", "stream: streaming is not simulated")
        if self.rng.random() < cfg.billing_rate:
            counters["quota_429"] += 1
            if kind == "openai":
                return self._error(
                    kind,
                    429,
                    "insufficient_quota",
                    "You exceeded your current quota, please check your plan and billing details.",
                    code="insufficient_quota",
                )
            return self._error(
                kind,
                429,
                "rate_limit_error",
                "You have reached your specified API usage limits. "
                "You will regain access on 2099-01-01 at 00:00 UTC.",
            )

        # drawn only when enabled: seeded runs without it keep their sequence of faults
        if cfg.shared_429_rate and self.rng.random() < cfg.shared_429_rate:
            counters["shared_429"] += 1
            retry = {"retry-after": "1"}
            if kind == "openai":
                retry["retry-after-ms"] = str(SHARED_429_RETRY_MS)
            return self._error(
                kind,
                429,
                "rate_limit_error" if kind == "anthropic" else "requests",
                "Rate limit reached: the key's budget was spent by another client. Please try again "
                f"in {SHARED_429_RETRY_MS / 1000:g}s.",
                code="rate_limit_exceeded",
                headers=retry,
            )
        prompt, schema, tool, all_text = _request_view(body, kind, ignore_structured=cfg.ignore_structured)
        if schema is not None:
            counters["structured_requests"] += 1
        answer = model_answer(
            prompt, schema, tool=tool, max_tokens=_max_tokens(body), rng=self.rng, config=cfg
        )
        input_tokens = estimate_tokens(all_text)
        output_tokens = estimate_tokens(answer.text if answer.value is None else _compact(answer.value))
        now_s = time.monotonic()
        headers, wait_s = self._rate_headers(kind, now_s, input_tokens + output_tokens)
        if wait_s is not None:
            what = self.limited_by
            return self._error(
                kind,
                429,
                "rate_limit_error" if kind == "anthropic" else "requests",
                f"Rate limit reached for {what} per {cfg.rate_window_s:g}s. Please try again in "
                f"{wait_s:.3f}s.",
                code="rate_limit_exceeded",
                headers=headers,
            )

        fault = self.rng.random()
        delay_s = (
            max(0.0, self.rng.uniform(cfg.latency_ms - cfg.jitter_ms, cfg.latency_ms + cfg.jitter_ms)) / 1000
        )
        async with self._sem if self._sem is not None else contextlib.nullcontext():
            stats = self.stats_
            stats.inflight += 1
            stats.max_inflight = max(stats.max_inflight, stats.inflight)
            try:
                await self._sleep(delay_s + cfg.load_ms * (stats.inflight - 1) / 1000)
                edge = cfg.drop_rate
                if fault < edge:
                    counters["drops"] += 1
                    self._drop(request)
                    return Response(status_code=500)  # never sent: the connection is gone
                edge += cfg.hang_rate
                if fault < edge:
                    counters["hangs"] += 1
                    await self._sleep(cfg.hang_s)
                edge2 = edge + cfg.error_rate
                if edge <= fault < edge2:
                    etype = "server_error" if kind == "openai" else "api_error"
                    return self._error(
                        kind, 500, etype, "The server had an error while processing your request."
                    )
                if edge2 <= fault < edge2 + cfg.overload_rate:
                    if kind == "openai":
                        return self._error(kind, 503, "server_error", "The engine is currently overloaded.")
                    return self._error(kind, 529, "overloaded_error", "Overloaded")
            finally:
                stats.inflight -= 1

        counters["items_answered"] += answer.items - (1 if answer.fault == "missing" else 0)
        if answer.batched:
            counters["batched_requests"] += 1
        if answer.fault:
            counters[answer.fault] += 1
        model = str(body.get("model") or "sim")
        read, written = self._cached(kind, body, all_text)
        if kind == "openai":
            payload = openai_completion_body(
                answer, model, input_tokens, output_tokens, self._id("chatcmpl-"), read
            )
            headers["x-request-id"] = self._id("req_")
        else:
            payload = anthropic_message_body(
                answer, model, input_tokens, output_tokens, self._id("msg_"), read, written
            )
            headers["request-id"] = self._id("req_")
        return JSONResponse(payload, headers=headers)

    def _cached(self, kind: str, body: Mapping[str, Any], all_text: str) -> tuple[int, int]:
        """(tokens read from, written to) the prompt cache by one answered request; counted."""
        read, written = self.prompt_cache.usage(kind, body, all_text, time.monotonic())
        self.stats_.counters["cached_tokens"] += read
        self.stats_.counters["cache_write_tokens"] += written
        return min(read, estimate_tokens(all_text)), min(written, estimate_tokens(all_text))

    @_endpoint("openai", body=True, chat=True)
    async def openai_chat(self, request: Request, call: _Call) -> Response:
        """POST /v1/chat/completions."""
        return await self._chat(request, call)

    @_endpoint("anthropic", body=True, chat=True)
    async def anthropic_messages(self, request: Request, call: _Call) -> Response:
        """POST /v1/messages."""
        return await self._chat(request, call)

    # -------- batches of either provider

    def _register(self, batch: _Batch) -> _Batch:
        self.batches[batch.id] = batch
        self.stats_.counters["batches_created"] += 1
        return batch

    def _cancel(self, batch: _Batch, status: str) -> bool:
        """End a batch that has not ended yet with `status`; False when it had already ended."""
        if batch.ended_s is not None:
            return False
        batch.cancelled_s = time.time()
        batch.ended_s = time.monotonic()
        batch.status = status
        return True

    # -------- OpenAI files and batches

    @_endpoint("openai")
    async def openai_upload(self, request: Request, call: _Call) -> Response:
        """POST /v1/files (multipart, purpose=batch)."""
        form = _parse_multipart(await request.body(), request.headers.get("content-type", ""))
        if "file" not in form or form.get("purpose", (None, b""))[1] != b"batch":
            return self._error("openai", 400, "invalid_request_error", "expected file and purpose=batch")
        filename, content = form["file"]
        file_id = self._id("file-")
        self.files[file_id] = (filename or "upload.jsonl", content)
        return JSONResponse(_file_object(file_id, filename or "upload.jsonl", len(content), "batch"))

    @_endpoint("openai")
    async def openai_file_content(self, request: Request, call: _Call) -> Response:
        """GET /v1/files/{file_id}/content."""
        file_id = request.path_params["file_id"]
        if file_id not in self.files:
            return self._error("openai", 404, "invalid_request_error", f"No such File object: {file_id}")
        return Response(self.files[file_id][1], media_type="application/octet-stream")

    @_endpoint("openai", body=True)
    async def openai_create_batch(self, request: Request, call: _Call) -> Response:
        """POST /v1/batches. Each line's `body` is checked when the batch runs: a refused one
        ends in the error file as a 400, the others are answered."""
        body = call.body
        file_id = body.get("input_file_id")
        if file_id not in self.files:
            return self._error("openai", 400, "invalid_request_error", f"input_file_id {file_id} not found")
        if body.get("endpoint") != "/v1/chat/completions":
            return self._error(
                "openai", 400, "invalid_request_error", "endpoint must be /v1/chat/completions"
            )
        if body.get("completion_window") != "24h":
            return self._error("openai", 400, "invalid_request_error", "completion_window must be 24h")
        lines = []
        seen: set[str] = set()
        for raw in self.files[file_id][1].splitlines():
            if not raw.strip():
                continue
            line = orjson.loads(raw)
            cid = line.get("custom_id")
            if not cid or cid in seen or line.get("url") != "/v1/chat/completions":
                return self._error(
                    "openai", 400, "invalid_request_error", f"bad or duplicate custom_id {cid!r}"
                )
            seen.add(cid)
            lines.append(line)
        batch = self._register(
            _Batch(self._id("batch_"), "openai", time.monotonic(), lines, input_file_id=file_id)
        )
        return JSONResponse(self._openai_batch(batch))

    async def models(self, request: Request) -> Response:
        """GET /v1/models: the listing both APIs serve (and the service's start-time check asks).

        The key is checked the way the caller's headers say it speaks: `x-api-key` (Anthropic,
        whose listing also needs `anthropic-version`) or a bearer token (OpenAI).
        """
        kind = "anthropic" if "x-api-key" in request.headers else "openai"
        self._count(request)
        if not self._authorized(request, kind):
            return self._unauthorized(kind)
        model = {"id": "sim-model", "created": 0}
        if kind == "anthropic":
            entry = {"id": "sim-model", "type": "model", "display_name": "Simulator",
                     "created_at": "2026-01-01T00:00:00Z"}
            return JSONResponse({"data": [entry], "has_more": False, "first_id": "sim-model",
                                 "last_id": "sim-model"})
        listed = {**model, "object": "model", "owned_by": "simulator"}
        return JSONResponse({"object": "list", "data": [listed]})

    @_endpoint("openai", batch=True)
    async def openai_get_batch(self, request: Request, call: _Call) -> Response:
        """GET /v1/batches/{batch_id}."""
        return JSONResponse(self._openai_batch(call.batch))

    @_endpoint("openai", batch=True)
    async def openai_cancel_batch(self, request: Request, call: _Call) -> Response:
        """POST /v1/batches/{batch_id}/cancel."""
        self._cancel(call.batch, "cancelled")
        return JSONResponse(self._openai_batch(call.batch))

    def _openai_batch(self, batch: _Batch) -> dict[str, Any]:
        created = int(time.time() - (time.monotonic() - batch.created_s))
        done = batch.ended_s is not None
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": None,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": created,
            "in_progress_at": created,
            "expires_at": created + 86400,
            "completed_at": int(time.time()) if batch.status == "completed" else None,
            "expired_at": int(time.time()) if batch.status == "expired" else None,
            "cancelled_at": int(batch.cancelled_s) if batch.cancelled_s else None,
            "request_counts": {
                "total": len(batch.lines),
                "completed": batch.counts["succeeded"] if done else 0,
                "failed": (batch.counts["errored"] + batch.counts["expired"]) if done else 0,
            },
            "metadata": None,
        }

    # -------- Anthropic message batches

    @_endpoint("anthropic", body=True)
    async def anthropic_create_batch(self, request: Request, call: _Call) -> Response:
        """POST /v1/messages/batches. Each request's `params` is checked when the batch runs:
        a refused one ends `errored` with the 400's error, the others are answered."""
        items = call.body.get("requests")
        if not isinstance(items, list) or not items:
            return self._error(
                "anthropic", 400, "invalid_request_error", "requests: must be a non-empty list"
            )
        seen: set[str] = set()
        for item in items:
            cid = item.get("custom_id") if isinstance(item, dict) else None
            if not cid or cid in seen or not isinstance(item.get("params"), dict):
                return self._error(
                    "anthropic", 400, "invalid_request_error", f"bad or duplicate custom_id {cid!r}"
                )
            seen.add(cid)
        batch = self._register(_Batch(self._id("msgbatch_"), "anthropic", time.monotonic(), items))
        return JSONResponse(self._anthropic_batch(batch, request))

    @_endpoint("anthropic", batch=True)
    async def anthropic_get_batch(self, request: Request, call: _Call) -> Response:
        """GET /v1/messages/batches/{batch_id}."""
        return JSONResponse(self._anthropic_batch(call.batch, request))

    @_endpoint("anthropic", batch=True)
    async def anthropic_cancel_batch(self, request: Request, call: _Call) -> Response:
        """POST /v1/messages/batches/{batch_id}/cancel."""
        batch = call.batch
        if self._cancel(batch, "ended"):
            batch.results = [
                {"custom_id": i["custom_id"], "result": {"type": "canceled"}} for i in batch.lines
            ]
            batch.counts = Counter(canceled=len(batch.lines))
        return JSONResponse(self._anthropic_batch(batch, request))

    @_endpoint("anthropic", batch=True)
    async def anthropic_results(self, request: Request, call: _Call) -> Response:
        """GET /v1/messages/batches/{batch_id}/results (JSONL)."""
        batch = call.batch
        if batch.ended_s is None:
            return self._error("anthropic", 400, "invalid_request_error", "batch has not ended")
        content = b"".join(orjson.dumps(line) + b"\n" for line in batch.results)
        return Response(content, media_type="application/binary")

    def _anthropic_batch(self, batch: _Batch, request: Request) -> dict[str, Any]:
        created = time.time() - (time.monotonic() - batch.created_s)
        ended = batch.ended_s is not None
        base = str(request.base_url).rstrip("/")
        processing = 0 if ended else len(batch.lines)
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": {
                "processing": processing,
                "succeeded": batch.counts["succeeded"],
                "errored": batch.counts["errored"],
                "canceled": batch.counts["canceled"],
                "expired": batch.counts["expired"],
            },
            "ended_at": _now_iso() if ended else None,
            "created_at": _now_iso(created),
            "expires_at": _now_iso(created + 86400),
            "archived_at": None,
            "cancel_initiated_at": _now_iso(batch.cancelled_s) if batch.cancelled_s else None,
            "results_url": f"{base}/v1/messages/batches/{batch.id}/results" if ended else None,
        }

    # -------- offline batch execution (lazy: on the first look after batch_delay_s)

    def _item_errored(self, batch: _Batch, cid: str, refusal: Refusal, errors: list[bytes]) -> None:
        """Record one batch request as refused, the way each provider reports it: OpenAI, a line
        of the error file carrying the 400 response; Anthropic, an `errored` result."""
        batch.counts["errored"] += 1
        if batch.kind == "openai":
            error = {
                "message": refusal.message,
                "type": "invalid_request_error",
                "param": refusal.param,
                "code": refusal.code,
            }
            record_id = self._id("batch_req_")  # ids before the request id: seeded runs keep their ids
            response = {"status_code": 400, "request_id": self._id("req_"), "body": {"error": error}}
            errors.append(
                orjson.dumps({"id": record_id, "custom_id": cid, "response": response, "error": None})
            )
            return
        error_body = {"type": "error", "error": {"type": "invalid_request_error", "message": refusal.message}}
        batch.results.append({"custom_id": cid, "result": {"type": "errored", "error": error_body}})

    def _advance(self, batch: _Batch) -> None:
        cfg = self.config
        if batch.ended_s is not None or time.monotonic() - batch.created_s < cfg.batch_delay_s:
            return
        outputs: list[bytes] = []
        errors: list[bytes] = []
        for line in batch.lines:
            cid = line["custom_id"]
            kind = batch.kind
            body = line.get("body") if kind == "openai" else line.get("params")
            self.stats_.counters["batch_items"] += 1
            # each request is checked as the online API checks it, before it can run or expire
            refusal = request_refusal(body, kind, in_batch=True)
            if refusal is not None:
                self._item_errored(batch, cid, refusal, errors)
                continue
            roll = self.rng.random()
            if roll < cfg.batch_expire_rate:
                batch.counts["expired"] += 1
                if batch.kind == "openai":
                    errors.append(
                        orjson.dumps(
                            {
                                "id": self._id("batch_req_"),
                                "custom_id": cid,
                                "response": None,
                                "error": {
                                    "code": "batch_expired",
                                    "message": "This request could not be executed "
                                    "before the completion window expired.",
                                },
                            }
                        )
                    )
                else:
                    batch.results.append({"custom_id": cid, "result": {"type": "expired"}})
                continue
            if roll < cfg.batch_expire_rate + cfg.batch_error_rate:
                self._item_errored(
                    batch, cid, Refusal("simulated item error: the request was rejected"), errors
                )
                continue
            assert isinstance(body, dict)  # request_refusal refuses anything else
            batch.counts["succeeded"] += 1
            prompt, schema, tool, all_text = _request_view(
                body, kind, ignore_structured=cfg.ignore_structured
            )
            answer = model_answer(prompt, schema, tool=tool, max_tokens=_max_tokens(body))
            self.stats_.counters["items_answered"] += answer.items
            tin = estimate_tokens(all_text)
            tout = estimate_tokens(answer.text)
            model = str(body.get("model") or "sim")
            read, written = self._cached(kind, body, all_text)
            if kind == "openai":
                outputs.append(
                    orjson.dumps(
                        {
                            "id": self._id("batch_req_"),
                            "custom_id": cid,
                            "response": {
                                "status_code": 200,
                                "request_id": self._id("req_"),
                                "body": openai_completion_body(
                                    answer, model, tin, tout, self._id("chatcmpl-"), read
                                ),
                            },
                            "error": None,
                        }
                    )
                )
            else:
                batch.results.append(
                    {
                        "custom_id": cid,
                        "result": {
                            "type": "succeeded",
                            "message": anthropic_message_body(
                                answer, model, tin, tout, self._id("msg_"), read, written
                            ),
                        },
                    }
                )
        batch.ended_s = time.monotonic()
        if batch.kind == "openai":
            if outputs:
                batch.output_file_id = self._id("file-")
                self.files[batch.output_file_id] = ("output.jsonl", b"\n".join(outputs) + b"\n")
            if errors:
                batch.error_file_id = self._id("file-")
                self.files[batch.error_file_id] = ("errors.jsonl", b"\n".join(errors) + b"\n")
            batch.status = "expired" if batch.counts["expired"] else "completed"
        else:
            batch.status = "ended"


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The output-token limit of a request that passed `request_refusal`: `max_tokens`, else
    OpenAI's `max_completion_tokens`; None when neither is set."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if _is_int(value):
            return value
    return None


def _request_view(
    body: Mapping[str, Any], kind: str, *, ignore_structured: bool
) -> tuple[str, Mapping[str, Any] | None, bool, str]:
    """(last user message text, schema or None, answer-as-tool, all message text) of a request body."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    texts = [_message_text(m.get("content")) for m in messages]
    prompt = next(
        (_message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    all_text = "".join(texts) + (_message_text(body.get("system")) if kind == "anthropic" else "")
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
        args = _compact(answer.value)
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


def _file_object(file_id: str, filename: str, size: int, purpose: str) -> dict[str, Any]:
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


# ----------------------------------------------------------------------------------------------
# running it


def _uvicorn_config(sim: SimulatorApp, host: str, port: int) -> uvicorn.Config:
    """How the simulator is served, embedded or from the CLI: quiet, no lifespan, a short
    graceful shutdown."""
    return uvicorn.Config(
        sim.app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1,
        access_log=False,
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its SIGINT/SIGTERM capture: embedded in a test or a benchmark, the host
    process keeps its own signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave signal handling to the host process."""
        yield


class SimulatorServer:
    """The simulator on 127.0.0.1 inside the running event loop.

    `base_url = await server.start()` (port 0 picks a free port), `await server.stop()`.
    The OpenAI base URL is `base_url + "/v1"`; the Anthropic one is `base_url`.
    """

    def __init__(
        self, config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self.port = port
        self.sim = SimulatorApp(self.config)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.base_url: str | None = None

    async def start(self) -> str:
        """Serve in the background; returns the base URL once listening."""
        server = _EmbeddedServer(_uvicorn_config(self.sim, self.host, self.port))
        self._server = server
        self.sim.server = server
        self.sim._stop = asyncio.Event()  # bound to this loop
        self._task = asyncio.create_task(server.serve())
        for _ in range(500):  # bounded: at most ~5 s
            if server.started:
                break
            if self._task.done():
                self._task.result()
                raise RuntimeError("simulator exited before it started")
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("simulator did not start in time")
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    async def stop(self) -> None:
        """Stop serving: wake hanging requests, close connections, wait a bounded time."""
        if self._server is None or self._task is None:
            return
        self.sim._stop.set()
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except TimeoutError:
            self._server.force_exit = True
            await asyncio.wait_for(self._task, timeout=5)
        self._server = None
        self._task = None

    def configure(self, **changes: Any) -> SimulatorConfig:
        """Change knobs while serving (field names of SimulatorConfig); returns the new config."""
        self.config = replace(self.sim.config, **changes)
        self.sim.configure(self.config)
        return self.config

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


@contextlib.contextmanager
def run_simulator(config: SimulatorConfig | None = None, *, port: int = 0) -> Iterator[str]:
    """`with run_simulator(cfg) as base_url:` — the simulator in a background thread (its own loop)."""
    ready = threading.Event()
    stop = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        server = SimulatorServer(config, port=port)
        try:
            box["url"] = await server.start()
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            return
        ready.set()
        # the caller's thread signals a threading.Event; poll it without blocking this loop
        await asyncio.to_thread(stop.wait)
        await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="promptbus-simulator", daemon=True)
    thread.start()
    if not ready.wait(timeout=30):
        raise RuntimeError("simulator did not start in time")
    if "error" in box:
        raise RuntimeError(f"simulator failed to start: {box['error']}")
    try:
        yield box["url"]
    finally:
        stop.set()
        thread.join(timeout=15)


# ----------------------------------------------------------------------------------------------
# CLI: `promptbus simulate`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `promptbus simulate`: --host, --port, --faults and one flag per knob."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = "\n".join(f"  {', '.join(k.names):<38} {k.help}" for k in KNOBS)
    parser.description = (
        "Run the fake provider server (OpenAI + Anthropic wire formats).\n"
        "OpenAI base URL: http://HOST:PORT/v1   Anthropic base URL: http://HOST:PORT\n"
        "Counters: GET /_sim/stats; reset: POST /_sim/reset;\n"
        "change knobs while running: POST /_sim/config with a JSON object {name: value}.\n\n"
        "--faults takes comma-separated name=value pairs, e.g.\n"
        "  --faults 5xx=0.05,429_rpm=600,malformed=0.1\n"
        "Rates are probabilities in [0, 1]. Names (aliases) and meaning:\n" + names + "\n\n"
        "Each knob also has its own flag (below); a flag wins over --faults.\n"
        "The deterministic model: an ordinary prompt is answered 'sim:' + sha256(input)[:12], the input\n"
        "being the text after the last line ending with ':'; a batched prompt's JSON-array line is\n"
        "answered with one JSON object {alias: answer}. See consumer/testing/simulator.py."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    parser.add_argument("--faults", default="", metavar="NAME=VALUE,...", help="fault knobs, see above")
    for knob in KNOBS:
        flag = "--" + knob.field.replace("_", "-")
        kind = str(_FIELD_TYPES[knob.field])
        if kind == "bool":
            parser.add_argument(
                flag, dest=f"sim_{knob.field}", action="store_const", const=True, default=None, help=knob.help
            )
        else:
            conv: Any = int if kind == "int" else float if kind == "float" else str
            metavar = "N" if kind == "int" else "X" if kind == "float" else "VALUE"
            parser.add_argument(
                flag, dest=f"sim_{knob.field}", type=conv, default=None, metavar=metavar, help=knob.help
            )


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """--faults first, then the individual flags over it."""
    config = parse_faults(args.faults or "")
    changes = {
        k.field: getattr(args, f"sim_{k.field}")
        for k in KNOBS
        if getattr(args, f"sim_{k.field}", None) is not None
    }
    return replace(config, **changes)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the simulator in the foreground until Ctrl-C / SIGTERM."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"promptbus simulate: {exc}", flush=True)
        return 2
    sim = SimulatorApp(config)
    server = uvicorn.Server(_uvicorn_config(sim, args.host, args.port))
    sim.server = server
    print(f"promptbus simulator on http://{args.host}:{args.port} (OpenAI base .../v1) {config}", flush=True)
    server.run()
    return 0
