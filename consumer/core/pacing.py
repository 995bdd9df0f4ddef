"""Request pacing from a provider's rate-limit headers: a mirror of its token bucket.

OpenAI and Anthropic enforce requests-per-minute as a token bucket: the bucket holds at most
the limit, refills continuously at limit / minute, and each request takes one. Every answer
says what was left (`remaining`, after this request) and when the bucket is full again
(`reset`). A concurrency limit alone cannot sit at such a *rate* ceiling: a few slots with
short latencies exhaust the bucket, and the 429s that follow halve the limit. So the limiter
keeps a mirror of the provider's bucket and admits a request only when the mirror holds one.

The bucket in GCRA terms: a request arriving at `a` is answered with `reset = TAT - a`, where
TAT (theoretical arrival time) moves 1/rate further out per counted request and the bucket is
full once TAT is in the past. Two hints (admission times a_i < a_j, resets T_i, T_j) with `k`
requests counted between them, and the bucket never full in between (a_i + T_i > a_j), give

    1 / rate = ((a_j + T_j) - (a_i + T_i)) / k

without knowing the limit, and without the rounding of `remaining` (an integer). Where the
reset is measured from the answer's arrival (Anthropic sends a time of day), that estimate
jitters with the round trip; `remaining` over the admissions' own times gives a second one
(refilled = remaining_j - remaining_i + k over a_j - a_i), and the smaller of the two is
taken: a rate too low only keeps a reserve in the bucket, one too high costs 429s. Both are
timed by the client's clock, which drifts against the provider's when sends or answers wait
behind other work; where the answers name the limit, (limit - remaining) / reset bounds the
rate from above in the provider's own time (the level is at most one above `remaining`), and
the tightest bound of the newest few hints caps the estimate. The level
is taken from `remaining` (rounded down: a reserve of less than one request) and replayed
from the hinted request's admission: requests admitted after it were not yet counted by the
provider when it answered, so they are subtracted. A request is admitted once the mirror
holds 1 + `margin` (it reaches the provider a little after its admission). A hint older
than the newest applied one says nothing new about the level and is ignored (it still helps
the rate estimate). A 429 is counted by nobody (not in `k`) and leaves the mirror empty.
With no hints (local servers) the pacer is inactive and admits everything.

Two resets give a rate only when they are far apart against the round trip's jitter (a
reset measured from the answer's arrival moves with it). A bucket that refills completely
within about a round trip (a few requests of budget, long answers) yields no rate that way;
where the answers name the limit, each hint bounds the rate from both sides ((limit -
remaining - 1) / reset to (limit - remaining) / reset, `_bound_rate_by_limit`), and the highest
lower bound is the rate. Without the limit such a bucket is spent each time it is surely full:
slower than the limit, without 429s.

Token budgets (TPM) are mirrored by `TokenBudget`, more simply: the answers also say the
token limit, so the refill rate is exact ((limit - remaining) / reset: a bucket refills at a
constant rate and `reset` is the time until it is full), and only a request's cost is
unknown before its answer. The caller estimates it; each hint replaces the mirror's level
with what the provider counted, less the estimates of requests admitted after the hinted one,
so an estimate's error lasts one round trip.

Pure: the caller passes the clock (`now_s`, monotonic seconds); nothing sleeps.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass

from consumer.core.errors import RateLimitHint

__all__ = ["BudgetPacer", "TokenBudget"]

#: seconds to wait when the mirror is empty, no rate is known yet and the hint gave no reset
FALLBACK_WAIT_S = 1.0
#: hints kept for the rate estimate (a bound on memory at high rates)
MAX_MARKS = 1024

#: the shortest token reset a refill rate is learnt from once one is known: a header's reset is
#: rounded (to 1 ms at OpenAI), so a 6 ms reset may be off by a sixth, a 100 ms one by 1%
MIN_RATE_RESET_S = 0.1
#: 429s remembered (their sequence numbers), so hints around them count requests right
MAX_REJECTED = 4096
#: requests refilled between two hints before `remaining` (an integer) is trusted for the rate
MIN_REFILLED = 10
#: resets come rounded (OpenAI: to the millisecond); a TAT this close to an admission may
#: still have been in the future
RESET_ROUNDING_S = 0.002
#: hints whose upper bounds on the refill rate are kept (a changed limit is followed after these)
RATE_BOUNDS = 32
#: a 429 for a request the mirror admitted scales the rate estimate by this
RATE_CUT_ON_429 = 0.9
#: the resets of two hints must be this many round-trip jitters apart to give a rate
JITTER_FACTOR = 20.0
RTT_SMOOTHING = 0.1
#: the share of a request's estimated tokens the token mirror must hold beyond them
TOKEN_MARGIN = 0.5
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class _Mark:
    """One applied hint in GCRA terms: TAT = admitted_s + reset_s after request `seq`."""

    seq: int
    admitted_s: float
    tat_s: float
    remaining: int


class BudgetPacer:
    """Mirror of a provider's request bucket, kept from the rate-limit hints of its answers.

    The caller numbers admissions 1, 2, 3 ... (`admit(seq, now_s)`), reports each answer's
    hint with the number and admission time of its request (`observe`), and asks `wait_s(now_s)`
    before admitting: 0.0 means one may go now.

    min_baseline_s: the resets of two hints must differ at least this much to estimate the
        refill rate from them (the resets are rounded to milliseconds);
    max_baseline_s: the age of the oldest hint kept for it (a longer baseline averages more,
        a shorter follows a changed limit sooner);
    margin: the share of one request the mirror must hold beyond it before one is admitted.
    """

    def __init__(
        self, *, min_baseline_s: float = 0.05, max_baseline_s: float = 60.0, margin: float = 0.5
    ) -> None:
        if not 0.0 < min_baseline_s < max_baseline_s:
            raise ValueError("need 0 < min_baseline_s < max_baseline_s")
        if not 0.0 <= margin < 1.0:
            raise ValueError("need 0 <= margin < 1")
        self.margin = margin
        self.min_baseline_s = min_baseline_s
        self.max_baseline_s = max_baseline_s
        self._level: float | None = None  # requests in the mirror at _level_s (None: no hint yet)
        self._level_s = 0.0
        self._capacity: float | None = None  # the provider's limit, as the hints imply it
        self._limit_floor = 1.0  # the limit is at least one more than any hint said remained
        self._rate_per_s: float | None = None
        self._full_at_s: float | None = None  # when the newest hint said the bucket is full again
        self._newest_seq = -1  # sequence number of the newest applied hint
        self._marks: collections.deque[_Mark] = collections.deque()
        #: (sequence number, admission time) of admissions after the newest applied hint
        self._since: collections.deque[tuple[int, float]] = collections.deque()
        self._rejected: list[int] = []  # sorted sequence numbers answered 429 (not counted)
        self._rejected_horizon = 0  # 429s up to this sequence number were forgotten
        self._rtt_s: float | None = None  # smoothed round trip of answers with a budget
        self._rtt_jitter_s = 0.0  # its smoothed absolute deviation
        #: upper bounds on the refill rate from the newest hints that named the limit
        self._rate_bounds: collections.deque[float] = collections.deque(maxlen=RATE_BOUNDS)
        #: lower bounds on it from the same hints
        self._rate_floors: collections.deque[float] = collections.deque(maxlen=RATE_BOUNDS)

    @property
    def active(self) -> bool:
        """True once a hint with a request budget arrived (before that, nothing is paced)."""
        return self._level is not None

    @property
    def rate_per_s(self) -> float | None:
        """The estimated refill rate of the provider's request bucket (None: not known yet)."""
        return self._rate_per_s

    @property
    def capacity(self) -> float | None:
        """The provider's limit as the newest hint implies it (remaining + rate x reset)."""
        return self._capacity

    def level(self, now_s: float) -> float | None:
        """Requests the mirror holds at now_s (negative: more admitted than the provider allowed yet)."""
        if self._level is None:
            return None
        level = self._level
        if self._rate_per_s is None:
            # no rate yet: by its reset time the bucket is full, and it holds at least one more
            # than any hint said remained
            if self._full_at_s is not None and now_s >= self._full_at_s:
                level = max(level, self._limit_floor)
            return level
        if now_s > self._level_s:
            level = max(self._level, self._refilled(level, self._level_s, now_s))
        return level

    def wait_s(self, now_s: float) -> float:
        """Seconds until the mirror holds one request (0.0: admit now)."""
        level = self.level(now_s)
        if level is None:
            return 0.0
        # aim above one request: a request reaches the provider a little after its admission
        # (the mirror refills from the admission), and one sent at exactly the refill instant is
        # a coin toss; the level stays bounded, so the margin costs no rate, only that reserve
        need = 1.0 + self.margin
        if self._rate_per_s is None:
            # nothing refills in the mirror: `remaining` (rounded down) is safe as it stands
            if level >= 1.0:
                return 0.0
            assert self._full_at_s is not None  # set with the level
            return max(0.0, self._full_at_s - now_s)
        if level >= need - _EPSILON:  # float rounding must not wait 1e-17 s forever
            return 0.0
        return (need - level) / self._rate_per_s

    def admit(self, seq: int, now_s: float) -> None:
        """Request `seq` (numbered from 1, increasing) was admitted at now_s: it takes one."""
        self._since.append((seq, now_s))
        if len(self._since) > MAX_MARKS:
            self._since.popleft()
        level = self.level(now_s)
        if level is not None:
            if self._rate_per_s is None and self._full_at_s is not None and now_s >= self._full_at_s:
                # the reset passed with no hint since: the full bucket is being spent now; with
                # no answer, assume at least one more after another FALLBACK_WAIT_S
                self._full_at_s = now_s + FALLBACK_WAIT_S
            self._level = level - 1.0
            self._level_s = now_s

    def observe(
        self, hint: RateLimitHint | None, seq: int, admitted_s: float, now_s: float, *, rejected: bool = False
    ) -> bool:
        """Apply the hint of request `seq`'s answer (rejected: it was a 429). True if applied.

        A hint older than the newest applied one is ignored (the newer one already counted
        more); a 429 is remembered either way, since the provider did not count it.
        """
        if rejected and seq > self._rejected_horizon:
            bisect.insort(self._rejected, seq)
            if len(self._rejected) > MAX_REJECTED:  # keep memory bounded; older 429s are forgotten
                self._rejected_horizon = self._rejected[MAX_REJECTED // 2]
                del self._rejected[: MAX_REJECTED // 2 + 1]
        if hint is None or hint.remaining_requests is None:
            return False
        if not rejected:
            self._limit_floor = max(self._limit_floor, hint.remaining_requests + 1.0)
        self._note_rtt(now_s - admitted_s)
        reset_s = hint.reset_requests_s
        if reset_s is not None and reset_s > 0:
            remaining_now = 0 if rejected else max(0, hint.remaining_requests)
            self._learn_rate(_Mark(seq, admitted_s, admitted_s + reset_s, remaining_now))
            self._bound_rate_by_limit(hint, reset_s)
        if seq <= self._newest_seq:
            return False
        if rejected and self._rate_per_s is not None:
            # the mirror said there was budget: the rate is likely too high (a stale estimate
            # the hints cannot correct, e.g. resets that jitter with the round trip); a rate
            # too low costs nothing, and the next good estimate replaces this one
            self._rate_per_s *= RATE_CUT_ON_429
        self._newest_seq = seq
        # Until a rate is known, the mirror does not refill: it jumps to full when the bucket
        # surely is. Counted from the answer's arrival (an Anthropic reset is measured from
        # there; an OpenAI one from the provider, earlier), rounded up, and later if requests
        # admitted since will have taken from it (their own answers will say more).
        self._full_at_s = now_s + (reset_s + RESET_ROUNDING_S if reset_s is not None else FALLBACK_WAIT_S)
        remaining = 0 if rejected else max(0, hint.remaining_requests)
        if self._rate_per_s is not None and reset_s is not None:
            # the newest estimate, not the largest: an early rate estimate may be off
            self._capacity = max(remaining + self._rate_per_s * reset_s, self._limit_floor)
        # the provider's level right after `seq`, replayed to now: refills, and the requests
        # admitted since that it had not counted yet when it answered
        since = self._since
        while since and since[0][0] <= seq:
            since.popleft()
        level, at_s = float(remaining), admitted_s
        for later_seq, later_s in since:
            if self._is_rejected(later_seq):
                continue
            level = self._refilled(level, at_s, later_s) - 1.0
            at_s = max(at_s, later_s)
            if self._rate_per_s is None:
                self._full_at_s = max(self._full_at_s, now_s + FALLBACK_WAIT_S)
        self._level = self._refilled(level, at_s, now_s)
        self._level_s = now_s
        return True

    def _bound_rate_by_limit(self, hint: RateLimitHint, reset_s: float) -> None:
        """Hold the learnt rate within what the provider's own numbers allow.

        A hint that names the bucket's size bounds its refill rate, all in the provider's time:
        the level is `remaining` to one more (rounded down), so the (limit - remaining) requests
        missing, less up to one, refill in reset_s: the rate is at most (limit - remaining) /
        reset_s and at least (limit - remaining - 1) / reset_s. The tightest of the newest
        RATE_BOUNDS upper bounds caps the rate learnt from the hints' timing, which is measured
        by the client's clock and so runs high when sends or answers wait behind a busy event
        loop (three requests whose resets seem 20 ms too close together read 55/s from a 40/s
        bucket). The highest of the newest lower bounds is a floor under it, and the rate itself
        where the timing gives none: a bucket that refills within about a round trip (20 a
        second, answers that take seconds) leaves no two hints far enough apart for it, and
        holding its rate unknown would spend it only each time it is surely full.
        """
        if hint.limit_requests is None or hint.remaining_requests is None:
            return
        missing = hint.limit_requests - max(0, hint.remaining_requests)
        if missing < 1 or reset_s <= RESET_ROUNDING_S:
            return
        self._rate_bounds.append(missing / (reset_s - RESET_ROUNDING_S))
        if missing >= 2:
            self._rate_floors.append((missing - 1) / (reset_s + RESET_ROUNDING_S))
        ceiling = min(self._rate_bounds)
        floor = min(max(self._rate_floors), ceiling) if self._rate_floors else None
        rate = self._rate_per_s
        if floor is not None:
            rate = floor if rate is None else max(rate, floor)
        if rate is not None:
            self._rate_per_s = min(rate, ceiling)

    def _note_rtt(self, rtt_s: float) -> None:
        """Track the answers' round trip and how much it varies (mean absolute deviation)."""
        if self._rtt_s is None:
            self._rtt_s = rtt_s
            return
        self._rtt_jitter_s += (abs(rtt_s - self._rtt_s) - self._rtt_jitter_s) * RTT_SMOOTHING
        self._rtt_s += (rtt_s - self._rtt_s) * RTT_SMOOTHING

    def _refilled(self, level: float, from_s: float, to_s: float) -> float:
        if self._rate_per_s is None or to_s <= from_s:
            return level
        level += self._rate_per_s * (to_s - from_s)
        return min(level, self._capacity if self._capacity is not None else self._limit_floor)

    def _is_rejected(self, seq: int) -> bool:
        i = bisect.bisect_left(self._rejected, seq)
        return i < len(self._rejected) and self._rejected[i] == seq

    def _counted_between(self, first: int, last: int) -> int:
        """Requests in (first, last] the provider counted (429s excepted)."""
        rejected = bisect.bisect_right(self._rejected, last) - bisect.bisect_right(self._rejected, first)
        return last - first - rejected

    def _learn_rate(self, mark: _Mark) -> None:
        # marks are kept in admission order (answers come back in any order)
        marks = self._marks
        if mark.seq <= self._rejected_horizon:
            return  # the 429s around it are forgotten: it cannot be placed
        if not marks or mark.seq > marks[-1].seq:
            marks.append(mark)
        else:
            pos = bisect.bisect_left([m.seq for m in marks], mark.seq)
            if marks[pos].seq == mark.seq:
                return
            marks.insert(pos, mark)
        last = marks[-1]
        # a bucket that was full between two hints forgot what came before (the TAT only
        # moves forward while the bucket is not full); very old hints describe another limit
        while len(marks) > 1 and (
            marks[0].tat_s + RESET_ROUNDING_S <= last.admitted_s
            or last.admitted_s - marks[0].admitted_s > self.max_baseline_s
            or len(marks) > MAX_MARKS
        ):
            marks.popleft()
        first = marks[0]
        counted = self._counted_between(first.seq, last.seq)
        spread_s = last.tat_s - first.tat_s
        # a reset measured from the answer's arrival moves with the round trip: a spread that
        # is not long against the round trip's jitter says little
        if counted <= 0 or spread_s < max(self.min_baseline_s, JITTER_FACTOR * self._rtt_jitter_s):
            return
        rate_per_s = counted / spread_s
        elapsed_s = last.admitted_s - first.admitted_s
        refilled = last.remaining - first.remaining + counted
        if refilled >= MIN_REFILLED and elapsed_s >= self.min_baseline_s:
            # the same from `remaining` over the admissions' own times: independent of where
            # the reset is measured from (Anthropic's is a time of day, which the client turns
            # into a delay when the answer arrives, one round trip late); off by less than one
            # request. Taking the smaller errs towards waiting, which costs no rate (the level
            # comes from `remaining`) while a rate too high costs 429s.
            rate_per_s = min(rate_per_s, refilled / elapsed_s)
        self._rate_per_s = rate_per_s


class TokenBudget:
    """Mirror of a provider's token bucket (TPM), kept from the limit, remaining and reset of
    its answers' token budget.

    The caller numbers admissions as for `BudgetPacer`, passes each one's estimated cost in
    tokens (`admit(seq, cost, now_s)`), reports each answer's budget (`observe`), and asks
    `wait_s(cost, now_s)` before admitting a request of that cost: 0.0 means it fits now,
    with TOKEN_MARGIN of it to spare. A cost above the limit is taken as the limit (it goes
    when the bucket is full). An admission takes its cost from the mirror at once, which
    refills at the provider's rate, so a request whose answer never says what it cost (a
    timeout, a 5xx) holds nothing back for long. With no budget in the answers (no limit
    header, local servers), or no refill rate learnt yet, nothing is paced.
    """

    def __init__(self) -> None:
        self._limit: float | None = None
        self._rate_per_s: float | None = None
        self._level = 0.0  # tokens in the mirror at _level_s
        self._level_s = 0.0
        self._newest_seq = -1
        #: estimated costs of admissions after the newest applied hint, oldest first: the
        #: provider had not counted them when it answered (bounded: MAX_MARKS)
        self._pending: dict[int, float] = {}

    @property
    def active(self) -> bool:
        """True once an answer announced a token budget."""
        return self._limit is not None

    @property
    def rate_per_s(self) -> float | None:
        return self._rate_per_s

    def level(self, now_s: float) -> float | None:
        """Tokens the mirror holds at now_s (None: no budget known; negative: overspent)."""
        if self._limit is None:
            return None
        if self._rate_per_s is None or now_s <= self._level_s:
            return self._level
        return min(self._limit, self._level + self._rate_per_s * (now_s - self._level_s))

    def wait_s(self, cost: float, now_s: float) -> float:
        """Seconds until a request of `cost` tokens fits (0.0: now)."""
        level = self.level(now_s)
        if level is None or self._limit is None or not self._rate_per_s:
            return 0.0
        # a reserve of half the cost: an estimate too low by less than that still fits (the
        # bucket is paced at its edge, where any shortfall is a 429); like the request mirror's
        # margin, it costs no rate, only that reserve
        need = min(cost * (1.0 + TOKEN_MARGIN), self._limit)
        if level >= need - _EPSILON:
            return 0.0
        return (need - level) / self._rate_per_s

    def admit(self, seq: int, cost: float, now_s: float) -> None:
        """Request `seq` (numbered from 1, increasing), estimated at `cost` tokens, went out."""
        level = self.level(now_s)
        if level is None:
            return
        self._level, self._level_s = level - cost, now_s
        self._pending[seq] = cost
        if len(self._pending) > MAX_MARKS:
            del self._pending[next(iter(self._pending))]

    def forget(self, seq: int) -> None:
        """Request `seq` was never counted (a 429, or never sent): its cost comes back."""
        cost = self._pending.pop(seq, None)
        if cost is not None and self._limit is not None:
            self._level = min(self._limit, self._level + cost)

    def observe(
        self, hint: RateLimitHint | None, seq: int, admitted_s: float, *, rejected: bool = False
    ) -> bool:
        """Apply the token budget of request `seq`'s answer. True if applied.

        rejected: the answer was a 429, so the provider did not count the request. A hint older
        than the newest applied one is ignored (the newer one already counted more).
        """
        if rejected:
            self.forget(seq)
        if hint is None or hint.limit_tokens is None or hint.remaining_tokens is None:
            return False
        if seq <= self._newest_seq:
            return False
        limit = float(max(hint.limit_tokens, 1))
        remaining = float(min(max(hint.remaining_tokens, 0), limit))
        self._limit = limit
        reset_s = hint.reset_tokens_s
        if reset_s is not None and reset_s > 0 and remaining < limit:
            # headers round the reset (to milliseconds, or seconds): once a rate is known, a
            # reset too short for that rounding to be small does not replace it
            if self._rate_per_s is None or reset_s >= MIN_RATE_RESET_S:
                self._rate_per_s = (limit - remaining) / reset_s
        self._newest_seq = seq
        # `remaining` is the level just after the provider counted `seq` (about its admission
        # time); the admissions after it are taken again from there, at their estimates
        for pending_seq in [s for s in self._pending if s <= seq]:
            del self._pending[pending_seq]
        self._level = remaining - sum(self._pending.values())
        self._level_s = admitted_s
        return True
