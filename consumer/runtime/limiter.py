"""Async concurrency limiter around a pure limit algorithm (`consumer.core.limit`), paced by
the provider's announced request budget (`consumer.core.pacing`).

A caller acquires a `Token` before a provider call and ends it exactly once:
`success()` (the call returned; its RTT feeds the algorithm), `dropped()` (overload:
429/529/503/timeout — the algorithm shrinks), or `ignore()` (a failure that says nothing
about load, e.g. a 400). `async with limiter.slot(tokens) as token:` guarantees the end: a
token the block did not end (it raised, or forgot) ends as `ignore`, so no exception can
leak a slot and wedge the tier. A free slot goes to the waiter the lane scheduler names
(`consumer.core.scheduling`): the highest lane with a request waiting, unless a lower lane is owed
its `min_share`; within a lane the tenant with the least weighted service so far; within a
tenant the nearest deadline first, then first come, first served (a waiter that names no lane
waits in the one default lane, one that names no tenant as the `default` tenant).

Three things bound admission: the concurrency limit (AIMD, gradient or fixed) and, once a
provider has sent rate-limit headers, mirrors of its request bucket (`BudgetPacer`) and of
its token bucket (`TokenBudget`): the caller reports each answer's `RateLimitHint` with its
token (`note_budget(hint, token, usage=...)`), and a request is admitted only when the
mirrors hold one request and its estimated tokens; otherwise the oldest waiter is woken when
they will. A concurrency limit alone cannot sit at a *rate* ceiling. `pause()` (Retry-After,
quota) stops all admissions for a while on top of all of them.

A request's tokens are estimated by the caller before it goes (`acquire(estimated_tokens)`,
e.g. its prompt's characters / 4) and scaled by what answers actually cost against their
estimates (the output, and the tokenizer's own count, are unknown in advance).

A limiter whose tier names a fleet quota (`quota: NAME`) is handed that quota's
`consumer.runtime.quotas.FleetQuota` at construction, shared with every limiter that names it:
a request is then admitted only when this instance's share of the quota holds it too. It
reserves one request, its estimated input tokens and its `max_tokens` (`acquire(...,
output_tokens=)`), and settles to what it used: the answer's usage (`note_budget(usage=)`),
nothing for a request the provider never counted (a 429, or one not sent), and its input only
for one that failed otherwise. Without a quota none of this is asked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from consumer.core.completion import Usage
from consumer.core.errors import RateLimitHint
from consumer.core.lanes import DEFAULT_LANE_NAME, Lane
from consumer.core.limit import ConcurrencyLimit
from consumer.core.pacing import BudgetPacer, TokenBudget
from consumer.core.quota import NOTHING_USED, QuotaCost, Reservation
from consumer.core.scheduling import LaneScheduler
from consumer.core.tenants import DEFAULT_TENANT
from consumer.runtime.quotas import FleetQuota

#: smoothing of the actual / estimated token cost of answered requests
COST_RATIO_SMOOTHING = 0.2
#: bounds of that ratio (an answer's usage may be missing or odd)
COST_RATIO_MIN, COST_RATIO_MAX = 0.25, 8.0
#: the lane of a waiter that names none
UNLANED = Lane(DEFAULT_LANE_NAME, "")

#: a waiter: the future its token is handed to, its request's estimated tokens and max_tokens
_Waiter = tuple["asyncio.Future[Token]", float, int | None]


def _quota_cost(estimated_tokens: float, output_tokens: int | None) -> QuotaCost:
    """What a request reserves of a fleet quota: one request, its estimated input tokens and
    its max_tokens (None: unknown, reserved as large as the input estimate)."""
    return QuotaCost(1, estimated_tokens, estimated_tokens if output_tokens is None else output_tokens)


class Token:
    """One slot of the limiter; end it exactly once.

    seq: admission number (1, 2, ...), so a hint from its answer can be placed in order;
    started_s: admission time on the limiter's clock;
    estimated_tokens: the caller's estimate of the request's tokens (0: none);
    reservation: what it took of the limiter's fleet quota, until it settles (None: nothing).
    """

    __slots__ = ("_done", "_limiter", "estimated_tokens", "reservation", "seq", "started_s")

    def __init__(
        self,
        limiter: AsyncLimiter,
        started_s: float,
        seq: int,
        estimated_tokens: float,
        reservation: Reservation | None = None,
    ) -> None:
        self._limiter = limiter
        self.started_s = started_s
        self.seq = seq
        self.estimated_tokens = estimated_tokens
        self.reservation = reservation
        self._done = False

    def success(self) -> None:
        """The call returned an answer: its RTT is a sample of the limit algorithm."""
        self._end(dropped=False, sample=True)

    def dropped(self) -> None:
        """The call met overload (429/529/503/timeout): the limit algorithm shrinks."""
        self._end(dropped=True, sample=True)

    def ignore(self) -> None:
        """The call failed in a way that says nothing about load."""
        self._end(dropped=False, sample=False)

    def _end(self, *, dropped: bool, sample: bool) -> None:
        if self._done:
            return
        self._done = True
        self._limiter._release(self, dropped=dropped, sample=sample)


class Slot:
    """`async with limiter.slot(estimated_tokens) as token:` — the token ends when the block does.

    The block ends the token itself (success / dropped / ignore) when it knows how the call
    went; whatever it left unended, by an exception or otherwise, ends as `ignore`.
    """

    __slots__ = (
        "_deadline_s", "_estimated_tokens", "_lane", "_limiter", "_output_tokens", "_tenant", "_token"
    )

    def __init__(
        self,
        limiter: AsyncLimiter,
        estimated_tokens: float,
        lane: Lane | None,
        deadline_s: float | None,
        output_tokens: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        self._limiter = limiter
        self._estimated_tokens = estimated_tokens
        self._lane = lane
        self._deadline_s = deadline_s
        self._output_tokens = output_tokens
        self._tenant = tenant
        self._token: Token | None = None

    async def __aenter__(self) -> Token:
        self._token = await self._limiter.acquire(
            self._estimated_tokens,
            lane=self._lane,
            deadline_s=self._deadline_s,
            output_tokens=self._output_tokens,
            tenant=self._tenant,
        )
        return self._token

    async def __aexit__(self, *_exc: object) -> None:
        if self._token is not None:
            self._token.ignore()  # a no-op when the block ended it


class AsyncLimiter:
    """Admits at most `limit` concurrent calls, no faster than the provider's announced budget."""

    def __init__(
        self,
        algorithm: ConcurrencyLimit,
        clock: Callable[[], float] = time.monotonic,
        pacer: BudgetPacer | None = None,
        tokens: TokenBudget | None = None,
        quota: FleetQuota | None = None,
        weight_of: Callable[[str], float] | None = None,
    ) -> None:
        """weight_of: a tenant's fair-share weight (None: every tenant weighs 1)."""
        self._algorithm = algorithm
        self._clock = clock
        self._pacer = pacer if pacer is not None else BudgetPacer()
        self._tokens = tokens if tokens is not None else TokenBudget()
        self._quota = quota
        if quota is not None:
            quota.attach(self)
        self._cost_ratio = 1.0  # actual / estimated tokens of answered requests, smoothed
        self._inflight = 0
        self._seq = 0
        #: the waiters, by lane and tenant (`consumer.core.scheduling`)
        self._waiters: LaneScheduler[_Waiter] = (
            LaneScheduler(weight_of=weight_of) if weight_of is not None else LaneScheduler()
        )
        self._paused_until_s = 0.0
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_at_s = 0.0  # loop time the pending timer fires

    @property
    def limit(self) -> int:
        return self._algorithm.limit

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def paused_for_s(self) -> float:
        return max(0.0, self._paused_until_s - self._clock())

    @property
    def pacer(self) -> BudgetPacer:
        """The mirror of the provider's request bucket (inactive until a hint arrives)."""
        return self._pacer

    @property
    def tokens(self) -> TokenBudget:
        """The mirror of the provider's token bucket (inactive until a budget arrives)."""
        return self._tokens

    @property
    def quota(self) -> FleetQuota | None:
        """The fleet quota this limiter's requests count against (None: none)."""
        return self._quota

    @property
    def cost_ratio(self) -> float:
        """What answered requests cost in tokens against their estimates, smoothed."""
        return self._cost_ratio

    @property
    def pacing_wait_s(self) -> float:
        """Seconds until the mirrored request budget admits one more request (0.0: now)."""
        return self._pacer.wait_s(self._clock())

    def _mirror_wait_s(self, estimated_tokens: float, now_s: float) -> float:
        """Seconds until the mirrors of the provider's budgets hold a request of these tokens."""
        return max(self._pacer.wait_s(now_s), self._tokens.wait_s(estimated_tokens * self._cost_ratio, now_s))

    def pause(self, duration_s: float) -> None:
        """Admit nothing new for duration_s (quota exhausted, Retry-After): calls already running go on."""
        until_s = self._clock() + duration_s
        if until_s <= self._paused_until_s:
            return
        self._paused_until_s = until_s
        if self._waiters:
            self._wake_in(self.paused_for_s)

    def note_budget(
        self,
        hint: RateLimitHint | None,
        token: Token | None = None,
        *,
        rejected: bool = False,
        usage: Usage | None = None,
    ) -> None:
        """Pace admissions by the budgets a provider announced with `token`'s answer.

        token: the admission the answer belongs to (None: taken as the newest admission);
        rejected: the answer was a 429, or the request was never sent (the provider did not
        count it; after a 429 its bucket is empty); usage: what the answer says the request
        used, which corrects later estimates and settles its fleet quota reservation. Hints
        older than the newest applied one are ignored.
        """
        now_s = self._clock()
        seq, admitted_s = (self._seq, now_s) if token is None else (token.seq, token.started_s)
        applied = self._pacer.observe(hint, seq, admitted_s, now_s, rejected=rejected)
        applied = self._tokens.observe(hint, seq, admitted_s, rejected=rejected) or applied
        used_tokens = usage.input_tokens + usage.output_tokens if usage is not None else 0
        if used_tokens and token is not None and token.estimated_tokens > 0:
            ratio = min(max(used_tokens / token.estimated_tokens, COST_RATIO_MIN), COST_RATIO_MAX)
            self._cost_ratio += (ratio - self._cost_ratio) * COST_RATIO_SMOOTHING
        if token is not None and token.reservation is not None:
            if rejected:
                self._settle(token, NOTHING_USED, now_s)
            elif usage is not None:
                self._settle(token, QuotaCost(1, usage.input_tokens, usage.output_tokens), now_s)
        if applied:
            self._wake()  # a larger budget may admit waiters now; a smaller one sets the timer

    def _settle(self, token: Token, used: QuotaCost, now_s: float) -> None:
        reservation, token.reservation = token.reservation, None
        if reservation is not None and self._quota is not None:
            self._quota.settle(reservation, used, now_s)

    def _wake_in(self, delay_s: float) -> None:
        """Run `_wake` after delay_s, unless a timer fires sooner: nothing else may wake the
        waiters when a pause or a pacing wait ends with nothing in flight."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nobody can be waiting either
            return
        at_s = loop.time() + delay_s + 0.001
        timer = self._wake_timer
        if timer is not None and not timer.cancelled() and self._wake_at_s > loop.time():
            if self._wake_at_s <= at_s:
                return
            timer.cancel()
        self._wake_at_s = at_s
        self._wake_timer = loop.call_at(at_s, self._on_timer)

    def _on_timer(self) -> None:
        self._wake_timer = None
        self._wake()

    def _admit(self, estimated_tokens: float, output_tokens: int | None) -> Token:
        self._inflight += 1
        self._seq += 1
        now_s = self._clock()
        self._pacer.admit(self._seq, now_s)
        self._tokens.admit(self._seq, estimated_tokens * self._cost_ratio, now_s)
        reservation = None
        if self._quota is not None:
            reservation = self._quota.reserve(_quota_cost(estimated_tokens, output_tokens), now_s)
        return Token(self, now_s, self._seq, estimated_tokens, reservation)

    def waiting_in(self, lane: str) -> int:
        """Requests of `lane` waiting for a slot."""
        return self._waiters.waiting(lane)

    def slot(
        self,
        estimated_tokens: float = 0.0,
        *,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        output_tokens: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Slot:
        """An async context manager around `acquire` that always ends its token (see `Slot`)."""
        return Slot(self, estimated_tokens, lane, deadline_s, output_tokens, tenant)

    async def acquire(
        self,
        estimated_tokens: float = 0.0,
        *,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        output_tokens: int | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Token:
        """Wait for a slot; a released slot is handed to the waiter the lane scheduler names.

        estimated_tokens: the request's tokens as the caller estimates them (paces a token
        budget; 0 when unknown); lane: the lane the request is scheduled in (None: the one
        default lane); deadline_s: the nearest deadline of its jobs, on the limiter's clock;
        output_tokens: its max_tokens (what a fleet quota reserves for its output; None: unknown);
        tenant: whose request it is (fair share within the lane).
        """
        quota = self._quota
        if (
            self._inflight < self.limit
            and not self._waiters
            and self.paused_for_s <= 0
            and self._mirror_wait_s(estimated_tokens, self._clock()) <= 0
            and (
                quota is None
                or (
                    quota.turn_of(self)
                    and quota.wait_s(_quota_cost(estimated_tokens, output_tokens), self._clock()) <= 0
                )
            )
        ):
            return self._admit(estimated_tokens, output_tokens)
        fut: asyncio.Future[Token] = asyncio.get_running_loop().create_future()
        waiter: _Waiter = (fut, estimated_tokens, output_tokens)
        self._waiters.push(waiter, lane if lane is not None else UNLANED, deadline_s, tenant)
        self._wake()  # a slot may be free with nothing in flight to release it (after a pause)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # a slot was handed to us that we will not use: pass it on; the provider will
                # never count it, so the mirrors must not wait for it either
                token = fut.result()
                self.note_budget(None, token, rejected=True)
                token.ignore()
            else:
                self._waiters.discard(waiter)
            raise

    def _release(self, token: Token, *, dropped: bool, sample: bool) -> None:
        now_s = self._clock()
        if sample:
            self._algorithm.update((now_s - token.started_s) * 1000.0, self._inflight, dropped, now_s)
        self._inflight -= 1
        if token.reservation is not None:
            # ended with no answer and not refused: the provider may have counted the request
            # and its input; it produced no output
            self._settle(token, QuotaCost(1, token.reservation.cost.input_tokens, 0.0), now_s)
        self._wake()

    def wake(self) -> None:
        """Admit the waiters that fit now (a fleet quota calls it when it has room again)."""
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to the waiters the lane scheduler names (none while paused or while
        a budget is short for the one whose turn it is). A limiter whose next request waits on
        its fleet quota stands in the quota's line: the limiters naming one quota take turns."""
        quota = self._quota
        while self._waiters and self._inflight < self.limit:
            if self.paused_for_s > 0:
                self._wake_in(self.paused_for_s)
                break
            now_s = self._clock()
            waiter = self._waiters.peek(now_s)
            assert waiter is not None
            fut, estimated_tokens, output_tokens = waiter
            if fut.done():  # cancelled while waiting
                self._waiters.discard(waiter)
                continue
            wait_s = self._mirror_wait_s(estimated_tokens, now_s)
            if wait_s > 0:
                self._wake_in(wait_s)
                break
            if quota is not None:
                quota_wait_s = quota.wait_s(_quota_cost(estimated_tokens, output_tokens), now_s)
                if quota_wait_s > 0 or not quota.turn_of(self):
                    quota.join(self)  # woken by a timer, by the limiter served before it, or by room
                    if quota_wait_s > 0:
                        self._wake_in(quota_wait_s)
                    return
            self._waiters.pop(now_s)
            fut.set_result(self._admit(estimated_tokens, output_tokens))
            if quota is not None:
                quota.served(self)
        if quota is not None:
            quota.leave(self)  # nothing waits on the quota here: no waiter, at its limit, or paced
