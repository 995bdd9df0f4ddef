"""The open circuits' own timer (`CircuitProber`), a part of the service.

A deployment's circuit opened by connections refused (`CircuitBreaker.listing_probes`) is
probed with the provider's model listing, the cheap request the start-time reachability check
sends, once the circuit's probe wait is over; an answer closes it at once, so a deployment (or
a whole tier) that recovered takes its work back before the next job arrives, not on a probe
some held or new job carries. A circuit opened by errors the server itself answered (5xx,
overloaded, timeouts) says the listing may answer while completions fail: it is still probed
by one held request, as `consumer.core.circuit` says. So is one whose listing the server
answers with an error of its own (no listing there, or not for this key): the failed probe
records that error, and the circuit is no longer probed by its listing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from consumer.core.circuit import Admit
from consumer.core.errors import ConnectionFailed, ProviderError
from consumer.runtime.deployments import Deployment
from consumer.runtime.tiers import TierRuntime
from consumer.waits import cancel_and_wait

log = logging.getLogger(__name__)

#: a listing that has not answered by then is a failed probe
PROBE_TIMEOUT_S = 10.0
#: how often the prober looks while no circuit it probes is open
IDLE_LOOK_S = 0.25


class CircuitProber:
    """The part that probes the listing-probed open circuits of every tier's deployments on
    their own timer (see the module docstring). `clock` is the circuits' clock."""

    def __init__(self, tiers: Mapping[str, TierRuntime], clock: Callable[[], float]) -> None:
        self._tiers = tiers
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="promptbus-circuit-prober")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            now_s = self._clock()
            next_s = IDLE_LOOK_S
            probes = []
            for tier in self._tiers.values():
                for deployment in tier.deployments:
                    circuit = deployment.circuit
                    if not (circuit.open and circuit.listing_probes):
                        continue
                    wait_s = circuit.probe_wait_s(now_s)
                    if wait_s <= 0 and circuit.admit(now_s)[0] is Admit.PROBE:
                        probes.append(self.probe(tier, deployment))
                    else:
                        next_s = min(next_s, max(wait_s, 0.01))
            if probes:
                await asyncio.gather(*probes)
                continue
            await asyncio.sleep(next_s)

    async def probe(self, tier: TierRuntime, deployment: Deployment) -> None:
        """One listing probe of `deployment`'s circuit (granted to the caller as its probe)."""
        deployment.stats.listing_probes += 1
        tier.stats.circuit_probes += 1
        try:
            async with asyncio.timeout(min(PROBE_TIMEOUT_S, deployment.config.timeout_s)):
                await deployment.provider.check_reachable()
        except (ProviderError, TimeoutError, OSError) as exc:
            error = exc if isinstance(exc, ProviderError) else ConnectionFailed(f"listing: {exc!r}")
            deployment.circuit.on_outage(error, self._clock(), probe=True)
            return
        except Exception:
            log.exception("probing %s raised unexpectedly", deployment.where(tier.name))
            deployment.circuit.probe_abandoned()
            return
        change = deployment.circuit.on_answer(self._clock())
        if change is not None:
            log.info(
                "%s: provider at %s answers again (its model listing) after %.1f s; circuit closed",
                deployment.where(tier.name), deployment.config.resolved_base_url, change.outage_s,
            )
            tier.circuit_changed()
