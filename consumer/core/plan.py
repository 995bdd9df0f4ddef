"""Split-and-retry planning for one flushed window (DESIGN.md rules 5, 7 and 8).

`RequestPlan` is a pure state machine. The runtime asks it what to send (`start`), sends
each `PlannedRequest` after its `delay_s`, and reports every outcome back (`on_answer`,
`on_error`); each report returns a `Step` with the next requests and the members that
ended. The plan never sends, sleeps or logs I/O.

Decisions:

- one member -> an ordinary request (`packed is None`): the caller sends that job's own
  prompt; its answer is the model's answer and is not judged (empty text or
  finish_reason "length" included), exactly as if batching were off (rule 5), except
  against the output format the job itself asks for (`Member.check`): an answer that
  breaks it fails `output_invalid`;
- a batched answer is classified by `packing.parse_answer`:
  COMPLETE -> every member answered; MISSING -> the answered ones end, each missing one is
  asked again alone; a member whose answer breaks its own output format (`Member.check`) is
  asked again alone too, whatever the verdict; TRUNCATED -> recovered complete entries end,
  the rest is split in halves; MALFORMED / UNEXPECTED -> discarded whole, split in halves (rule 7);
  the items re-asked after a MALFORMED, UNEXPECTED or TRUNCATED answer are shuffled (with
  the plan's rng) before the split: position in a batched list affects the answer (first
  and last items fare better), so a re-ask does not repeat the order that failed;
- a retryable `ProviderError` (rate limit, 5xx, 408, timeouts, connection errors,
  malformed responses) -> the same request again after `retry_delay_s`, until
  `max_attempts`, then every member fails `retries_exhausted`; a retry reuses the packed
  prompt and its aliases (the answer to a failed request never reaches us). Exception: a
  BATCHED request whose attempts all timed out is split in halves, each half getting one
  last attempt (a too-big batch on a slow local server should not fail every member);
- `AuthFailed` -> every member fails `auth_failed`;
- `QuotaExhausted` -> `Step.pause_tier_s` asks the caller to pause the tier, and the same
  request is planned again with that delay (it does not use up `max_attempts`, though
  `attempts(member)` counts it as sent); once the pauses for it would exceed
  `quota_max_wait_s`, its members fail `quota_exhausted`;
- any other permanent error (`Rejected`: content rejected, context too long) on a batched
  request may come from one member: split in halves; on an ordinary request the member
  fails `provider_rejected` (rule 8).

`cancel` ends chosen members (deadline passed, shutdown); later outcomes never touch them.
`release` takes chosen members of an unsent request out of the plan with no outcome (they
moved to a fallback tier, which ends them); the rest get a request of their own.

Every member ends exactly once (answered or failed). Without retries, a plan for N members
sends at most 2N-1 requests: every request either ends at least one member or splits its
members into at least two disjoint requests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from consumer.core.errors import AuthFailed, ErrorKind, ProviderError, QuotaExhausted, RequestTimeout
from consumer.core.packing import (
    DEFAULT_PER_ITEM_OVERHEAD_TOKENS,
    AnswerKind,
    AnswerVerdict,
    PackedPrompt,
    batch_max_tokens,
    pack,
    parse_answer,
)
from consumer.core.retry import RetryPolicy, error_kind_for, retry_delay_s

__all__ = ["MIN_QUOTA_PAUSE_S", "Member", "PlanMember", "PlannedRequest", "RequestPlan", "Step"]

#: A quota pause is at least this long, so a zero cool-down cannot spin forever.
MIN_QUOTA_PAUSE_S = 1.0


class PlanMember(Protocol):
    """What a plan needs of one job: `Member` is the plain one; the runtime's job context
    (`consumer.runtime.context.JobContext`) is another, so no copy is made per job.

    ref: the caller's handle for the job (unique within the plan; identity-hashed).
    input, max_tokens, check: as `Member` says.
    """

    @property
    def ref(self) -> Hashable: ...

    @property
    def input(self) -> str: ...

    @property
    def max_tokens(self) -> int | None: ...

    @property
    def check(self) -> Callable[[str], tuple[str, str | None]] | None: ...


@dataclass(frozen=True, slots=True)
class Member:
    """One job in a plan.

    ref: the caller's handle for the job (unique within the plan).
    input: the value of the prompt's variable (what goes into the batched items).
    max_tokens: the job's effective max_tokens (tier options merged with the job's), if any.
    check: for a job that asks for an output format, its answer as it is to be published and
        what is wrong with it (None: nothing) (`consumer.core.output.OutputFormat.accept`).
    """

    ref: Hashable
    input: str
    max_tokens: int | None = None
    check: Callable[[str], tuple[str, str | None]] | None = None


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """A provider request to send.

    seq: unique within the plan; report the outcome with this very object.
    attempt: 1 for a new request, +1 for each retry of the same members.
    delay_s: wait this long before sending (0 for new requests, > 0 for retries/pauses).
    packed: the batched prompt, or None for an ORDINARY request for the single member
        (the caller sends that job's own prompt/messages and options).
    max_tokens: for a batched request, the members' budgets plus JSON overhead, capped by
        the tier; None when unknown (leave the option as it is).
    quota_waited_s: tier pauses this request has already waited for (quota exhausted).
    """

    seq: int
    members: tuple[PlanMember, ...]
    attempt: int
    delay_s: float
    packed: PackedPrompt | None
    max_tokens: int | None
    quota_waited_s: float = 0.0

    @property
    def batched(self) -> bool:
        """True when several members share this request (a packed prompt, or an embeddings
        array: `consumer.core.embed`)."""
        return len(self.members) > 1


@dataclass(slots=True)
class Step:
    """What an outcome leads to.

    requests: new requests to send (each after its delay_s).
    answered: (member, answer text, the request that answered it).
    failed: (member, dead-letter kind, message).
    pause_tier_s: the provider's quota is exhausted: pause the whole tier this long.
    verdict: the classification of a batched answer (for metrics), else None.
    """

    requests: list[PlannedRequest] = field(default_factory=list)
    answered: list[tuple[PlanMember, str, PlannedRequest]] = field(default_factory=list)
    failed: list[tuple[PlanMember, ErrorKind, str]] = field(default_factory=list)
    pause_tier_s: float | None = None
    verdict: AnswerVerdict | None = None


def _checked(member: PlanMember, answer: str) -> tuple[str, str | None]:
    """`answer` as it is published for `member`, and what is wrong with it (None: nothing)."""
    return (answer, None) if member.check is None else member.check(answer)


class RequestPlan:
    """Plans the provider requests for the members of one flushed window until all end."""

    def __init__(
        self,
        members: Sequence[PlanMember],
        *,
        prefix: str,
        variable: str,
        retry: RetryPolicy,
        rng: random.Random,
        tier_max_tokens: int | None = None,
        per_item_overhead_tokens: int = DEFAULT_PER_ITEM_OVERHEAD_TOKENS,
    ) -> None:
        if not members:
            raise ValueError("a plan needs at least one member")
        refs = [m.ref for m in members]
        if len(set(refs)) != len(refs):
            raise ValueError("member refs must be unique within a plan")
        self.members: tuple[PlanMember, ...] = tuple(members)
        self._prefix = prefix
        self._variable = variable
        self._retry = retry
        self._rng = rng
        self._tier_max_tokens = tier_max_tokens
        self._overhead = per_item_overhead_tokens
        self._seq = 0
        self._started = False
        self._outstanding: dict[int, PlannedRequest] = {}
        self._ended: set[Hashable] = set()
        self._attempts: dict[Hashable, int] = dict.fromkeys(refs, 0)
        self._last_error: dict[Hashable, ProviderError] = {}
        #: provider requests reported back (sent), for the 2N-1 bound and stats
        self.requests_sent = 0

    # --- queries ---------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once every member has ended (answered or failed)."""
        return len(self._ended) == len(self.members)

    @property
    def outstanding(self) -> list[PlannedRequest]:
        """Requests planned and not reported back yet."""
        return list(self._outstanding.values())

    def attempts(self, member: PlanMember) -> int:
        """Provider requests that carried `member` so far (the Result's `attempts`)."""
        return self._attempts[member.ref]

    def last_error(self, member: PlanMember) -> ProviderError | None:
        """The last provider error a request carrying `member` got (for the dead letter)."""
        return self._last_error.get(member.ref)

    # --- planning ----------------------------------------------------------------------

    def _batch_tokens(self, members: Sequence[PlanMember]) -> int | None:
        budgets = [m.max_tokens for m in members]
        if all(b is not None for b in budgets):
            known = [b for b in budgets if b is not None]
            return batch_max_tokens(known, per_item_overhead=self._overhead, cap=self._tier_max_tokens)
        return self._tier_max_tokens

    def _request(
        self,
        members: Sequence[PlanMember],
        *,
        attempt: int = 1,
        delay_s: float = 0.0,
        packed: PackedPrompt | None = None,
        quota_waited_s: float = 0.0,
    ) -> PlannedRequest:
        self._seq += 1
        members = tuple(members)
        packed, max_tokens = self._written(members, packed)
        req = PlannedRequest(self._seq, members, attempt, delay_s, packed, max_tokens, quota_waited_s)
        self._outstanding[req.seq] = req
        return req

    def _written(
        self, members: tuple[PlanMember, ...], packed: PackedPrompt | None
    ) -> tuple[PackedPrompt | None, int | None]:
        """How a request of `members` is written: its packed prompt (None: an ordinary request)
        and its max_tokens. One member is an ordinary request with its own budget; more share a
        packed prompt (`packed`: the one a retry reuses), sized from their budgets."""
        if len(members) == 1:
            return None, members[0].max_tokens
        if packed is None:
            packed = pack(self._prefix, self._variable, [m.input for m in members], self._rng)
        return packed, self._batch_tokens(members)

    def _halves(self, members: Sequence[PlanMember], *, attempt: int = 1) -> list[PlannedRequest]:
        if not members:
            return []
        if len(members) == 1:
            return [self._request(members, attempt=attempt)]
        mid = (len(members) + 1) // 2
        return [self._request(members[:mid], attempt=attempt), self._request(members[mid:], attempt=attempt)]

    def _take(self, req: PlannedRequest) -> None:
        if self._outstanding.pop(req.seq, None) is None:
            raise ValueError(f"request {req.seq} is not outstanding (reported twice or not from this plan)")
        self.requests_sent += 1
        for m in req.members:
            self._attempts[m.ref] += 1

    def _live(self, members: Sequence[PlanMember]) -> list[PlanMember]:
        return [m for m in members if m.ref not in self._ended]

    def _answer(self, step: Step, member: PlanMember, text: str, req: PlannedRequest) -> None:
        if member.ref in self._ended:
            return  # cancelled meanwhile: its outcome is already out
        self._ended.add(member.ref)
        step.answered.append((member, text, req))

    def _fail(self, step: Step, members: Sequence[PlanMember], kind: ErrorKind, message: str) -> None:
        for m in self._live(members):
            self._ended.add(m.ref)
            step.failed.append((m, kind, message))

    def _again(
        self, req: PlannedRequest, *, attempt: int, delay_s: float, quota_waited_s: float = 0.0
    ) -> list[PlannedRequest]:
        """`req` once more for its live members; the packed prompt is kept when they all are."""
        live = self._live(req.members)
        if not live:
            return []
        packed = req.packed if len(live) == len(req.members) else None
        waited_s = quota_waited_s
        return [self._request(live, attempt=attempt, delay_s=delay_s, packed=packed, quota_waited_s=waited_s)]

    def start(self) -> list[PlannedRequest]:
        """The first request: batched for several members, ordinary for one."""
        if self._started:
            raise RuntimeError("start() was already called")
        self._started = True
        return [self._request(self.members)]

    def on_answer(self, req: PlannedRequest, text: str, finish_reason: str | None) -> Step:
        """The provider answered `req` with `text`; returns what to do next."""
        self._take(req)
        step = Step()
        if req.packed is None:
            member = req.members[0]
            text, problem = _checked(member, text)
            if problem is None:
                self._answer(step, member, text, req)
            else:
                self._fail(step, [member], ErrorKind.OUTPUT_INVALID, problem)
            return step
        verdict = parse_answer(text, req.packed.aliases, finish_reason)
        step.verdict = verdict
        by_alias = dict(zip(req.packed.aliases, req.members, strict=True))
        disobeying: list[PlanMember] = []
        for alias, answer in verdict.answers.items():
            member = by_alias[alias]
            answer, problem = _checked(member, answer)
            if problem is None:
                self._answer(step, member, answer, req)
            else:
                disobeying.append(member)
        # an answer that breaks its job's output format is asked again alone, like a missing one
        step.requests.extend(self._request([m]) for m in self._live(disobeying))
        rest = self._live([by_alias[a] for a in verdict.missing])
        if verdict.kind is AnswerKind.MISSING:
            step.requests.extend(self._request([m]) for m in rest)
        elif verdict.kind is not AnswerKind.COMPLETE:
            # A model answers the first and last items of a list better than the middle
            # ones: the re-ask shuffles them, so an item is not held at a bad position.
            self._rng.shuffle(rest)
            step.requests.extend(self._halves(rest))
        return step

    def on_error(self, req: PlannedRequest, error: ProviderError) -> Step:
        """Sending `req` failed with `error`; returns what to do next."""
        self._take(req)
        for m in req.members:
            self._last_error[m.ref] = error
        step = Step()
        if not self._live(req.members):
            return step
        if isinstance(error, AuthFailed):
            self._fail(step, req.members, ErrorKind.AUTH_FAILED, error.message)
        elif isinstance(error, QuotaExhausted):
            hinted = error.hint.retry_after_s
            pause_s = max(MIN_QUOTA_PAUSE_S, hinted if hinted is not None else self._retry.quota_cooldown_s)
            waited_s = req.quota_waited_s + pause_s
            if waited_s > self._retry.quota_max_wait_s:
                message = f"quota exhausted for {req.quota_waited_s:.0f} s: {error.message}"
                self._fail(step, req.members, ErrorKind.QUOTA_EXHAUSTED, message)
            else:
                step.pause_tier_s = pause_s
                step.requests += self._again(
                    req, attempt=req.attempt, delay_s=pause_s, quota_waited_s=waited_s
                )
        elif error.retryable:
            if req.attempt < self._retry.max_attempts:
                delay_s = retry_delay_s(req.attempt, error.hint, self._retry, self._rng)
                step.requests += self._again(req, attempt=req.attempt + 1, delay_s=delay_s)
            elif req.batched and isinstance(error, RequestTimeout):
                # A batched request that keeps timing out is likely too big to finish in
                # time: its halves get one last attempt each instead of failing everyone.
                step.requests.extend(self._halves(self._live(req.members), attempt=req.attempt))
            else:
                message = f"{type(error).__name__} after {req.attempt} attempts: {error.message}"
                self._fail(step, req.members, ErrorKind.RETRIES_EXHAUSTED, message)
        elif req.batched:
            step.requests.extend(self._halves(self._live(req.members)))
        else:
            self._fail(step, req.members, error_kind_for(error), error.message)
        return step

    def release(self, req: PlannedRequest, members: Sequence[PlanMember]) -> PlannedRequest | None:
        """`members` of the unsent request `req` leave the plan without an outcome here (they
        moved to another tier); `req` is withdrawn. Returns the request for its members still
        open (same attempt, no delay), or None when none is."""
        if self._outstanding.pop(req.seq, None) is None:
            raise ValueError(f"request {req.seq} is not outstanding (reported or released before)")
        for m in self._live(members):
            self._ended.add(m.ref)
        live = self._live(req.members)
        if not live:
            if self.done:
                self._outstanding.clear()
            return None
        packed = req.packed if len(live) == len(req.members) else None
        return self._request(live, attempt=req.attempt, packed=packed, quota_waited_s=req.quota_waited_s)

    def cancel(self, kind: ErrorKind, message: str, members: Sequence[PlanMember] | None = None) -> Step:
        """End `members` (default: all) still open with `kind` (e.g. deadline_exceeded).

        Outstanding requests stay valid: their outcomes may still be reported and end the
        other members; cancelled members are never answered or failed again. When nothing
        is left open, outstanding requests are forgotten (reporting them raises ValueError).
        """
        step = Step()
        self._fail(step, self.members if members is None else members, kind, message)
        if self.done:
            self._outstanding.clear()
        return step
