"""Fleet quotas: one API key's per-minute figures shared by every instance of a group.

    figures.py  `QuotaFigures` (requests, tokens, input and output tokens per minute),
                `QuotaKind`, `QuotaCost` (what a request reserves, and what it used)
    shares.py   `share_fractions`: each live instance's fraction of a quota, by demand
    bucket.py   `QuotaBucket`: this instance's fraction as one token bucket per figure

Pure: the runtime (`consumer.runtime.quotas`) reads the group's demands from its board,
hands each instance's limiters its bucket, and performs what these decide.
"""

from consumer.core.quota.bucket import BURST_S, QuotaBucket, Reservation
from consumer.core.quota.figures import NOTHING_USED, QuotaCost, QuotaFigures, QuotaKind
from consumer.core.quota.shares import FLOOR_SHARE, share_fractions

__all__ = [
    "BURST_S",
    "FLOOR_SHARE",
    "NOTHING_USED",
    "QuotaBucket",
    "QuotaCost",
    "QuotaFigures",
    "QuotaKind",
    "Reservation",
    "share_fractions",
]
