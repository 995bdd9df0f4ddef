"""Weighted fair share between tenants: who goes next among the items waiting in one queue.

`FairQueue` holds waiting items by flow (a tenant) and hands out the next one by start-time
fair queuing (Goyal, Vin and Cheng's SFQ):

1. every flow carries a virtual tag: the weighted service it has had (each item handed out
   adds `1 / weight` to its flow's tag);
2. the next item comes from the flow with work waiting whose tag is the lowest (equal tags:
   the flow that became active first), so over any span the flows with work get items in
   proportion to their weights, and one flow's backlog never goes ahead of another's;
3. a flow that was idle banks no credit: when it has work again its tag is raised to the
   queue's virtual time (the tag of the last item handed out), so it competes from now on,
   and it goes after at most one item of each flow whose tag equals that time;
4. within a flow, the item whose deadline is nearest goes first (no deadline: after every
   item with one); equal deadlines go first come, first served.

Pure: no clock is needed (the order depends only on what was handed out); nothing here
sleeps or schedules. A flow is named by a string; `weight_of(name)` says its weight (> 0).
An empty flow whose tag the virtual time has passed is forgotten, so flows of tenants seen once
cost nothing later.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["FairQueue", "fair_order"]

T = TypeVar("T")

#: idle flows remembered (they were served ahead of the virtual time) before a sweep forgets
#: those the virtual time has passed since
_IDLE_FLOWS_KEPT = 64


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    flow: _Flow[T]
    alive: bool = True


#: a flow's heap holds (deadline, sequence number, entry): tuples compare in C, and the
#: sequence numbers are unique, so entries themselves are never compared
_Queued = tuple[float, int, _Entry[T]]


@dataclass(slots=True)
class _Flow(Generic[T]):
    name: str
    weight: float
    #: the weighted service so far: where this flow's next item starts in virtual time
    tag: float = 0.0
    #: when the flow last became active (ties of equal tags go to the earlier one)
    since: int = 0
    heap: list[_Queued[T]] = field(default_factory=list)
    live: int = 0
    active: bool = False

    def head(self) -> _Entry[T]:
        while not self.heap[0][2].alive:
            heapq.heappop(self.heap)
        return self.heap[0][2]


class FairQueue(Generic[T]):
    """Waiting items by flow; `pop` hands out the next one by the rules of this module.

    Items are told apart by identity (an item is queued at most once at a time).
    """

    def __init__(self, weight_of: Callable[[str], float] = lambda _name: 1.0) -> None:
        self._weight_of = weight_of
        self._flows: dict[str, _Flow[T]] = {}
        #: the flows with work waiting (few: one per tenant with work), scanned for the lowest tag
        self._active: list[_Flow[T]] = []
        self._entries: dict[int, _Entry[T]] = {}
        self._vtime = 0.0
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def waiting(self, flow: str) -> int:
        """Items of `flow` waiting."""
        found = self._flows.get(flow)
        return found.live if found is not None else 0

    def flows(self) -> list[str]:
        """The flows with work waiting."""
        return [f.name for f in self._active if f.live > 0]

    def push(self, item: T, flow: str, deadline_s: float | None = None) -> None:
        """Queue `item` in `flow`, ordered within it by `deadline_s` (None: no deadline)."""
        found = self._flows.get(flow)
        if found is None:
            found = self._flows[flow] = _Flow(flow, self._weight_of(flow), self._vtime)
        self._seq += 1
        if not found.active:
            found.active = True
            found.tag = max(found.tag, self._vtime)  # an idle flow banks no credit
            found.since = self._seq
            self._active.append(found)
        entry = _Entry(item, found)
        heapq.heappush(found.heap, (math.inf if deadline_s is None else deadline_s, self._seq, entry))
        found.live += 1
        self._entries[id(item)] = entry

    def discard(self, item: T) -> bool:
        """Forget a waiting item; False when it is not waiting."""
        entry = self._entries.pop(id(item), None)
        if entry is None:
            return False
        entry.alive = False
        entry.flow.live -= 1
        return True

    def peek(self) -> T | None:
        """The item `pop` would hand out, left waiting (None: nothing waits)."""
        flow = self._next_flow()
        return flow.head().item if flow is not None else None

    def pop(self) -> T | None:
        """Hand out the next item and count it to its flow (None: nothing waits)."""
        flow = self._next_flow()
        if flow is None:
            return None
        entry = flow.head()
        heapq.heappop(flow.heap)
        flow.live -= 1
        del self._entries[id(entry.item)]
        self._vtime = flow.tag  # the start tag of the item now in service
        flow.tag += 1.0 / flow.weight
        if len(self._flows) > len(self._active) + _IDLE_FLOWS_KEPT:
            self._forget_idle()
        return entry.item

    def remove_where(self, matches: Callable[[T], bool]) -> list[T]:
        """Remove and return the waiting items `matches` selects, in no particular order."""
        removed = [entry.item for entry in self._entries.values() if matches(entry.item)]
        for item in removed:
            self.discard(item)
        return removed

    def _next_flow(self) -> _Flow[T] | None:
        """The active flow with the lowest tag (ties: the earlier active); flows that ran dry
        leave the active list (and the queue, once the virtual time has passed their tag)."""
        best: _Flow[T] | None = None
        dry = False
        for flow in self._active:
            if flow.live <= 0:
                dry = True
                continue
            if best is None or flow.tag < best.tag or (flow.tag == best.tag and flow.since < best.since):
                best = flow
        if dry:
            self._retire_dry()
        return best

    def _retire_dry(self) -> None:
        kept = 0  # compacted in place: this runs whenever a flow runs dry
        for flow in self._active:
            if flow.live > 0:
                self._active[kept] = flow
                kept += 1
                continue
            flow.active = False
            flow.heap.clear()
            if flow.tag <= self._vtime:  # nothing to remember: it would start at the virtual time
                del self._flows[flow.name]
        del self._active[kept:]

    def _forget_idle(self) -> None:
        """Forget the idle flows the virtual time has passed: they would start at it anyway."""
        vtime = self._vtime
        for name in [n for n, f in self._flows.items() if not f.active and f.tag <= vtime]:
            del self._flows[name]


def fair_order(items: Iterable[T], flow_of: Callable[[T], str], weight_of: Callable[[str], float]) -> list[T]:
    """`items` in the order a fresh `FairQueue` hands them out (each flow's items in their
    given order): e.g. windows due at the same moment, so one tenant's many go interleaved
    with another's few rather than all first."""
    items = list(items)
    if len({flow_of(item) for item in items}) <= 1:
        return items
    queue: FairQueue[T] = FairQueue(weight_of)
    for item in items:
        queue.push(item, flow_of(item))
    return [item for item in iter(queue.pop, None) if item is not None]
