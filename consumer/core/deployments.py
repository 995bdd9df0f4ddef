"""Which of a tier's deployments takes the next request (pure).

A tier's requests wait in one queue (its lane scheduler); when the one whose turn it is may
go, it goes to one deployment of the tier, chosen here from what each can take now (`Room`):

- a deployment whose circuit is open never takes a request (its probe is not chosen here);
- nor one that has no room now: no free concurrency slot, its pacing (the mirror of the
  provider's budget), pause or quota says wait;
- of the others, the one with the most headroom: the requests it could take now, the
  smaller of its free slots and the requests its paced budget holds;
- equal headroom: the one furthest behind its `weight`'s share of the requests chosen so
  far (fewest chosen per unit of weight, counting half a request more; then the first), so
  when nothing else says more, the weights set the shares: over many choices each
  deployment's count stays within a request per deployment of its weight's share.

`choose_deployment` is a few comparisons per deployment, and the call path asks it only for
a tier of more than one deployment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_DEPLOYMENT", "Room", "choose_deployment"]

#: what metrics and stats call a tier's own one deployment (a tier without `deployments`)
DEFAULT_DEPLOYMENT = "default"


@dataclass(frozen=True, slots=True)
class Room:
    """What one deployment can take now.

    up: its circuit is closed; ready: its pacing, pause and quota admit a request now;
    free_slots: its concurrency limit minus its requests in flight; budget: the requests
    its paced budget holds now (None: not paced, unknown); weight: its configured weight
    (> 0); chosen: the requests it was given so far.
    """

    up: bool
    ready: bool
    free_slots: int
    budget: float | None
    weight: float
    chosen: int

    @property
    def headroom(self) -> int:
        """The requests it could take now: free slots, capped by its paced budget."""
        if self.budget is None:
            return self.free_slots
        return min(self.free_slots, max(0, math.floor(self.budget)))


def choose_deployment(rooms: Sequence[Room]) -> int | None:
    """The index of the deployment to take the next request; None: none has room now."""
    best: int | None = None
    best_headroom = 0
    best_behind = 0.0
    for index, room in enumerate(rooms):
        if not room.up or not room.ready or room.free_slots <= 0:
            continue
        headroom = room.headroom
        # Sainte-Lague's divisor: the unbiased one of the divisor methods of apportionment
        behind = (room.chosen + 0.5) / room.weight
        if best is None or headroom > best_headroom or (headroom == best_headroom and behind < best_behind):
            best, best_headroom, best_behind = index, headroom, behind
    return best
