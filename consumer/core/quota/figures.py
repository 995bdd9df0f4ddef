"""A fleet quota's figures (what one API key and model may spend per minute) and what one
request costs of them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["NOTHING_USED", "QuotaCost", "QuotaFigures", "QuotaKind"]


class QuotaKind(StrEnum):
    """One figure of a quota; its tier-file key is `<kind>_per_minute`."""

    REQUESTS = "requests"
    TOKENS = "tokens"  # input and output together (OpenAI's TPM)
    INPUT_TOKENS = "input_tokens"  # Anthropic's ITPM
    OUTPUT_TOKENS = "output_tokens"  # Anthropic's OTPM

    @property
    def key(self) -> str:
        """The tier-file key of this figure (`requests_per_minute`, ...)."""
        return f"{self.value}_per_minute"

    @property
    def counts_tokens(self) -> bool:
        return self is not QuotaKind.REQUESTS


@dataclass(frozen=True, slots=True)
class QuotaFigures:
    """What a quota allows per minute, figure by figure (None: that figure is not limited)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        if not self.per_minute():
            raise ValueError("a quota needs at least one figure")
        for kind, value in self.per_minute().items():
            if value <= 0:
                raise ValueError(f"{kind.key} must be positive, got {value}")

    def per_minute(self) -> dict[QuotaKind, int]:
        """The figures that are set, in `QuotaKind` order."""
        values = (
            (QuotaKind.REQUESTS, self.requests_per_minute),
            (QuotaKind.TOKENS, self.tokens_per_minute),
            (QuotaKind.INPUT_TOKENS, self.input_tokens_per_minute),
            (QuotaKind.OUTPUT_TOKENS, self.output_tokens_per_minute),
        )
        return {kind: value for kind, value in values if value is not None}

    def per_second(self) -> dict[QuotaKind, float]:
        return {kind: value / 60.0 for kind, value in self.per_minute().items()}


@dataclass(frozen=True, slots=True)
class QuotaCost:
    """What one request costs of a quota: before it goes, what it reserves (one request, its
    estimated input tokens and its `max_tokens`, output a provider may pre-charge, as Anthropic
    does); once it ended, what it used (`requests` 0 when the provider never counted it: not
    sent, or refused with a 429; the tokens its answer's usage names)."""

    requests: int
    input_tokens: float
    output_tokens: float

    def amount(self, kind: QuotaKind) -> float:
        """What this cost takes of the figure `kind`."""
        if kind is QuotaKind.REQUESTS:
            return float(self.requests)
        if kind is QuotaKind.TOKENS:
            return self.input_tokens + self.output_tokens
        if kind is QuotaKind.INPUT_TOKENS:
            return self.input_tokens
        return self.output_tokens


#: what a request the provider never counted used (not sent, or refused with a 429)
NOTHING_USED = QuotaCost(0, 0.0, 0.0)
