"""Which way a job goes: online, or offline through the provider's Batch API (`mode`).

A job names `online`, `offline` or `auto`, or nothing (then the tier's `default_mode`).
`auto` goes offline when the tier allows offline and the job's deadline, if it has one,
leaves at least the Batch API's completion window plus the tier's `offline.auto_margin`
(the batch may take its whole window, and its results still have to be read back);
otherwise it goes online. A job without a deadline can always wait, so `auto` sends it
offline wherever the tier allows it. Pure: the caller gives the time left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DecidedMode", "ModePolicy", "parse_duration_s"]

DecidedMode = Literal["online", "offline"]

_UNITS_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration_s(text: str) -> float:
    """Seconds of a duration such as `24h`, `90m`, `1h30m` or `45s`; ValueError otherwise."""
    compact = text.strip().lower()
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration like 24h, 90m or 1h30m: {text!r}")
    return sum(float(n) * _UNITS_S[u] for n, u in parts)


@dataclass(frozen=True, slots=True)
class ModePolicy:
    """One tier's mode rules. offline_allowed: the tier enables offline and it runs."""

    default_mode: Literal["online", "offline", "auto"] = "online"
    offline_allowed: bool = False
    completion_window_s: float = 86400.0
    auto_margin_s: float = 3600.0

    @property
    def auto_needs_s(self) -> float:
        """The least time before its deadline an `auto` job needs to go offline."""
        return self.completion_window_s + self.auto_margin_s

    def mode_for(self, requested: str | None, deadline_left_s: float | None) -> DecidedMode:
        """The way a job goes. requested: the job's `mode` (None: the tier's default);
        deadline_left_s: seconds until its deadline (None: it has none). An explicit
        `offline` is returned as asked: whether the tier allows it is admission's check."""
        mode = requested or self.default_mode
        if mode == "online":
            return "online"
        if mode == "offline":
            return "offline"
        if not self.offline_allowed:
            return "online"
        if deadline_left_s is not None and deadline_left_s < self.auto_needs_s:
            return "online"
        return "offline"
