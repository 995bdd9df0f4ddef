"""Fleet quotas at run time: this instance's share of each quota of the tier file
(`FleetQuota`), and the part that splits the quotas over the group (`QuotaSharing`).

A `FleetQuota` is one `quotas.NAME`: the bucket of this instance's share
(`consumer.core.quota.QuotaBucket`), shared by every limiter whose tier names the quota. A
limiter asks it before each admission (`wait_s`), takes a request's cost from it (`reserve`)
and settles the cost when the request ends (`settle`); the limiters are woken when a
settlement gives capacity back or the share grows, and otherwise wake themselves by timer.
Limiters whose next request waits on the quota stand in its line and take turns, one request
each, so no tier naming the quota starves another.

`QuotaSharing` runs over the group's board (`consumer.kafka.board.GroupBoard`):

    1. at start it reads the board (what every instance, live or dead, last published);
    2. every `PUBLISH_INTERVAL_S` it publishes this instance's demand on each quota: its
       requests waiting and in flight on the tiers that name it;
    3. whenever the board changes (at least every interval) it splits each quota over the
       live instances (`consumer.core.quota.share_fractions`) and takes its own share; an
       instance whose record is older than the session timeout is dead and has no share;
    4. at stop it removes its record, so its share frees at once.

Every instance computes the split from the same records, its own record as the board shows
it, so the shares agree and add up to at most the quota. Until an instance reads its own first
record back from the board it keeps the floor: by then it has read everything published
before it, and the others read its record within a round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import orjson

from consumer.core.quota import (
    FLOOR_SHARE,
    QuotaBucket,
    QuotaCost,
    QuotaFigures,
    QuotaKind,
    Reservation,
    share_fractions,
)
from consumer.kafka.board import GroupBoard
from consumer.runtime.stats import QuotaStats, ServiceStats
from consumer.waits import cancel_and_wait

__all__ = ["PUBLISH_INTERVAL_S", "FleetQuota", "QuotaSharing", "QuotaUser"]

log = logging.getLogger(__name__)

#: how often an instance publishes its demand (its share follows the group's within about this)
PUBLISH_INTERVAL_S = 0.25
#: the board record (one per instance) that carries its demand on every quota
DEMAND_RECORD = "quota-demand"


class QuotaUser(Protocol):
    """What a quota knows of a limiter that takes from it."""

    @property
    def waiting(self) -> int: ...

    @property
    def inflight(self) -> int: ...

    def wake(self) -> None:
        """Admit the waiters that fit now (or set a timer for when they will)."""
        ...


class FleetQuota:
    """One quota of the tier file on this instance: its share as a bucket, the limiters that
    take from it, and what the group's split was last time (`split`: instance -> fraction)."""

    def __init__(
        self,
        name: str,
        figures: QuotaFigures,
        *,
        clock: Callable[[], float] = time.monotonic,
        floor_share: float = FLOOR_SHARE,
    ) -> None:
        self.name = name
        self.figures = figures
        self._clock = clock
        self._bucket = QuotaBucket(figures, fraction=floor_share, now_s=clock())
        self._users: list[QuotaUser] = []
        #: the limiters whose next request waits on this quota, in the order they came
        self._line: collections.deque[QuotaUser] = collections.deque()
        self.split: dict[str, float] = {}

    def attach(self, user: QuotaUser) -> None:
        """A limiter takes from this quota from now on (it counts in the demand)."""
        self._users.append(user)

    @property
    def fraction(self) -> float:
        """This instance's share of the quota."""
        return self._bucket.fraction

    @property
    def reserved_tokens(self) -> float:
        """Tokens reserved by this instance's requests in flight."""
        return self._bucket.reserved_tokens

    def demand(self) -> int:
        """Requests waiting and in flight on the limiters that take from this quota."""
        return sum(u.waiting + u.inflight for u in self._users)

    def share_per_minute(self) -> dict[QuotaKind, float]:
        return {kind: rate * 60.0 for kind, rate in self._bucket.rates_per_s().items()}

    def wait_s(self, cost: QuotaCost, now_s: float) -> float:
        return self._bucket.wait_s(cost, now_s)

    def reserve(self, cost: QuotaCost, now_s: float) -> Reservation:
        return self._bucket.reserve(cost, now_s)

    def settle(self, reservation: Reservation, used: QuotaCost, now_s: float) -> None:
        """A request ended: its cost settles to what it used; what comes back may admit
        the waiters of any limiter of this quota."""
        if self._bucket.settle(reservation, used, now_s):
            self._wake_users()

    def take_share(self, fraction: float, split: Mapping[str, float], now_s: float) -> None:
        """This instance's share is `fraction` from now on (`split`: every live instance's)."""
        grew = fraction > self._bucket.fraction
        self._bucket.set_fraction(fraction, now_s)
        self.split = dict(split)
        if grew:
            self._wake_users()

    def turn_of(self, user: QuotaUser) -> bool:
        """True when `user` may take from the quota now: nobody is in line, or it is first."""
        line = self._line
        while line and line[0] is not user and not line[0].waiting:
            line.popleft()  # nothing waits there any more
        return not line or line[0] is user

    def join(self, user: QuotaUser) -> None:
        """`user`'s next request waits on the quota: it stands in line (once)."""
        if user not in self._line:
            self._line.append(user)

    def leave(self, user: QuotaUser) -> None:
        """`user` waits on the quota no more (nothing to send, or it waits on something else)."""
        if user in self._line:
            was_first = self._line[0] is user
            self._line.remove(user)
            if was_first and self._line:
                _soon(self._line[0].wake)

    def served(self, user: QuotaUser) -> None:
        """`user` took from the quota: it goes to the back of the line when it waits again,
        and the next one in line looks now."""
        self.leave(user)

    def _wake_users(self) -> None:
        for user in self._users:
            user.wake()


