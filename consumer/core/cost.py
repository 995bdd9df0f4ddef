"""What a request costs: tokens priced by a tier's `pricing` (pure accounting, no I/O).

Billing rules, as OpenAI and Anthropic bill them:

    uncached input  = input_tokens - cached_input_tokens - cache_write_tokens, at input_per_mtok
    cached input    = cached_input_tokens at cached_input_per_mtok (input price when unset)
    cache writes    = cache_write_tokens at cache_write_per_mtok (input price when unset)
    output          = output_tokens at output_per_mtok
    offline (Batch API) requests: the whole sum times (1 - batch_discount)

Prices are US dollars per million tokens. `Usage.input_tokens` counts every prompt token,
cached and written ones included (see `consumer.core.completion.Usage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from consumer.core.completion import CHARS_PER_TOKEN, Usage
from consumer.core.packing import DEFAULT_PER_ITEM_OVERHEAD_TOKENS

__all__ = ["BatchSaving", "Pricing", "alone_input_estimate", "alone_output_estimate", "cost_usd"]

PER_MTOK = 1_000_000


@dataclass(frozen=True, slots=True)
class Pricing:
    """A tier's prices in USD per million tokens; None: the input price applies."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None
    #: the Batch API's discount on everything an offline request uses (0.5: half price)
    batch_discount: float = 0.0


def cost_usd(usage: Usage, pricing: Pricing, *, offline: bool = False) -> float:
    """What `usage` costs at `pricing`; offline requests at the batch price."""
    cached = max(usage.cached_input_tokens, 0)
    written = max(usage.cache_write_tokens, 0)
    uncached = max(usage.input_tokens - cached - written, 0)
    cached_price = (
        pricing.input_per_mtok if pricing.cached_input_per_mtok is None else pricing.cached_input_per_mtok
    )
    write_price = (
        pricing.input_per_mtok if pricing.cache_write_per_mtok is None else pricing.cache_write_per_mtok
    )
    total = (
        uncached * pricing.input_per_mtok
        + cached * cached_price
        + written * write_price
        + max(usage.output_tokens, 0) * pricing.output_per_mtok
    ) / PER_MTOK
    if offline:
        total *= 1.0 - pricing.batch_discount
    return total


def alone_input_estimate(
    batched_input_tokens: int, batched_prompt_chars: int, alone_prompt_chars: int
) -> int:
    """The input tokens the members of a batched request would have used asked alone, estimated.

    Character counts of the ordinary prompts are turned into tokens at the rate the batched
    request's own prompt showed (its provider-counted input tokens per character), so the
    estimate is in the provider's tokens, not the 4-characters rule's; without a measured
    rate (no tokens or no characters), at `CHARS_PER_TOKEN`.
    """
    if batched_input_tokens > 0 and batched_prompt_chars > 0:
        return round(alone_prompt_chars * batched_input_tokens / batched_prompt_chars)
    return alone_prompt_chars // CHARS_PER_TOKEN


def alone_output_estimate(batched_output_tokens: int, size: int) -> int:
    """The output tokens `size` jobs would have used asked alone, estimated from a batched
    answer: its tokens less the JSON around each answer (at least one token per job)."""
    return max(batched_output_tokens - DEFAULT_PER_ITEM_OVERHEAD_TOKENS * size, size)


@dataclass(frozen=True, slots=True)
class BatchSaving:
    """Tokens batched jobs cost against the same jobs asked alone.

    measured: from `verify_fraction` (a batched job asked alone as well: both usages known);
    batched / alone: tokens (input + output), summed over the jobs compared or estimated.
    """

    batched: int
    alone: int
    measured: bool

    @property
    def saved_fraction(self) -> float | None:
        """1 - batched / alone; None with nothing to compare."""
        return 1.0 - self.batched / self.alone if self.alone > 0 else None

    @classmethod
    def from_counts(
        cls,
        *,
        verify_batched_tokens: int,
        verify_alone_tokens: int,
        batched_tokens: int,
        alone_tokens_estimate: int,
    ) -> BatchSaving:
        """The measured saving when any verification answered, else the estimate."""
        if verify_alone_tokens > 0:
            return cls(verify_batched_tokens, verify_alone_tokens, measured=True)
        return cls(batched_tokens, alone_tokens_estimate, measured=False)
