"""The shared taxonomy and completion value types: small contracts others rely on."""

from __future__ import annotations

import dataclasses

import pytest

from consumer.core.completion import ChatMessage, Completion, CompletionRequest, Usage
from consumer.core.errors import ConfigError, ErrorKind, Overloaded, ProviderError, RateLimitHint, ServerError


def test_provider_error_repr_has_no_hint_internals_and_defaults() -> None:
    err = ServerError("upstream 502", status_code=502, provider="openai")
    assert repr(err) == "ServerError('upstream 502', status_code=502, provider='openai')"
    assert err.hint == RateLimitHint() and err.retryable and not err.overload
    assert Overloaded("529").overload and not ProviderError("x").retryable


def test_config_error_names_the_key() -> None:
    err = ConfigError("tiers.small.model", "Field required")
    assert str(err) == "tiers.small.model: Field required" and err.key == "tiers.small.model"


def test_error_kinds_are_the_design_list() -> None:
    assert {k.value for k in ErrorKind} == {
        "invalid_job", "unknown_tier", "template_error", "provider_rejected", "auth_failed",
        "quota_exhausted", "retries_exhausted", "deadline_exceeded", "batch_expired", "batch_failed",
        "output_invalid", "budget_exhausted", "undecodable", "tenant_mismatch",
    }


def test_completion_types_are_frozen_values() -> None:
    req = CompletionRequest((ChatMessage("user", "hi"),), "m")
    assert req.options == {} and req.answer_schema is None
    done = Completion("hello", "stop", usage=Usage(3, 1), provider="openai", model="m")
    assert done.request_id is None and done.latency_ms == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.text = "x"  # type: ignore[misc]
