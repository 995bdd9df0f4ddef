"""What a run gives back: one `Outcome` per input, `Progress` while it runs, and the two
ways a call ends early (`MapError`, `MapTimeout`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

ProgressCallback = Callable[["Progress"], Any]


class RunOptions(TypedDict, total=False):
    """How a run is submitted and waited for: the keywords every `map*` method takes.

    lane: its jobs go to that lane's topic (the tier file's `lanes`), else to the jobs topic;
    tenant: the tenant of every job that names none (`map_jobs`' dicts may name their own);
    run_id: the run's id (job ids are `RUN_ID-INDEX`; default: a new one with the start time);
    on_progress: called with `Progress` as outcomes arrive and once at the end;
    raise_on_error: raise MapError when any input failed (default False);
    timeout_s: stop waiting after this long with MapTimeout (default: wait for every outcome).
    """

    lane: str | None
    tenant: str | None
    run_id: str | None
    on_progress: ProgressCallback | None
    raise_on_error: bool
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class OutcomeError:
    """Why an input failed, from its dead letter's `error`."""

    #: the closed list of error kinds (`invalid_job`, `retries_exhausted`, `output_invalid`, ...)
    kind: str
    #: what went wrong, in words (never the input's text)
    message: str
    #: whether the service considered the failure transient
    retryable: bool = False
    #: the provider's HTTP status, when a provider answered
    status_code: int | None = None
    #: the provider, when one was involved
    provider: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The fate of one input: an answer, a failure, or (after a timeout) not in yet."""

    #: the input's position in the list given to `map`
    index: int
    #: its job id, `RUN_ID-INDEX`
    id: str
    #: True when the job has a result
    ok: bool
    #: the answer text, when ok
    output: str | None = None
    #: the Result record (a dict, as published), when ok
    result: dict[str, Any] | None = None
    #: the dead letter's error, when failed
    error: OutcomeError | None = None
    #: True only for an outcome not in yet when a timeout ended the wait
    pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what `promptbus map` prints per input)."""
        out: dict[str, Any] = {"index": self.index, "id": self.id, "ok": self.ok}
        if self.pending:
            out["pending"] = True
        if self.ok:
            out["output"] = self.output
            out["result"] = self.result
        elif self.error is not None:
            out["error"] = {
                "kind": self.error.kind,
                "message": self.error.message,
                "retryable": self.error.retryable,
                "status_code": self.error.status_code,
                "provider": self.error.provider,
            }
        return out


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands: `done` outcomes in (ok or failed) of `total`, `failed` of them."""

    done: int
    failed: int
    total: int
    elapsed_s: float

    @property
    def rate_per_s(self) -> float:
        """Outcomes per second so far."""
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first outcome)."""
        rate = self.rate_per_s
        return (self.total - self.done) / rate if rate > 0 else None


def failure_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed outcomes per error kind, most common first."""
    counts = Counter(o.error.kind for o in outcomes if o.error is not None)
    return dict(counts.most_common())


class MapError(Exception):
    """`raise_on_error=True` and some inputs failed; `outcomes` holds every outcome."""

    def __init__(self, run_id: str, outcomes: list[Outcome]) -> None:
        self.run_id = run_id
        self.outcomes = outcomes
        kinds = ", ".join(f"{k}={n}" for k, n in failure_counts(outcomes).items())
        failed = sum(1 for o in outcomes if o.error is not None)
        super().__init__(f"run {run_id}: {failed} of {len(outcomes)} inputs failed ({kinds})")


class MapTimeout(TimeoutError):
    """The wait ended before every outcome was in. Nothing was cancelled: the service still
    answers every job, and `collect(run_id, total)` returns the full list later.

    `outcomes` has one entry per input, `pending` for those not in yet; `started_at` is the
    run's start (Unix seconds), the `since` a new process needs for a run id chosen by the
    caller.
    """

    def __init__(self, run_id: str, outcomes: list[Outcome], *, timeout_s: float, started_at: float) -> None:
        self.run_id = run_id
        self.outcomes = outcomes
        self.total = len(outcomes)
        self.timeout_s = timeout_s
        self.started_at = started_at
        done = sum(1 for o in outcomes if not o.pending)
        super().__init__(
            f"run {run_id}: {done} of {self.total} outcomes in after {timeout_s:g} s "
            f"(nothing was cancelled; collect({run_id!r}, {self.total}) gets the rest)"
        )
