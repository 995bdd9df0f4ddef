"""One check per tier at start: can its provider be reached at all?

The check costs nothing (a models listing) and never delays the start: it runs beside the
service, and a provider that cannot be reached is one WARNING naming the tier and the URL.
Jobs for that tier are still taken; what happens to them while the provider is down is the
tier's retry policy's business.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from consumer.core.errors import ProviderError
from consumer.providers.base import CompletionProvider

log = logging.getLogger(__name__)

#: a provider that has not answered the listing by then counts as unreachable
CHECK_TIMEOUT_S = 10.0


class ReachabilityCheck:
    """`check_tier_providers` as a part of the service: started beside it, cancelled at stop
    when it has not ended by then."""

    def __init__(self, providers: Mapping[str, CompletionProvider], base_urls: Mapping[str, str]) -> None:
        self._providers = providers
        self._base_urls = base_urls
        self._task: asyncio.Task[Any] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(check_tier_providers(self._providers, self._base_urls))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def check_tier_providers(
    providers: Mapping[str, CompletionProvider], base_urls: Mapping[str, str]
) -> dict[str, str | None]:
    """Check every tier's provider at once; returns tier -> None (reachable) or the reason."""
    names = list(providers)
    found = await asyncio.gather(*(_check(providers[n], base_urls.get(n, "?")) for n in names))
    outcome = dict(zip(names, found, strict=True))
    for name in names:
        reason = outcome[name]
        if reason is not None:
            url = base_urls.get(name, "?")
            log.warning("tier %s: provider at %s cannot be reached: %s", name, url, reason)
        else:
            log.info("tier %s: provider at %s is reachable", name, base_urls.get(name, "?"))
    return outcome


async def _check(provider: CompletionProvider, base_url: str) -> str | None:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await provider.check_reachable()
    except ProviderError as exc:
        return exc.message
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:.0f} s"
    return None
