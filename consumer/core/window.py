"""Collection windows: batch-eligible jobs wait briefly to share one request (DESIGN.md rules 2-4).

One window per `PackKey` (tier, prompt prefix, variable name, canonical options, mode).
The caller owns the clock: every call takes `now_s` (monotonic seconds) and returns the
windows to send as `Flush`es; nothing here sleeps or schedules.

A window flushes when
- it holds `max_items` items (reason "max_items");
- the next item would push its inputs past `max_input_chars` (the window goes first,
  reason "max_input_chars"); one input larger than `max_input_chars` on its own goes out
  alone right away, without disturbing the open window;
- `window_ms` passed since its last member arrived ("window"), but never later than
  `max_wait_ms` after its first member ("max_wait");
- the caller says no other job could still join it ("idle", DESIGN.md rule 3);
- on shutdown ("drain").

A flush of one item is an ordinary request (rule 5); the planner handles that.
Items of revoked partitions are pulled out with `drain_partitions`; the rest of a mixed
window stays and keeps its timers.

Windows are per tenant (the tenant is part of the `PackKey`), so a packed prompt never mixes
tenants; windows due at the same moment flush in fair order between their tenants
(`consumer.core.fairshare.fair_order`), so one tenant's many windows do not all go first.

`LaneWindows` keeps the windows of lanes (`consumer.core.lanes`) apart where sharing would
delay a job: a window holding a job of a lane with `max_wait_ms` flushes at most that long
after its first member (and waits at most that long for a next one). Jobs of different lanes
share a window, and so a packed prompt, only when their lanes flush by the same wait, so
neither waits longer than it would alone; the request then waits for its slot in the more
urgent lane (`consumer.core.lanes.pack_lane`), so the other is not delayed there either.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import orjson

from consumer.core.fairshare import fair_order
from consumer.core.lanes import Lane
from consumer.core.templates import BatchablePrompt
from consumer.core.tenants import DEFAULT_TENANT

__all__ = [
    "CollectionWindows",
    "Flush",
    "FlushReason",
    "LaneWindows",
    "PackKey",
    "WindowLimits",
    "options_key",
    "pack_key_for",
]

T = TypeVar("T")

FlushReason = Literal["max_items", "max_input_chars", "window", "max_wait", "idle", "drain"]


class PackKey(NamedTuple):
    """Jobs share a request only when all of these are equal (DESIGN.md rule 2), and only jobs
    of one tenant ever do (a model never sees one tenant's data beside another's).

    options_key is the canonical JSON (sorted keys) of the job's options. A NamedTuple: one
    is built per job and hashed several times, and a tuple does both in C.
    """

    tier: str
    prefix: str
    variable: str
    options_key: str
    mode: str
    tenant: str = DEFAULT_TENANT


def options_key(options: Mapping[str, Any]) -> str:
    """Canonical JSON of a job's options: equal options give equal keys whatever their order."""
    return orjson.dumps(options, option=orjson.OPT_SORT_KEYS).decode()


def pack_key_for(job: Any, batchable: BatchablePrompt) -> PackKey:
    """The batch key of a `consumer.core.jobs.Job` whose prompt split into `batchable`."""
    return PackKey(
        tier=job.tier,
        prefix=batchable.prefix,
        variable=batchable.variable,
        options_key=options_key(job.options),
        mode=job.mode or "online",
        tenant=job.tenant or DEFAULT_TENANT,
    )


@dataclass(frozen=True, slots=True)
class WindowLimits:
    """A tier's batching limits (`TierConfig.batching`)."""

    max_items: int
    max_input_chars: int
    window_ms: float
    max_wait_ms: float

    @classmethod
    def from_config(cls, batching: Any) -> WindowLimits:
        """From a `consumer.settings.BatchingConfig` (or anything with the same fields)."""
        return cls(batching.max_items, batching.max_input_chars, batching.window_ms, batching.max_wait_ms)


@dataclass(frozen=True, slots=True)
class Flush(Generic[T]):
    """Items to send together; `reason` says why the window closed."""

    key: PackKey
    items: tuple[T, ...]
    reason: FlushReason


@dataclass(slots=True)
class _Window(Generic[T]):
    limits: WindowLimits
    first_s: float
    last_s: float
    items: list[T] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)
    partitions: list[Hashable] = field(default_factory=list)
    total_chars: int = 0

    def due_at_s(self) -> float:
        limits = self.limits
        return min(self.last_s + limits.window_ms / 1000.0, self.first_s + limits.max_wait_ms / 1000.0)


