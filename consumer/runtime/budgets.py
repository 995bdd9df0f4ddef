"""Tenants' daily budgets at run time: reservations of requests, leases on the group's board,
and the state the pipeline asks before it sends a tenant's work (`consumer.core.budgets`).

`TenantBudgets.reserve` is awaited once a request has its limiter slot and before it goes:
the estimate is held from this instance's leases, and when they do not hold it a new lease is
written to the board first. This instance's record is written one write at a time (a lease,
the periodic record, the final one), each holding every lease counted so far, so a later
write never drops an earlier lease from the board. The answer settles the reservation
(`settle`), a request not answered gives its estimate back (`release`).

The board is the group's one sharing edge (`consumer.kafka.board.GroupBoard`, on the
compacted budgets topic of one partition): this instance's record is its `BUDGETS_RECORD`.
Before the service admits anything, `start` reads every instance's latest record from the
board, so a restarted instance knows what the group spent today; from then on the records of
other instances are read as they come, and this instance's own is written with every lease,
every `publish_interval_s` and at stop (then with its unspent leases given back).

Without a board (`board=None`: one instance, nothing kept across a restart) leases are granted
at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from consumer.core.budgets import BudgetBook, Cost, Exhausted, LeaseWanted, Reservation
from consumer.core.completion import Usage
from consumer.core.cost import Pricing, cost_usd
from consumer.core.tenants import TenantPolicies
from consumer.kafka.board import GroupBoard
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = ["BUDGETS_RECORD", "TenantBudgets", "estimated_cost", "spend_of"]

#: the name of an instance's record on the board: its claims and spend today
BUDGETS_RECORD = "budgets"
#: a lease's record not read back from the board within this is logged (it is waited for still)
READ_BACK_WARN_S = 30.0

#: what a request's output is estimated at when it names no max_tokens (its estimate, and so
#: the bound on overspending, holds only for requests that do)
DEFAULT_OUTPUT_ESTIMATE_TOKENS = 1024


def estimated_cost(
    input_tokens: int, output_tokens: int | None, pricing: Pricing | None, *, offline: bool = False
) -> Cost:
    """A request's cost before it is sent: its prompt tokens and its `max_tokens` (else
    DEFAULT_OUTPUT_ESTIMATE_TOKENS) at `pricing` (offline at the batch price; no pricing: $0)."""
    output = output_tokens if output_tokens is not None else DEFAULT_OUTPUT_ESTIMATE_TOKENS
    return spend_of(Usage(input_tokens, output), pricing, offline=offline)


def spend_of(usage: Usage, pricing: Pricing | None, *, offline: bool = False) -> Cost:
    """What an answer's usage spends of a budget."""
    usd = cost_usd(usage, pricing, offline=offline) if pricing is not None else 0.0
    return Cost(usd, max(usage.input_tokens, 0) + max(usage.output_tokens, 0))


