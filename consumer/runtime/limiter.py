"""Async concurrency limiter around a pure limit algorithm (`consumer.core.limit`), paced by
the provider's announced request budget (`consumer.core.pacing`).

A tier's limiter is a pool of its deployments' gates (`consumer.runtime.gates.Gate`: each
deployment's limit algorithm, mirrors, pause and fleet quota) behind one waiter queue: what
follows holds per gate, and a request, once its turn comes, is granted to the gate
`consumer.core.deployments.choose_deployment` names among those that admit it now, never to
one whose circuit is open (`Gate.up`) unless it is that gate's probe. A waiter that finds every
deployment down is told so (`NoDeploymentUp`): its caller holds it at the circuit instead.

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
import math
import time
from collections.abc import Callable, Sequence

from consumer.core.completion import Usage
from consumer.core.deployments import Room, choose_deployment
from consumer.core.errors import RateLimitHint
from consumer.core.lanes import DEFAULT_LANE_NAME, Lane
from consumer.core.limit import ConcurrencyLimit, LimitReason
from consumer.core.pacing import BudgetPacer, TokenBudget
from consumer.core.quota import NOTHING_USED, QuotaCost, Reservation
from consumer.core.scheduling import LaneScheduler
from consumer.core.tenants import DEFAULT_TENANT
from consumer.runtime.gates import Gate, NoDeploymentUp
from consumer.runtime.quotas import FleetQuota

__all__ = ["UNLANED", "AsyncLimiter", "Gate", "NoDeploymentUp", "Slot", "Token"]

#: smoothing of the actual / estimated token cost of answered requests
COST_RATIO_SMOOTHING = 0.2
#: bounds of that ratio (an answer's usage may be missing or odd)
COST_RATIO_MIN, COST_RATIO_MAX = 0.25, 8.0
#: the lane of a waiter that names none
UNLANED = Lane(DEFAULT_LANE_NAME, "")
#: a hint that says nothing (a 429 without headers still says the provider refuses)
_NO_HINT = RateLimitHint()

#: a waiter: the future its token is handed to, its request's estimated tokens and max_tokens,
#: and the deployment it probes (None: any)
_Waiter = tuple["asyncio.Future[Token]", float, int | None, "Gate | None"]


def _quota_cost(estimated_tokens: float, output_tokens: int | None) -> QuotaCost:
    """What a request reserves of a fleet quota: one request, its estimated input tokens and
    its max_tokens (None: unknown, reserved as large as the input estimate)."""
    return QuotaCost(1, estimated_tokens, estimated_tokens if output_tokens is None else output_tokens)


class Token:
    """One slot of the limiter; end it exactly once.

    seq: admission number of its gate (1, 2, ...), so a hint from its answer can be placed in
    order; started_s: admission time on the limiter's clock; estimated_tokens: the caller's
    estimate of the request's tokens (0: none); reservation: what it took of its gate's fleet
    quota, until it settles (None: nothing); gate: the deployment it was granted to.
    """

    __slots__ = ("_done", "_limiter", "estimated_tokens", "gate", "reservation", "seq", "started_s")

    def __init__(
        self,
        limiter: AsyncLimiter,
        gate: Gate,
        started_s: float,
        seq: int,
        estimated_tokens: float,
        reservation: Reservation | None = None,
    ) -> None:
        self._limiter = limiter
        self.gate = gate
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
        "_deadline_s",
        "_estimated_tokens",
        "_lane",
        "_limiter",
        "_output_tokens",
        "_probe",
        "_tenant",
        "_token",
    )

    def __init__(
        self,
        limiter: AsyncLimiter,
        estimated_tokens: float,
        lane: Lane | None,
        deadline_s: float | None,
        output_tokens: int | None = None,
        probe: Gate | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        self._limiter = limiter
        self._estimated_tokens = estimated_tokens
        self._lane = lane
        self._deadline_s = deadline_s
        self._output_tokens = output_tokens
        self._probe = probe
        self._tenant = tenant
        self._token: Token | None = None

    async def __aenter__(self) -> Token:
        self._token = await self._limiter.acquire(
            self._estimated_tokens,
            lane=self._lane,
            deadline_s=self._deadline_s,
            output_tokens=self._output_tokens,
            probe=self._probe,
            tenant=self._tenant,
        )
        return self._token

    async def __aexit__(self, *_exc: object) -> None:
        if self._token is not None:
            self._token.ignore()  # a no-op when the block ended it


class AsyncLimiter:
    """Admits a tier's requests to its deployments: at most each one's `limit` concurrent calls,
    no faster than its provider's announced budget, one waiter queue for them all.

    Built from one deployment's parts (`algorithm`, `pacer`, `tokens`, `quota`), or from
    `gates`, one per deployment (`Gate`): a request waits once, and is granted to the
    deployment `consumer.core.deployments.choose_deployment` names.
    """

    def __init__(
        self,
        algorithm: ConcurrencyLimit | None = None,
        clock: Callable[[], float] = time.monotonic,
        pacer: BudgetPacer | None = None,
        tokens: TokenBudget | None = None,
        quota: FleetQuota | None = None,
        *,
        gates: Sequence[Gate] | None = None,
        weight_of: Callable[[str], float] | None = None,
    ) -> None:
        """weight_of: a tenant's fair-share weight (None: every tenant weighs 1)."""
        if gates is None:
            assert algorithm is not None, "an algorithm or gates"
            gates = [Gate(algorithm, pacer=pacer, tokens=tokens, quota=quota)]
        self._gates = tuple(gates)
        self._clock = clock
        quotas_seen: set[int] = set()
        for index, gate in enumerate(self._gates):
            first_of_quota = gate.quota is not None and id(gate.quota) not in quotas_seen
            gate.join(self, index, counts_waiting=first_of_quota)
            if gate.quota is not None:
                quotas_seen.add(id(gate.quota))
        #: the one gate of a tier of one deployment (None: several)
        self._only = self._gates[0] if len(self._gates) == 1 else None
        #: the gates that take from a fleet quota
        self._quota_gates = tuple(g for g in self._gates if g.quota is not None)
        #: the waiters, by lane and tenant (`consumer.core.scheduling`)
        self._waiters: LaneScheduler[_Waiter] = (
            LaneScheduler(weight_of=weight_of) if weight_of is not None else LaneScheduler()
        )
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_at_s = 0.0  # loop time the pending timer fires

    @property
    def gates(self) -> tuple[Gate, ...]:
        """One per deployment, in the tier's order."""
        return self._gates

    @property
    def limit(self) -> int:
        return sum(g.limit for g in self._gates)

    @property
    def request_limited(self) -> bool:
        """Some deployment's pacer has learnt a request budget (asked once per routed job)."""
        for gate in self._gates:
            if gate.pacer.rate_per_s:
                return True
        return False

    @property
    def inflight(self) -> int:
        return sum(g.inflight for g in self._gates)

    def limit_reasons(self) -> list[LimitReason]:
        """Per deployment, why its limit admits what it does (`Gate.limit_reason`), for the
        request whose turn it is (None: nothing waits)."""
        now_s = self._clock()
        head = self._waiters.peek(now_s) if self._waiters else None
        tokens = head[1] if head is not None else None
        return [g.limit_reason(tokens, now_s) for g in self._gates]

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def paused_for_s(self) -> float:
        """Seconds until some deployment admits again after a pause (0.0: one is not paused)."""
        now_s = self._clock()
        return max(0.0, min(g.paused_until_s for g in self._gates) - now_s)

    @property
    def pacer(self) -> BudgetPacer:
        """The first deployment's mirror of its provider's request bucket."""
        return self._gates[0].pacer

    @property
    def tokens(self) -> TokenBudget:
        """The first deployment's mirror of its provider's token bucket."""
        return self._gates[0].tokens

    @property
    def quota(self) -> FleetQuota | None:
        """The fleet quota the first deployment naming one counts against (None: none does)."""
        return next((g.quota for g in self._gates if g.quota is not None), None)

    @property
    def cost_ratio(self) -> float:
        """What the first deployment's answered requests cost against their estimates, smoothed."""
        return self._gates[0].cost_ratio

    @property
    def pacing_wait_s(self) -> float:
        """Seconds until a mirrored request budget admits one more request (0.0: now)."""
        now_s = self._clock()
        return min(g.pacer.wait_s(now_s) for g in self._gates)

    def pause(self, duration_s: float, gate: Gate | None = None) -> None:
        """Admit nothing new for duration_s (quota exhausted, Retry-After) on `gate` (None:
        every deployment); calls already running go on."""
        until_s = self._clock() + duration_s
        for g in self._gates if gate is None else (gate,):
            g.paused_until_s = max(g.paused_until_s, until_s)
        if self._waiters:
            self._wake_in(duration_s)

    def note_budget(
        self,
        hint: RateLimitHint | None,
        token: Token | None = None,
        *,
        rejected: bool = False,
        usage: Usage | None = None,
    ) -> None:
        """Pace admissions by the budgets a provider announced with `token`'s answer.

        token: the admission the answer belongs to (None: taken as the first deployment's
        newest admission); rejected: the answer was a 429, or the request was never sent (the
        provider did not count it; after a 429 its bucket is empty); usage: what the answer
        says the request used, which corrects later estimates and settles its fleet quota
        reservation. Hints older than the newest applied one are ignored. A hint that says
        anything, or a 429's, tells the deployment's limit algorithm that its provider refuses
        past a budget rather than queueing (`ConcurrencyLimit.provider_refuses`).
        """
        now_s = self._clock()
        gate = self._gates[0] if token is None else token.gate
        if hint is not None and (rejected or hint != _NO_HINT):
            gate.algorithm.provider_refuses()  # it announced a budget, or answered 429: it refuses
        seq, admitted_s = (gate.seq, now_s) if token is None else (token.seq, token.started_s)
        applied = gate.pacer.observe(hint, seq, admitted_s, now_s, rejected=rejected)
        applied = gate.tokens.observe(hint, seq, admitted_s, rejected=rejected) or applied
        used_tokens = usage.input_tokens + usage.output_tokens if usage is not None else 0
        if used_tokens and token is not None and token.estimated_tokens > 0:
            ratio = min(max(used_tokens / token.estimated_tokens, COST_RATIO_MIN), COST_RATIO_MAX)
            gate.cost_ratio += (ratio - gate.cost_ratio) * COST_RATIO_SMOOTHING
        if token is not None and token.reservation is not None:
            if rejected:
                self._settle(token, NOTHING_USED, now_s)
            elif usage is not None:
                self._settle(token, QuotaCost(1, usage.input_tokens, usage.output_tokens), now_s)
        if applied:
            self._wake()  # a larger budget may admit waiters now; a smaller one sets the timer

    def _settle(self, token: Token, used: QuotaCost, now_s: float) -> None:
        reservation, token.reservation = token.reservation, None
        quota = token.gate.quota
        if reservation is not None and quota is not None:
            quota.settle(reservation, used, now_s)

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

    def _admit(self, gate: Gate, estimated_tokens: float, output_tokens: int | None) -> Token:
        gate.inflight += 1
        gate.seq += 1
        now_s = self._clock()
        gate.pacer.admit(gate.seq, now_s)
        gate.tokens.admit(gate.seq, estimated_tokens * gate.cost_ratio, now_s)
        reservation = None
        if gate.quota is not None:
            reservation = gate.quota.reserve(_quota_cost(estimated_tokens, output_tokens), now_s)
        return Token(self, gate, now_s, gate.seq, estimated_tokens, reservation)

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
        probe: Gate | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Slot:
        """An async context manager around `acquire` that always ends its token (see `Slot`)."""
        return Slot(self, estimated_tokens, lane, deadline_s, output_tokens, probe, tenant)

    async def acquire(
        self,
        estimated_tokens: float = 0.0,
        *,
        lane: Lane | None = None,
        deadline_s: float | None = None,
        output_tokens: int | None = None,
        probe: Gate | None = None,
        tenant: str = DEFAULT_TENANT,
    ) -> Token:
        """Wait for a slot; a released slot is handed to the waiter the lane scheduler names,
        on the deployment `choose_deployment` names.

        estimated_tokens: the request's tokens as the caller estimates them (paces a token
        budget; 0 when unknown); lane: the lane the request is scheduled in (None: the one
        default lane); deadline_s: the nearest deadline of its jobs, on the limiter's clock;
        output_tokens: its max_tokens (what a fleet quota reserves for its output; None:
        unknown); probe: the request is the probe of this deployment's open circuit: it is
        granted there only. Raises NoDeploymentUp when every deployment's circuit is open.
        tenant: whose request it is (fair share within the lane).
        """
        if not self._waiters:
            gate = self._only
            if gate is not None and probe is None and gate.quota is None:
                # one deployment and no fleet quota, the common tier: the checks inline
                now_s = self._clock()
                if (
                    gate.inflight < gate.algorithm.limit
                    and (gate.up is None or gate.up())
                    and gate.paused_until_s <= now_s
                    and gate.mirror_wait_s(estimated_tokens, now_s) <= 0
                ):
                    return self._admit(gate, estimated_tokens, output_tokens)
            else:
                gate, _wait_s = self._choose(estimated_tokens, output_tokens, probe, self._clock())
                if gate is not None:
                    return self._admit(gate, estimated_tokens, output_tokens)
        fut: asyncio.Future[Token] = asyncio.get_running_loop().create_future()
        waiter: _Waiter = (fut, estimated_tokens, output_tokens, probe)
        self._waiters.push(waiter, lane if lane is not None else UNLANED, deadline_s, tenant)
        self._wake()  # a slot may be free with nothing in flight to release it (after a pause)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
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
        gate = token.gate
        if sample:
            gate.algorithm.update((now_s - token.started_s) * 1000.0, gate.inflight, dropped, now_s)
        gate.inflight -= 1
        if token.reservation is not None:
            # ended with no answer and not refused: the provider may have counted the request
            # and its input; it produced no output
            self._settle(token, QuotaCost(1, token.reservation.cost.input_tokens, 0.0), now_s)
        self._wake()

    def wake(self) -> None:
        """Admit the waiters that fit now (a fleet quota calls it when it has room again, the
        call path when a deployment's circuit changes)."""
        self._wake()

    def _choose(
        self,
        estimated_tokens: float,
        output_tokens: int | None,
        probe: Gate | None,
        now_s: float,
        in_line: set[int] | None = None,
    ) -> tuple[Gate | None, float | None]:
        """The gate to admit a request on now, else None with the seconds until one may (None:
        every deployment is down; inf: until a slot or a quota frees). A gate whose next request
        waits on its fleet quota stands in the quota's line (its index added to `in_line`): the
        limiters naming one quota take turns."""
        if probe is not None or len(self._gates) == 1:
            gate = probe if probe is not None else self._gates[0]
            if probe is None and not gate.is_up():
                return None, None
            wait_s = self._gate_wait_s(gate, estimated_tokens, output_tokens, now_s, in_line)
            return (gate, 0.0) if wait_s <= 0 else (None, wait_s)
        any_up = False
        wait_s = math.inf
        rooms: list[Room] = []
        for gate in self._gates:
            if not gate.is_up():
                rooms.append(_DOWN)
                continue
            any_up = True
            gate_wait_s = self._gate_wait_s(gate, estimated_tokens, output_tokens, now_s, in_line)
            wait_s = min(wait_s, gate_wait_s)
            rooms.append(gate.room(gate_wait_s <= 0, now_s))
        if not any_up:
            return None, None
        chosen = choose_deployment(rooms)
        return (self._gates[chosen], 0.0) if chosen is not None else (None, wait_s)

    @staticmethod
    def _gate_wait_s(
        gate: Gate, estimated_tokens: float, output_tokens: int | None, now_s: float, in_line: set[int] | None
    ) -> float:
        """Seconds until `gate` admits the request (0.0: now; inf: until a slot or its quota frees)."""
        if gate.inflight >= gate.limit:
            return math.inf
        wait_s = gate.wait_s(estimated_tokens, now_s)
        quota = gate.quota
        if wait_s > 0 or quota is None:
            return wait_s
        wait_s = quota.wait_s(_quota_cost(estimated_tokens, output_tokens), now_s)
        if wait_s > 0 or not quota.turn_of(gate):
            quota.join(gate)  # woken by a timer, by the limiter served before it, or by room
            if in_line is not None:
                in_line.add(gate.index)
            return wait_s if wait_s > 0 else math.inf
        return 0.0

    def _wake(self) -> None:
        """Hand admissions to the waiters the lane scheduler names, each on the deployment
        `_choose` names (none while every deployment is paused, at its limit, or short of
        budget or quota for the one whose turn it is: then a timer, a release or a quota wakes
        it again). A waiter finds every deployment down: it is told so (NoDeploymentUp)."""
        in_line: set[int] | None = set() if self._quota_gates else None
        while self._waiters:
            now_s = self._clock()
            waiter = self._waiters.peek(now_s)
            assert waiter is not None
            fut, estimated_tokens, output_tokens, probe = waiter
            if fut.done():  # cancelled while waiting
                self._waiters.discard(waiter)
                continue
            gate, wait_s = self._choose(estimated_tokens, output_tokens, probe, now_s, in_line)
            if gate is None:
                if wait_s is None:
                    self._waiters.pop(now_s)
                    fut.set_exception(NoDeploymentUp())
                    continue
                if wait_s < math.inf:
                    self._wake_in(wait_s)
                break
            self._waiters.pop(now_s)
            fut.set_result(self._admit(gate, estimated_tokens, output_tokens))
            if gate.quota is not None:
                gate.quota.served(gate)
                if in_line is not None:
                    in_line.discard(gate.index)
        for gate in self._quota_gates:
            quota = gate.quota
            if quota is not None and (in_line is None or gate.index not in in_line):
                quota.leave(gate)  # nothing waits on the quota here: no waiter, at its limit, or paced


#: what a deployment whose circuit is open offers
_DOWN = Room(up=False, ready=False, free_slots=0, budget=None, weight=1.0, chosen=0)