class CollectionWindows(Generic[T]):
    """Open collection windows by batch key, generic over the caller's item type."""

    def __init__(self) -> None:
        self._windows: dict[PackKey, _Window[T]] = {}
        self._count = 0

    def __len__(self) -> int:
        """Items held in open windows."""
        return self._count

    def keys(self) -> list[PackKey]:
        """Keys of the open windows."""
        return list(self._windows)

    def _close(self, key: PackKey, reason: FlushReason) -> Flush[T]:
        window = self._windows.pop(key)
        self._count -= len(window.items)
        return Flush(key, tuple(window.items), reason)

    def add(
        self,
        key: PackKey,
        item: T,
        input_chars: int,
        partition: Hashable,
        limits: WindowLimits,
        now_s: float,
    ) -> list[Flush[T]]:
        """Put `item` in its window; return the flushes this causes (possibly none).

        `limits` applies to the window this item opens; a window keeps the limits it was
        opened with.
        """
        if input_chars > limits.max_input_chars:
            # Too big to share: it goes alone now and leaves the open window alone.
            return [Flush(key, (item,), "max_input_chars")]
        flushes: list[Flush[T]] = []
        window = self._windows.get(key)
        if window is not None and window.total_chars + input_chars > window.limits.max_input_chars:
            flushes.append(self._close(key, "max_input_chars"))
            window = None
        if window is None:
            window = _Window(limits=limits, first_s=now_s, last_s=now_s)
            self._windows[key] = window
        window.items.append(item)
        window.chars.append(input_chars)
        window.partitions.append(partition)
        window.total_chars += input_chars
        window.last_s = now_s
        self._count += 1
        if len(window.items) >= window.limits.max_items:
            flushes.append(self._close(key, "max_items"))
        return flushes

    def due(self, now_s: float, *, can_still_join: Callable[[PackKey], bool]) -> list[Flush[T]]:
        """Close and return the windows due at `now_s`.

        A window is due when `window_ms` passed since its last member, when `max_wait_ms`
        passed since its first, or when `can_still_join(key)` is False: the caller has
        nothing fetched and unrouted that could join it (rule 3).
        """
        closing: list[tuple[PackKey, FlushReason]] = []
        for key, window in self._windows.items():
            if now_s >= window.first_s + window.limits.max_wait_ms / 1000.0:
                closing.append((key, "max_wait"))
            elif now_s >= window.last_s + window.limits.window_ms / 1000.0:
                closing.append((key, "window"))
            elif not can_still_join(key):
                closing.append((key, "idle"))
        return [self._close(key, reason) for key, reason in closing]

    def next_deadline_s(self) -> float | None:
        """The earliest time a window becomes due by time alone, or None without windows."""
        if not self._windows:
            return None
        return min(w.due_at_s() for w in self._windows.values())

    def drain_partitions(self, partitions: Collection[Hashable]) -> list[T]:
        """Remove and return the items read from `partitions` (revoked); others stay."""
        wanted = set(partitions)
        drained: list[T] = []
        for key in list(self._windows):
            window = self._windows[key]
            if not wanted.intersection(window.partitions):
                continue
            keep = [i for i, p in enumerate(window.partitions) if p not in wanted]
            drained.extend(window.items[i] for i, p in enumerate(window.partitions) if p in wanted)
            self._count -= len(window.items) - len(keep)
            if not keep:
                del self._windows[key]
                continue
            window.items = [window.items[i] for i in keep]
            window.chars = [window.chars[i] for i in keep]
            window.partitions = [window.partitions[i] for i in keep]
            window.total_chars = sum(window.chars)
        return drained

    def drain_all(self) -> list[Flush[T]]:
        """Close every window (shutdown): reason "drain"."""
        return [self._close(key, "drain") for key in list(self._windows)]


def _tenant_of(flush: Flush[Any]) -> str:
    return flush.key.tenant


class LaneWindows(Generic[T]):
    """Collection windows apart by lane wait (`Lane.max_wait_ms`): the same interface as
    `CollectionWindows`, with each item's lane. `weight_of`: a tenant's fair-share weight,
    the order of windows due together."""

    def __init__(self, weight_of: Callable[[str], float] = lambda _tenant: 1.0) -> None:
        self._weight_of = weight_of
        self._by_wait: dict[float | None, CollectionWindows[T]] = {}
        #: a tier's limits capped by a lane's wait, made once per (limits, wait)
        self._capped: dict[tuple[WindowLimits, float], WindowLimits] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_wait.values())

    def add(
        self,
        key: PackKey,
        item: T,
        lane: Lane | None,
        input_chars: int,
        partition: Hashable,
        limits: WindowLimits,
        now_s: float,
    ) -> list[Flush[T]]:
        """Put `item` in the window of its key among its lane wait's windows (see
        `CollectionWindows.add`); a lane's max_wait_ms caps the tier's waits."""
        wait_ms = lane.max_wait_ms if lane is not None else None
        windows = self._by_wait.get(wait_ms)
        if windows is None:
            windows = self._by_wait[wait_ms] = CollectionWindows()
        if wait_ms is not None and wait_ms < limits.max_wait_ms:
            capped = self._capped.get((limits, wait_ms))
            if capped is None:
                capped = replace(limits, max_wait_ms=wait_ms, window_ms=min(limits.window_ms, wait_ms))
                self._capped[(limits, wait_ms)] = capped
            limits = capped
        return windows.add(key, item, input_chars, partition, limits, now_s)

    def due(self, now_s: float, *, can_still_join: Callable[[PackKey], bool]) -> list[Flush[T]]:
        """The windows due at `now_s` (`CollectionWindows.due`), in fair order between tenants."""
        due = [f for w in self._by_wait.values() for f in w.due(now_s, can_still_join=can_still_join)]
        return fair_order(due, _tenant_of, self._weight_of) if len(due) > 1 else due

    def next_deadline_s(self) -> float | None:
        """The earliest time a window becomes due by time alone, or None without windows."""
        due = [d for w in self._by_wait.values() if (d := w.next_deadline_s()) is not None]
        return min(due) if due else None

    def drain_partitions(self, partitions: Collection[Hashable]) -> list[T]:
        """Remove and return the items read from `partitions` (revoked); others stay."""
        return [i for w in self._by_wait.values() for i in w.drain_partitions(partitions)]

    def drain_all(self) -> list[Flush[T]]:
        """Close every window (shutdown)."""
        return [f for w in self._by_wait.values() for f in w.drain_all()]