def _soon(callback: Callable[[], None]) -> None:
    """Run `callback` on the next loop iteration (not inside the limiter that calls it)."""
    try:
        asyncio.get_running_loop().call_soon(callback)
    except RuntimeError:  # no running loop: nobody can be waiting either
        pass


class QuotaSharing:
    """The part that splits every quota over the live instances of the group (see the module
    docstring): publishes this instance's demand, reads everyone's, takes its share."""

    def __init__(
        self,
        board: GroupBoard,
        quotas: Mapping[str, FleetQuota],
        *,
        session_timeout_s: float,
        stats: ServiceStats | None = None,
        interval_s: float = PUBLISH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._board = board
        self._quotas = dict(quotas)
        self._session_timeout_s = session_timeout_s
        self._stats = stats
        self._interval_s = interval_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._board.start()
        await self._publish()
        self.rebalance()
        self._task = asyncio.create_task(self._loop(), name="promptbus-quota-sharing")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
            try:  # the others take this instance's share at once, not after the session timeout
                await self._board.publish([(DEMAND_RECORD, None)])
            except Exception as exc:
                log.warning("could not remove this instance's quota record: %s", exc)
        await self._board.stop()

    async def _loop(self) -> None:
        version = self._board.version
        next_publish_s = self._clock() + self._interval_s
        while True:
            version = await self._board.wait_for_change(version, max(0.0, next_publish_s - self._clock()))
            if self._clock() >= next_publish_s:
                next_publish_s = self._clock() + self._interval_s
                try:
                    await self._publish()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the share holds; the next round publishes again
                    log.warning("publishing this instance's quota demand failed: %s", exc)
            self.rebalance()

    async def _publish(self) -> None:
        demand = {name: quota.demand() for name, quota in self._quotas.items()}
        await self._board.publish([(DEMAND_RECORD, orjson.dumps({"demand": demand}))])

    def rebalance(self) -> None:
        """Split every quota over the live instances as the board shows them, and take this
        instance's share (the floor until its own record is on the board)."""
        demands = self._live_demands()
        me = self._board.instance
        now_s = self._clock()
        for name, quota in self._quotas.items():
            of_quota = demands.get(name, {})
            if me in of_quota:
                split = share_fractions(of_quota)
                quota.take_share(split[me], split, now_s)
            self._refresh_stats(quota, len(of_quota))

    def _live_demands(self) -> dict[str, dict[str, float]]:
        """quota -> instance -> demand, of the instances whose record is younger than the
        session timeout (a record that is not a demand record is left out)."""
        out: dict[str, dict[str, float]] = {}
        for record in self._board.records():
            if record.name != DEMAND_RECORD or record.age_s > self._session_timeout_s:
                continue
            try:
                demand = orjson.loads(record.value)["demand"]
                for name, value in demand.items():
                    out.setdefault(str(name), {})[record.instance] = float(value)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                log.debug("board record of %s is not a demand record; left out", record.instance)
        return out

    def _refresh_stats(self, quota: FleetQuota, live: int) -> None:
        if self._stats is None:
            return
        qs = self._stats.quotas.get(quota.name)
        if qs is None:
            qs = self._stats.quotas[quota.name] = QuotaStats(
                figures_per_minute={k.value: v for k, v in quota.figures.per_minute().items()}
            )
        qs.fraction = round(quota.fraction, 4)
        qs.share_per_minute = {k.value: round(v, 2) for k, v in quota.share_per_minute().items()}
        qs.demand = quota.demand()
        qs.reserved_tokens = round(quota.reserved_tokens, 1)
        qs.instances_live = live
