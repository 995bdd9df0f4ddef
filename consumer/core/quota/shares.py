"""How the live instances of a group split one quota: a small floor each, the rest in proportion
to their demand.

Every instance computes the same split from the same records (each instance's demand, read
from the group's board), so nobody hands out shares: each takes its own. The split is a
fraction of the quota per instance, the same for every figure of the quota, and the fractions
add up to at most 1:

    floor        = min(floor_share, 1 / n)          (n live instances)
    fraction_i   = floor + (1 - n * floor) * demand_i / sum(demand)

With no demand anywhere the rest is split equally. The floor lets an idle instance start (its
first requests go at once, and its demand shows on the board by the next round); it is small
so that idle instances hold little of what busy ones could use.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["FLOOR_SHARE", "share_fractions"]

#: the fraction of a quota every live instance keeps whatever its demand (at most an equal split)
FLOOR_SHARE = 0.01


def share_fractions(demands: Mapping[str, float], *, floor_share: float = FLOOR_SHARE) -> dict[str, float]:
    """Each live instance's fraction of the quota, from its demand (requests waiting and in
    flight for the quota's tiers; a negative demand counts as none)."""
    n = len(demands)
    if n == 0:
        return {}
    floor = min(max(floor_share, 0.0), 1.0 / n)
    rest = max(0.0, 1.0 - n * floor)
    total = sum(max(d, 0.0) for d in demands.values())
    if total <= 0.0:
        return dict.fromkeys(demands, floor + rest / n)
    # the ratio first: it is at most 1, so no share rounds above floor + rest (with subnormal
    # demands, rest * d rounds up to d and would not)
    return {name: floor + rest * (max(d, 0.0) / total) for name, d in demands.items()}
