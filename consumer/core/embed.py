"""Embed jobs: their request, answer, window and split rules (pure).

An embed job (`kind: embed`) asks for the vector of one `input` text. Embed jobs of one tier,
mode and options share a collection window (`core/window.py`, under `embed_pack_key`) and go
out as ONE provider request whose `input` is the array of their texts: providers embed each
element on its own, so sharing a request changes no vector and needs no consent (`batch`).

Rules:

- a window is bounded by the provider's limits per request (`EmbedLimits`): inputs per
  request (the window's `max_items`, at most the tier's `batching.max_items`) and tokens per
  request (its `max_input_chars`, estimated at `CHARS_PER_TOKEN`);
- an input estimated over the model's tokens per input is dead-lettered `provider_rejected`
  alone before anything is sent; its window's other members go out without it;
- a failed array request is split in halves, down to single inputs, like a malformed batched
  chat answer: a permanent error (`Rejected`) or an answer that is not one vector per input
  (`MalformedResponse`) may come from one input, so one bad input fails only itself;
  retryable errors (429, 5xx, timeouts) retry the same request as for chat jobs
  (`core/plan.py`, whose retry, quota and auth rules apply unchanged).

Options: an embed job's own options over the tier's embedding options (`EMBED_TIER_OPTIONS`);
the tier's chat options (temperature, max_tokens, ...) do not apply to embeddings.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from consumer.core.completion import CHARS_PER_TOKEN, ProviderAnswer
from consumer.core.errors import ErrorKind, MalformedResponse, ProviderError
from consumer.core.packing import PackedPrompt
from consumer.core.plan import PlanMember, PlannedRequest, RequestPlan, Step
from consumer.core.retry import RetryPolicy
from consumer.core.tenants import DEFAULT_TENANT
from consumer.core.window import PackKey, WindowLimits, options_key

__all__ = [
    "EMBED_TIER_OPTIONS",
    "EMBED_VARIABLE",
    "PROVIDER_EMBED_LIMITS",
    "EmbedLimits",
    "EmbedPlan",
    "EmbeddingRequest",
    "Embeddings",
    "embed_dedupe_key",
    "embed_limits",
    "embed_options",
    "embed_pack_key",
    "embed_window_limits",
    "input_tokens_estimate",
    "no_embeddings",
    "too_long",
]

#: the tier options that apply to embed jobs (the rest are chat options)
EMBED_TIER_OPTIONS = ("dimensions", "user")
#: the batch key's variable of embed windows: no prompt variable is named so, so an embed
#: window never shares a key with a chat window
EMBED_VARIABLE = "\0embed"

#: one input's embedding, as the provider's answer gave it
Vector = Sequence[float]


@dataclass(frozen=True, slots=True)
class EmbedLimits:
    """A provider's limits on one embeddings request.

    max_inputs: elements of the `input` array; max_request_tokens: their tokens together;
    max_input_tokens: the tokens of one element (the model's input length).
    """

    max_inputs: int
    max_request_tokens: int
    max_input_tokens: int


#: OpenAI's documented limits (2048 inputs, 300,000 tokens per request, 8192 per input);
#: OpenAI-compatible servers refuse what exceeds their own, which the split rule handles
PROVIDER_EMBED_LIMITS: dict[str, EmbedLimits] = {
    "openai": EmbedLimits(2048, 300_000, 8192),
    "openai_compat": EmbedLimits(2048, 300_000, 8192),
}


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """One embeddings call: `inputs` as the request's `input` array, in order."""

    inputs: tuple[str, ...]
    model: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def estimated_tokens(self) -> int:
        """The inputs' tokens, roughly: what a token budget is paced by before the answer."""
        return sum(len(text) for text in self.inputs) // CHARS_PER_TOKEN + 1


@dataclass(frozen=True, slots=True)
class Embeddings(ProviderAnswer):
    """A provider's embeddings answer: `vectors[i]` is the vector of the request's `inputs[i]`
    (usage counts input tokens only)."""

    vectors: tuple[Vector, ...]


def no_embeddings(tier: str, provider: str) -> str:
    """Why the embed jobs of `tier` are refused (check-config says it, admission dead-letters)."""
    return (
        f"tier '{tier}' ({provider}): {provider} has no embeddings endpoint; "
        "embed jobs are dead-lettered invalid_job"
    )


def embed_limits(provider: str) -> EmbedLimits | None:
    """What one embeddings request of `provider` takes; None: it has no embeddings endpoint."""
    return PROVIDER_EMBED_LIMITS.get(provider)


def input_tokens_estimate(text: str) -> int:
    """One input's tokens, roughly (`CHARS_PER_TOKEN` characters each)."""
    return len(text) // CHARS_PER_TOKEN + 1


def too_long(text: str, limits: EmbedLimits) -> str | None:
    """Why `text` cannot be embedded by the model (None: it can)."""
    tokens = input_tokens_estimate(text)
    if tokens <= limits.max_input_tokens:
        return None
    return f"the input is about {tokens} tokens, over the model's {limits.max_input_tokens} per input"


def embed_options(tier_options: Mapping[str, Any] | None, job_options: Mapping[str, Any]) -> dict[str, Any]:
    """An embed job's options: its own over the tier's embedding options."""
    tier = {k: v for k, v in (tier_options or {}).items() if k in EMBED_TIER_OPTIONS}
    return {**tier, **job_options}


def embed_pack_key(tier: str, options: Mapping[str, Any], mode: str, tenant: str = DEFAULT_TENANT) -> PackKey:
    """The window key of an embed job: its tier, options, mode and tenant (an array request
    never carries two tenants' inputs)."""
    return PackKey(tier, "", EMBED_VARIABLE, options_key(options), mode, tenant)


def embed_window_limits(batching: WindowLimits, limits: EmbedLimits) -> WindowLimits:
    """The tier's window timing, bounded by what one provider request takes."""
    return WindowLimits(
        max_items=max(1, min(batching.max_items, limits.max_inputs)),
        max_input_chars=limits.max_request_tokens * CHARS_PER_TOKEN,
        window_ms=batching.window_ms,
        max_wait_ms=batching.max_wait_ms,
    )


def embed_dedupe_key(
    tier: str, model: str, options: Mapping[str, Any], text: str, tenant: str = DEFAULT_TENANT
) -> str:
    """The key under which identical embed jobs of one tenant share one vector: an embedding
    is a function of the model, options and text, so every embed job can be deduped (never
    across tenants: one tenant's job is not answered from another's)."""
    canonical = orjson.dumps(["embed", tier, model, dict(options), text, tenant], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


class EmbedPlan(RequestPlan):
    """The requests for the members of one flushed embed window, until all end.

    `begin` (instead of `start`) fails the inputs too long for the model and plans one array
    request for the rest; `on_vectors` reports an answer; `on_error` and `cancel` are the
    chat plan's, except that a malformed answer to an array request is split in halves.
    `embedding(member)` is an answered member's vector.
    """

    def __init__(
        self, members: Sequence[PlanMember], *, limits: EmbedLimits, retry: RetryPolicy, rng: random.Random
    ) -> None:
        super().__init__(members, prefix="", variable=EMBED_VARIABLE, retry=retry, rng=rng)
        self._limits = limits
        self._vectors: dict[Hashable, Vector] = {}

    def _written(
        self, members: tuple[PlanMember, ...], packed: PackedPrompt | None
    ) -> tuple[PackedPrompt | None, int | None]:
        # an array request: each member's input is an element, nothing is packed
        return None, None

    def begin(self) -> Step:
        """The inputs too long for the model fail alone; the others go as one request."""
        if self._started:
            raise RuntimeError("begin() was already called")
        self._started = True
        step = Step()
        fitting: list[PlanMember] = []
        for m in self.members:
            problem = too_long(m.input, self._limits)
            if problem is None:
                fitting.append(m)
            else:
                self._fail(step, [m], ErrorKind.PROVIDER_REJECTED, problem)
        if fitting:
            step.requests.append(self._request(fitting))
        return step

    def embedding(self, member: PlanMember) -> Vector:
        """The vector an answer gave `member`."""
        return self._vectors[member.ref]

    def on_vectors(self, req: PlannedRequest, vectors: Sequence[Vector]) -> Step:
        """The provider answered `req` with `vectors`, one per input in order."""
        if len(vectors) != len(req.members) or not all(vectors):
            error = MalformedResponse(f"{len(vectors)} vectors for {len(req.members)} inputs", provider=None)
            return self.on_error(req, error)
        self._take(req)
        step = Step()
        for member, vector in zip(req.members, vectors, strict=True):
            if member.ref not in self._ended:
                self._vectors[member.ref] = vector
            self._answer(step, member, "", req)
        return step

    def on_error(self, req: PlannedRequest, error: ProviderError) -> Step:
        """As a chat plan; a malformed answer to an array request splits it in halves."""
        if isinstance(error, MalformedResponse) and len(req.members) > 1:
            self._take(req)
            for m in req.members:
                self._last_error[m.ref] = error
            step = Step()
            step.requests.extend(self._halves(self._live(req.members)))
            return step
        return super().on_error(req, error)
