"""The tier file's `quotas` section: one entry per API key and model, the figures its
organisation may spend per minute, shared by every instance of the group (docs/operations.md
"Fleet quotas")."""

from __future__ import annotations

from pydantic import Field, model_validator

from consumer.core.quota import QuotaFigures
from consumer.settings.base import StrictModel

_PER_MINUTE = "per minute, over every instance of the group"


class QuotaConfig(StrictModel):
    """`quotas.NAME`: at least one figure; tiers name it with `quota: NAME`."""

    requests_per_minute: int | None = Field(None, gt=0, description=f"requests {_PER_MINUTE}")
    tokens_per_minute: int | None = Field(
        None, gt=0, description=f"input and output tokens together {_PER_MINUTE} (OpenAI's TPM)"
    )
    input_tokens_per_minute: int | None = Field(
        None, gt=0, description=f"input tokens {_PER_MINUTE} (Anthropic's ITPM)"
    )
    output_tokens_per_minute: int | None = Field(
        None,
        gt=0,
        description=f"output tokens {_PER_MINUTE} (Anthropic's OTPM; a request reserves its max_tokens)",
    )

    @model_validator(mode="after")
    def _check_some_figure(self) -> QuotaConfig:
        if not any(
            value is not None
            for value in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.input_tokens_per_minute,
                self.output_tokens_per_minute,
            )
        ):
            raise ValueError(
                "a quota needs at least one of requests_per_minute, tokens_per_minute, "
                "input_tokens_per_minute, output_tokens_per_minute"
            )
        return self

    def figures(self) -> QuotaFigures:
        """The core's value object of this quota."""
        return QuotaFigures(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            input_tokens_per_minute=self.input_tokens_per_minute,
            output_tokens_per_minute=self.output_tokens_per_minute,
        )
