"""Fallback routing: a job of a tier in trouble moves to its fallback tier (`core/fallback.py`).

Two places ask: the pipeline, for each job it routes (`route_new`), and a plan runner, for
the members of a request its tier holds through an outage or that met an exhausted quota
(`move`, then `send` once the runner's plan has let them go). A job that moves keeps its
record, ticket, deadline and trace; it takes the new tier's options (merged under its own,
as admission merges them), output check and, for a job that named no mode or `auto`, the
new tier's way online or offline. Its result names the tier that answered and
`fallback_from` the one it asked for.

While a tier's circuit is open, its own held requests probe it; once they have all moved,
a new job goes to the tier as the probe whenever one is due (and one per probe wait), so the
tier is seen back when it is: then new jobs stay on it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from consumer.core.errors import JobError
from consumer.core.fallback import FallbackCause, FallbackRule, fallback_cause, fallback_tier
from consumer.core.output import output_format
from consumer.core.routing import DecidedMode
from consumer.runtime.context import JobContext
from consumer.runtime.tiers import TierRuntime

log = logging.getLogger(__name__)


class FallbackRouter:
    """Moves jobs down their tier's fallback chain. route: routes a moved job afresh (the
    pipeline's routing, which counts it on its new tier as one routed before)."""

    def __init__(
        self,
        tiers: Mapping[str, TierRuntime],
        route: Callable[[JobContext], None],
        clock: Callable[[], float],
    ) -> None:
        self._tiers = tiers
        self._rules: dict[str, FallbackRule | None] = {name: t.fallback for name, t in tiers.items()}
        self._route = route
        self._clock = clock
        #: per tier, when a new job last went to it as its circuit's probe
        self._probe_sent_s: dict[str, float] = {}

    @property
    def active(self) -> bool:
        """True when some tier has a fallback."""
        return any(self._rules.values())

    def target(self, ctx: JobContext, now_s: float) -> tuple[TierRuntime, FallbackCause] | None:
        """Where `ctx` is to go instead of its tier now, and why; None: it stays."""
        tier = ctx.tier
        rule = self._rules.get(tier.name)
        if rule is None or not ctx.fallback_allowed:
            return None
        cause = fallback_cause(rule, tier.condition(now_s))
        if cause is None:
            return None
        conditions = {name: t.condition(now_s) for name, t in self._tiers.items()}
        name = fallback_tier(
            tier.name, self._rules, conditions, accepts=lambda n: self._accepts(ctx, self._tiers[n], now_s)
        )
        return (self._tiers[name], cause) if name is not None else None

    def route_new(self, ctx: JobContext, now_s: float) -> None:
        """A job being routed: move it (in place) when its tier is in trouble, except the
        one that is to probe the tier's open circuit."""
        found = self.target(ctx, now_s)
        if found is None:
            return
        target, cause = found
        if cause is FallbackCause.OUTAGE and ctx.mode == "online" and self._probes(ctx.tier, now_s):
            return
        self._retarget(ctx, target, now_s)

    def move(self, ctx: JobContext, now_s: float) -> bool:
        """A held job (its request not sent): moved to the fallback tier (in place) when its
        tier is in trouble. True: it moved; the caller lets its request go, then `send`s it."""
        found = self.target(ctx, now_s)
        return found is not None and self._retarget(ctx, found[0], now_s)

    def send(self, ctx: JobContext) -> None:
        """Route a moved job on its new tier."""
        self._route(ctx)

    def wait_s(self, tier: TierRuntime, now_s: float) -> float | None:
        """Seconds until the tier's outage lasts long enough for its jobs to move (None:
        no such moment ahead)."""
        rule = self._rules.get(tier.name)
        if rule is None or FallbackCause.OUTAGE not in rule.on or not tier.circuit.open:
            return None
        return max(0.0, rule.after_s - tier.circuit.outage_s(now_s))

    # ------------------------------------------------------------------ inside
    def _probes(self, tier: TierRuntime, now_s: float) -> bool:
        """True when this job is to go to `tier` as its circuit's probe."""
        if not tier.circuit.probe_due(now_s):
            return False
        if now_s - self._probe_sent_s.get(tier.name, float("-inf")) < tier.circuit.probe_s:
            return False
        self._probe_sent_s[tier.name] = now_s
        return True

    def _mode_on(self, ctx: JobContext, tier: TierRuntime, now_s: float) -> str:
        if ctx.requested_mode in (None, "auto"):
            left = None if ctx.deadline_s is None else ctx.deadline_s - now_s
            return tier.modes.mode_for(ctx.requested_mode, left)
        return ctx.mode

    def _accepts(self, ctx: JobContext, tier: TierRuntime, now_s: float) -> bool:
        return self._mode_on(ctx, tier, now_s) == "online" or tier.config.offline.enabled

    def _retarget(self, ctx: JobContext, target: TierRuntime, now_s: float) -> bool:
        old = ctx.tier
        options = {**target.config.options, **ctx.parsed_job().options}
        try:
            wanted = output_format(options) if "response_format" in options else None
        except JobError:
            return False  # the tier's options do not combine with this job's: it stays
        if ctx.dedupe_key is not None and old.dedupe is not None:
            # the jobs waiting for this one's answer are routed afresh: each moves on its own
            followers = old.dedupe.abandon(ctx.dedupe_key)
            ctx.dedupe_key = None
        else:
            followers = []
        mode: DecidedMode = "offline" if self._mode_on(ctx, target, now_s) == "offline" else "online"
        ctx.tier, ctx.options, ctx.output_format, ctx.mode = target, options, wanted, mode
        ctx.fallback_from = ctx.requested_tier
        log.debug("job %s: tier %s -> fallback %s", ctx.id, old.name, target.name)
        for follower in followers:
            self._route(follower)
        return True
