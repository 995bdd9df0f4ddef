"""The one error taxonomy of promptbus.

Every failure is translated into one of these classes at the boundary where it
happens (provider adapters, job decoding, config loading). Retry-or-dead-letter
decisions (`consumer.core.retry`) are made only from these classes, never from
aiohttp, aiokafka or HTTP status codes directly.

    PromptbusError
    ├── ConfigError                 bad tier file / settings: stops startup, names the key
    │   ├── UsageError              a command's arguments do not make a run
    │   └── JobInputError           a job given to a command (a job file's line, --tier and
    │                               --prompt) would be dead-lettered: refused before it is sent
    ├── JobError                    one job cannot be served as given (kind: invalid_job,
    │                               unknown_tier, template_error); goes to the dead-letter topic
    ├── NotSupportedError           a feature the provider does not have (e.g. Batch API on
    │                               openai_compat): raised before any request is sent
    ├── MembershipLost              the consumer group refused a commit: it has rebalanced
    │                               without this member (expelled), its partitions may be another's
    └── ProviderError               a provider call failed; `retryable` says if trying again can help
        ├── RateLimited             429 rate limit (retryable, carries a RateLimitHint)
        ├── QuotaExhausted          429 billing / spend limit (pauses the tier)
        ├── Overloaded              529, 503 (retryable; the limiter backs off)
        ├── ServerError             other 5xx (retryable)
        ├── RequestTimeout          408 or a client-side timeout (retryable; the limiter backs off)
        ├── ConnectionFailed        connect/read errors, dropped connections (retryable)
        ├── AuthFailed              401, 403
        ├── Rejected                other permanent 4xx (400, 404, 413, 422, ...)
        └── MalformedResponse       a 2xx whose body is not the provider's format (retryable)

Messages never contain secrets: adapters build them from status codes and the
provider's error type/message, never from request headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorKind(StrEnum):
    """Dead-letter `error.kind`: a closed list (DESIGN.md "Messages")."""

    INVALID_JOB = "invalid_job"
    UNKNOWN_TIER = "unknown_tier"
    TEMPLATE_ERROR = "template_error"
    PROVIDER_REJECTED = "provider_rejected"
    AUTH_FAILED = "auth_failed"
    QUOTA_EXHAUSTED = "quota_exhausted"
    RETRIES_EXHAUSTED = "retries_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BATCH_EXPIRED = "batch_expired"
    BATCH_FAILED = "batch_failed"
    OUTPUT_INVALID = "output_invalid"
    #: the job's tenant spent its daily budget and its policy is `on_exhausted: dead_letter`
    #: (not retryable today; `promptbus replay --kind budget_exhausted` sends it again later)
    BUDGET_EXHAUSTED = "budget_exhausted"
    #: a source's record could not be decoded: a wrong magic byte, a schema id the registry does
    #: not know, bytes its schema cannot read, JSON that is not JSON (there is no job to replay:
    #: the producer's data or schema is what needs fixing)
    UNDECODABLE = "undecodable"
    #: the job claims a tenant its topic does not belong to: a bound topic's job naming another
    #: tenant, or a job naming a bound tenant from a topic not bound to it (docs/tenants.md)
    TENANT_MISMATCH = "tenant_mismatch"


@dataclass(frozen=True, slots=True)
class RateLimitHint:
    """What a provider told us about its limits, normalized from its headers.

    retry_after_s: from Retry-After (seconds or HTTP-date) or retry-after-ms.
    remaining_requests / remaining_tokens: from x-ratelimit-remaining-* or
        anthropic-ratelimit-*-remaining.
    reset_requests_s / reset_tokens_s: seconds until those budgets are full again.
    limit_requests / limit_tokens: the budgets' size, from x-ratelimit-limit-* or
        anthropic-ratelimit-*-limit.
    """

    retry_after_s: float | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None
    limit_requests: int | None = None
    limit_tokens: int | None = None


class PromptbusError(Exception):
    """Base of every error promptbus raises on purpose."""


class ConfigError(PromptbusError):
    """A configuration value is wrong. `key` is the dotted path of the bad key; `more`: the
    same input's other problems, each said on a line of its own (`lines`). `what` names the
    kind of input, as the command line says it ("config error: ...")."""

    what = "config"

    def __init__(self, key: str, reason: str, *, more: tuple[ConfigError, ...] = ()) -> None:
        self.key = key
        self.reason = reason
        self.more = more
        super().__init__(f"{key}: {reason}")

    def lines(self) -> list[str]:
        """One line per problem, this one first."""
        return [str(self), *(str(other) for other in self.more)]


class UsageError(ConfigError):
    """A command's arguments do not make a run (a flag missing, two that exclude each other)."""

    what = "usage"


class JobInputError(ConfigError):
    """A job a command was given is not one the service would serve (nothing is sent)."""

    what = "job input"


class JobError(PromptbusError):
    """A job cannot be served as given; it goes to the dead-letter topic with `kind`."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class RegistryUnavailable(PromptbusError):
    """The Schema Registry did not answer (down, a timeout, a 5xx): the records that need it
    wait, as a provider outage holds jobs; nothing is dead-lettered for it."""


class MembershipLost(PromptbusError):
    """The consumer group refused an offset commit because it has moved on without this
    member (its session lapsed and it was expelled, or a newer generation formed): the
    partitions may be another member's already, and committing them again cannot succeed
    until the member has rejoined."""


class NotSupportedError(PromptbusError):
    """The provider has no such feature; raised before any request is sent."""


class ProviderError(PromptbusError):
    """A provider call failed.

    status_code: the HTTP status, when there was a response.
    provider: the adapter name (openai, anthropic, openai_compat).
    hint: rate-limit information from the response headers, when any.
    deployment: the index of the tier's deployment that answered it (set by the call path).
    """

    retryable: bool = False
    #: True when the failure says the provider is overloaded: the limiter shrinks.
    overload: bool = False
    deployment: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        provider: str | None = None,
        hint: RateLimitHint | None = None,
    ) -> None:
        self.message = message
        self.status_code = status_code
        self.provider = provider
        self.hint = hint or RateLimitHint()
        super().__init__(message)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status_code={self.status_code}, "
            f"provider={self.provider!r})"
        )


class RateLimited(ProviderError):
    retryable = True
    overload = True


class QuotaExhausted(ProviderError):
    retryable = False


class Overloaded(ProviderError):
    retryable = True
    overload = True


class ServerError(ProviderError):
    retryable = True


class RequestTimeout(ProviderError):
    retryable = True
    overload = True


class ConnectionFailed(ProviderError):
    retryable = True


class AuthFailed(ProviderError):
    retryable = False


class Rejected(ProviderError):
    retryable = False


class MalformedResponse(ProviderError):
    retryable = True