class TenantBudgets:
    """The budgeted accounts of one instance (`instance`: its key on the board)."""

    def __init__(
        self,
        policies: TenantPolicies,
        instance: str,
        board: GroupBoard | None = None,
        *,
        publish_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._book = BudgetBook(policies, instance, now_s=clock())
        self._board = board
        self._instance = instance
        self._publish_interval_s = publish_interval_s
        #: one board write at a time: each holds every lease counted before it
        self._writing = asyncio.Lock()
        #: the number of this instance's latest record (each write numbers its record)
        self._written = 0
        #: each other instance's latest record as read: its bytes and what they say
        self._read: dict[str, tuple[bytes, dict[str, Any]]] = {}
        self._task: asyncio.Task[None] | None = None
        #: set whenever budget may have come free (a new day, a settled estimate, another
        #: instance giving its leases back): held jobs look again
        self.freed = asyncio.Event()

    @property
    def book(self) -> BudgetBook:
        return self._book

    def budgeted(self, account: str) -> bool:
        return self._book.budgeted(account)

    def exhausted(self, account: str) -> bool:
        """True while the account's last estimate was refused and no budget came free since."""
        return self._book.exhausted(account, self._clock())

    async def reserve(self, account: str, estimate: Cost) -> Reservation | Exhausted:
        """Hold `estimate` for one request of the budgeted `account`, claiming a lease on the
        board first when this instance's leases do not hold it."""
        verdict = self._book.try_reserve(account, estimate, self._clock())
        if not isinstance(verdict, LeaseWanted):
            return verdict
        async with self._writing:  # one lease write at a time; the rest may fit in it
            verdict = self._book.try_reserve(account, estimate, self._clock())
            if isinstance(verdict, LeaseWanted):
                await self._claim(verdict)
                verdict = self._book.try_reserve(account, estimate, self._clock())
        if isinstance(verdict, LeaseWanted):  # the day ended meanwhile: try once more, leasing anew
            return await self.reserve(account, estimate)
        return verdict

    async def _claim(self, lease: LeaseWanted) -> None:
        """Record the lease on the board, then count what of it the budget allows (a lost
        write loses no spend). The caller holds `_writing`.

        The board's one partition orders every instance's claims: once this record is read
        back, every record written before it has been read too, and the lease is granted as far
        as the budget less everyone else's claims allows. A claim written after this one saw
        it first; one written before, this one sees now. So the granted leases never add up
        past the budget, whoever writes when."""
        if self._board is None:
            self._book.claimed(lease)
            return
        record = self._book.record(self._clock())
        entry = record["accounts"][lease.account]
        entry["claimed_usd"] = round(entry["claimed_usd"] + lease.amount.usd, 9)
        entry["claimed_tokens"] += lease.amount.tokens
        number = await self._publish(record)
        await self._read_back(number)
        self._observe_all()
        self._book.claimed(lease, arbitrated=True)

    async def _publish(self, record: dict[str, Any]) -> int:
        """Write this instance's record, numbered; the number once the broker has it. The
        caller holds `_writing`."""
        assert self._board is not None
        self._written += 1
        record["written"] = self._written
        await self._board.publish([(BUDGETS_RECORD, orjson.dumps(record))])
        return self._written

    async def _read_back(self, number: int) -> None:
        """Until the board shows this instance's record `number` (or a later one)."""
        assert self._board is not None
        version, warned = self._board.version, False
        while self._own_number() < number:
            seen = await self._board.wait_for_change(version, READ_BACK_WARN_S)
            if seen == version and not warned:
                warned = True
                log.warning("budgets: a lease is not read back from the board yet; its requests wait")
            version = seen

    def _own_number(self) -> int:
        assert self._board is not None
        for record in self._board.records():
            if record.instance == self._instance and record.name == BUDGETS_RECORD:
                written = _parsed(record.value).get("written")
                return written if isinstance(written, int) else 0
        return 0

    def settle(self, reservation: Reservation, actual: Cost) -> None:
        """The request was answered: `actual` spent, its estimate returned."""
        self._book.settle(reservation, actual)
        if actual.usd < reservation.estimate.usd or actual.tokens < reservation.estimate.tokens:
            self.freed.set()

    def release(self, reservation: Reservation) -> None:
        """The request was not answered: its estimate is returned."""
        self._book.release(reservation)
        self.freed.set()

    def exhausted_message(self, account: str) -> str:
        return self._book.exhausted_message(account, self._clock())

    def remaining(self, account: str) -> Cost:
        return self._book.remaining(account, self._clock())

    def spent(self, account: str) -> Cost:
        return self._book.spent(account, self._clock())

    def roll(self) -> bool:
        """Start a new UTC day when one began (True then; held jobs may go)."""
        rolled = self._book.roll(self._clock())
        if rolled:
            self.freed.set()
        return rolled

    # ------------------------------------------------------------------ the board
    async def start(self) -> None:
        """Read what every instance recorded today, then follow the board."""
        if self._board is None:
            return
        await self._board.start()
        self._observe_all()
        self._task = asyncio.create_task(self._follow(), name="promptbus-budgets")

    async def stop(self) -> None:
        """Give the unspent leases back (this instance's record shrinks to what it spent)."""
        if self._board is None:
            return
        await cancel_and_wait(self._task)
        self._task = None
        try:
            async with self._writing:
                await self._publish(self._book.record(self._clock(), final=True))
        except Exception as exc:  # a lost final write keeps the leases spent: never too low
            log.warning("budgets: the final record was not written (%s); its leases stay spent", exc)
        await self._board.stop()

    def _observe_all(self) -> None:
        """Every other instance's latest record, as the board shows it, into the book."""
        assert self._board is not None
        now_s = self._clock()
        for record in self._board.records():
            if record.name != BUDGETS_RECORD or record.instance == self._instance:
                continue
            known = self._read.get(record.instance)
            if known is None or known[0] is not record.value:
                known = self._read[record.instance] = (record.value, _parsed(record.value))
            self._book.observe(record.instance, known[1], now_s)

    async def _follow(self) -> None:
        """Read other instances' records as they come; write this one's now and then (its
        settled figures, for `promptbus stats` of other instances)."""
        assert self._board is not None
        next_publish_s = time.monotonic() + self._publish_interval_s
        version = self._board.version
        while True:
            wait_s = max(0.0, next_publish_s - time.monotonic())
            try:
                seen = await self._board.wait_for_change(version, wait_s)
                if seen != version:
                    version = seen
                    self._observe_all()
                    self.freed.set()
                if time.monotonic() >= next_publish_s:
                    next_publish_s = time.monotonic() + self._publish_interval_s
                    async with self._writing:
                        await self._publish(self._book.record(self._clock()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("budgets: the board could not be read or written (%s); trying again", exc)
                await asyncio.sleep(min(self._publish_interval_s, 1.0))


def _parsed(value: bytes) -> dict[str, Any]:
    """A board record's JSON object ({} for anything else: another tool wrote it)."""
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
