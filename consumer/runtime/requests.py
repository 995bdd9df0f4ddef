"""What a tier sends for a planned request: a job's own request, or a packed prompt with its
answer schema, each with its shared prefix marked for prompt caching."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from consumer.core.completion import ChatMessage, CompletionRequest, prompt_cache_key
from consumer.core.output import response_format_schema
from consumer.core.packing import answer_schema
from consumer.core.plan import PlannedRequest
from consumer.core.window import PackKey
from consumer.runtime.context import JobContext
from consumer.runtime.tiers import TierRuntime

__all__ = ["build_request", "ordinary_request"]


def ordinary_request(tier: TierRuntime, ctx: JobContext) -> CompletionRequest:
    """A job's own request (unbatched), its shared prefix marked for prompt caching: the
    template's text before its trailing variable, or every message before the last."""
    messages, model = ctx.messages, tier.config.model
    if tier.config.prompt_cache == "off" or not messages:
        return CompletionRequest(messages, model, ctx.options)
    batchable = ctx.batchable
    if batchable is not None and batchable.prefix and messages[-1].content.startswith(batchable.prefix):
        prefix_chars, shared = len(batchable.prefix), batchable.prefix
    elif len(messages) > 1:
        prefix_chars, shared = 0, "\0".join(m.content for m in messages[:-1])
    else:
        return CompletionRequest(messages, model, ctx.options)  # no known shared part: nothing to cache
    key = prompt_cache_key(tier.name, model, "ordinary", shared)
    return CompletionRequest(messages, model, ctx.options, cache_prefix_chars=prefix_chars, cache_key=key)


def build_request(
    tier: TierRuntime, req: PlannedRequest, pack_key: PackKey | None = None
) -> CompletionRequest:
    """The provider request of a planned one: the job's own, or a packed prompt with its
    schema; `pack_key` names the prompt cache of a packed prompt's shared head."""
    first = cast(JobContext, req.members[0])  # a runner's plan members are its jobs' contexts
    if req.packed is None:
        return ordinary_request(tier, first)
    options = dict(first.options)
    if req.max_tokens is not None:
        options["max_tokens"] = req.max_tokens
    # the job's own answer schema (if any) becomes the schema of each alias's value
    item_schema = response_format_schema(options.pop("response_format", None))
    caching = tier.config.prompt_cache == "auto"
    schema = None
    if tier.config.batching.structured != "off":
        if caching and tier.config.provider == "anthropic":
            # tools come before the prompt in Anthropic's cached prefix: a forced tool that
            # named this request's aliases would make every batched prefix different
            schema = _alias_free_answer_schema(item_schema)
        else:
            schema = answer_schema(req.packed.aliases, item_schema)
    messages = (ChatMessage("user", req.packed.text),)
    if not caching:
        return CompletionRequest(messages, tier.config.model, options, schema)
    # the packed prompt is the shared head (template text and batch instruction, the same
    # bytes for every request of one batch key) and then the items, one JSON line
    text = req.packed.text
    head_chars = text.rfind("\n") + 1
    key = prompt_cache_key(tier.name, tier.config.model, "batched", *(pack_key or ()))
    return CompletionRequest(
        messages, tier.config.model, options, schema, cache_prefix_chars=head_chars, cache_key=key
    )


def _alias_free_answer_schema(item_schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """A batched answer's schema that names no alias (an object of answers, each following the
    job's own schema), so it is the same for every request of one batch key; the answer's
    aliases are still checked when it is read (`packing.parse_answer`)."""
    item = dict(item_schema) if item_schema is not None else {"type": "string"}
    return {"type": "object", "additionalProperties": item}
