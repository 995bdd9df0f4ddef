"""The one status/exception -> error-class mapping."""

from __future__ import annotations

import pytest

from consumer.core.errors import (
    AuthFailed,
    ConnectionFailed,
    Overloaded,
    ProviderError,
    QuotaExhausted,
    RateLimited,
    Rejected,
    RequestTimeout,
    ServerError,
)
from consumer.providers.errormap import error_details, error_for_exception, error_for_status, redact

OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
}
OPENAI_RATE = {
    "error": {
        "message": "Rate limit reached for requests. Visit https://x/account/billing",
        "type": "requests",
        "code": "rate_limit_exceeded",
    }
}
ANTHROPIC_SPEND = {
    "type": "error",
    "error": {
        "type": "rate_limit_error",
        "message": "You have reached your specified workspace API usage limits.",
    },
}
ANTHROPIC_CREDIT = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "Your credit balance is too low to access the Anthropic API.",
    },
}
ANTHROPIC_RATE = {
    "type": "error",
    "error": {
        "type": "rate_limit_error",
        "message": "Number of requests has exceeded your per-minute rate limit",
    },
}


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (429, OPENAI_QUOTA, QuotaExhausted),
        (429, {"error": {"code": "billing_hard_limit_reached", "message": "x"}}, QuotaExhausted),
        (429, OPENAI_RATE, RateLimited),
        (429, ANTHROPIC_SPEND, QuotaExhausted),
        (429, ANTHROPIC_RATE, RateLimited),
        (400, ANTHROPIC_CREDIT, QuotaExhausted),
        (402, {}, QuotaExhausted),
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, Overloaded),
        (503, "Service Unavailable", Overloaded),
        (500, {"error": {"message": "boom", "type": "server_error"}}, ServerError),
        (502, b"<html>bad gateway</html>", ServerError),
        (408, {}, RequestTimeout),
        (401, {"error": {"message": "bad key", "type": "invalid_request_error"}}, AuthFailed),
        (403, {}, AuthFailed),
        (400, {"error": {"message": "context too long", "type": "invalid_request_error"}}, Rejected),
        (404, {}, Rejected),
        (409, {}, ServerError),
        (413, {}, Rejected),
        (422, {"object": "error", "message": "bad", "type": "BadRequestError", "code": 422}, Rejected),
    ],
)
def test_status_mapping(status: int, body: object, cls: type[ProviderError]) -> None:
    error = error_for_status("p", status, body, {}, now_s=0.0)
    assert type(error) is cls
    assert error.status_code == status
    assert error.provider == "p"


def test_retryable_flags_follow_the_taxonomy() -> None:
    assert error_for_status("p", 429, OPENAI_RATE, None, now_s=0).retryable
    assert not error_for_status("p", 429, OPENAI_QUOTA, None, now_s=0).retryable
    assert error_for_status("p", 529, {}, None, now_s=0).overload


def test_message_has_provider_type_and_text_truncated() -> None:
    body = {
        "error": {"message": "x" * 5000, "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    error = error_for_status("openai", 400, body, None, now_s=0)
    assert error.message.startswith("openai HTTP 400 invalid_request_error/context_length_exceeded: x")
    assert len(error.message) < 400


def test_hint_comes_from_headers() -> None:
    error = error_for_status("p", 429, OPENAI_RATE, {"retry-after": "3"}, now_s=0)
    assert error.hint.retry_after_s == 3.0


def test_details_of_each_provider_format() -> None:
    assert error_details(OPENAI_QUOTA) == (
        "insufficient_quota",
        "insufficient_quota",
        "You exceeded your current quota",
    )
    assert error_details(ANTHROPIC_RATE)[0] == "rate_limit_error"
    assert error_details({"error": "Model is overloaded", "error_type": "overloaded"}) == (
        "overloaded",
        None,
        "Model is overloaded",
    )
    assert error_details(b"plain text") == (None, None, "plain text")


def test_key_echoes_are_redacted() -> None:
    body = {
        "error": {"message": "Incorrect API key provided: sk-proj-abc1****************wxyz.", "type": "x"}
    }
    error = error_for_status("openai", 401, body, None, now_s=0, secret="sk-proj-abc1secretwxyz")
    assert "abc1" not in error.message and "wxyz" not in error.message
    assert redact("my key is S3CRETVALUE", "S3CRETVALUE") == "my key is [redacted]"


SECRET = "zq7TOPSECRETVALUE91x"


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (TimeoutError(), RequestTimeout),
        (TimeoutError("timed out"), RequestTimeout),
        (TimeoutError("no answer data for 5 s"), RequestTimeout),
        (TimeoutError("no free connection within 5 s (8 in use)"), RequestTimeout),
        (ConnectionRefusedError(111, "Connection refused"), ConnectionFailed),
        (ConnectionError("the server closed the connection before the answer ended"), ConnectionFailed),
        (ConnectionError("the answer is not HTTP (invalid status)"), ConnectionFailed),
        (ConnectionResetError(104, "reset"), ConnectionFailed),
        (OSError(101, "Network is unreachable"), ConnectionFailed),
    ],
)
def test_exception_mapping(exc: BaseException, cls: type[ProviderError]) -> None:
    error = error_for_exception("p", exc)
    assert type(error) is cls
    assert error.retryable
    assert error.provider == "p" and type(exc).__name__ in error.message
    assert error.__cause__ is None and error.__context__ is None


def test_exception_messages_carry_no_key() -> None:
    """The mapped error has only the exception's text, and a key inside that text is redacted."""
    for exc in (
        ConnectionResetError(104, f"reset while sending {SECRET}"),
        TimeoutError(f"waited for {SECRET}"),
    ):
        assert SECRET in repr(vars(exc)) or SECRET in str(exc)  # the raw exception does carry it
        error = error_for_exception("p", exc, secret=SECRET)
        assert SECRET not in error.message and SECRET not in repr(error) and SECRET not in str(error)
