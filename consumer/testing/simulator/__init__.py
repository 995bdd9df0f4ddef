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
`batch_expire_rate` items expired (an OpenAI batch with any expired item ends "expired"). With
`batch_max_enqueued_tokens` an OpenAI batch whose input tokens, with those of the unfinished
batches, exceed it is created `failed` with the error `token_limit_exceeded`, as OpenAI fails
batches over an organisation's enqueued token limit; none of it runs.

Modules: `config` (the knobs), `model` (the deterministic model), `cache` (prompt caching),
`refusals` (the 400s), `wire` (request views and response bodies), `ratelimit` (token buckets),
`state` (state and the preamble every route shares), `chat` and `batches` (the provider
routes), `offline` (running Batch API jobs), `app` (the Starlette app), `server` (serving it
embedded) and `cli` (`promptbus simulate`).
"""

from __future__ import annotations

from consumer.testing.simulator.app import SimulatorApp
from consumer.testing.simulator.cache import (
    CACHE_TTL_S,
    OPENAI_CACHE_MIN_TOKENS,
    OPENAI_CACHE_PROMPTS,
    OPENAI_CACHE_STEP_TOKENS,
    PromptCache,
)
from consumer.testing.simulator.chat import SHARED_429_RETRY_MS
from consumer.testing.simulator.cli import add_arguments, config_from_args, run_from_args
from consumer.testing.simulator.config import KNOBS, Knob, SimulatorConfig, parse_faults
from consumer.testing.simulator.model import (
    SimAnswer,
    answer_for,
    batched_answer,
    estimate_tokens,
    extract_input,
    model_answer,
    parse_batch_items,
    value_for_schema,
)
from consumer.testing.simulator.ratelimit import TokenBucket
from consumer.testing.simulator.refusals import ANTHROPIC_ROLES, OPENAI_ROLES, Refusal, request_refusal
from consumer.testing.simulator.server import SimulatorServer, SimulatorTls, run_simulator
from consumer.testing.simulator.wire import anthropic_message_body, openai_completion_body

__all__ = [
    "ANTHROPIC_ROLES",
    "CACHE_TTL_S",
    "KNOBS",
    "OPENAI_CACHE_MIN_TOKENS",
    "OPENAI_CACHE_PROMPTS",
    "OPENAI_CACHE_STEP_TOKENS",
    "OPENAI_ROLES",
    "SHARED_429_RETRY_MS",
    "Knob",
    "PromptCache",
    "Refusal",
    "SimAnswer",
    "SimulatorApp",
    "SimulatorConfig",
    "SimulatorServer",
    "SimulatorTls",
    "TokenBucket",
    "add_arguments",
    "answer_for",
    "anthropic_message_body",
    "batched_answer",
    "config_from_args",
    "estimate_tokens",
    "extract_input",
    "model_answer",
    "openai_completion_body",
    "parse_batch_items",
    "parse_faults",
    "request_refusal",
    "run_from_args",
    "run_simulator",
    "value_for_schema",
]
