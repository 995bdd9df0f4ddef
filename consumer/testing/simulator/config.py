"""The simulator's knobs: `SimulatorConfig`, their `--faults` names (`KNOBS`) and `parse_faults`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


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
    batch_max_enqueued_tokens: int = 0


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
    Knob(
        "batch_max_enqueued_tokens",
        ("batch_enqueued_tokens", "batch_max_enqueued_tokens"),
        "OpenAI's enqueued token limit: a batch whose input tokens with those of unfinished batches "
        "exceed it fails (token_limit_exceeded) (0 = no limit)",
    ),
)
_KNOB_BY_NAME = {name: k.field for k in KNOBS for name in k.names}
FIELD_TYPES = {f.name: f.type for f in fields(SimulatorConfig)}


def _convert(field_name: str, raw: str) -> Any:
    kind = str(FIELD_TYPES[field_name])
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
