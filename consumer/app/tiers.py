"""The tiers' part of the composition root: each tier's runtime with its deployments' provider
adapters, the HTTP clients they opened, and the fleet quotas their limiters share."""

from __future__ import annotations

import contextlib
from typing import Any

from consumer.providers.base import CompletionProvider
from consumer.providers.factory import build_provider, make_http_client
from consumer.runtime.evidence import RememberedEvidence
from consumer.runtime.quotas import FleetQuota
from consumer.runtime.stats import ServiceStats
from consumer.runtime.tiers import TierRuntime
from consumer.settings import TierFile

__all__ = ["build_tiers", "connection_name", "fleet_quotas", "open_tiers"]


async def open_tiers(
    stack: contextlib.AsyncExitStack,
    tier_file: TierFile,
    stats: ServiceStats,
    providers: dict[str, CompletionProvider] | None,
    remembered: RememberedEvidence,
    quotas: dict[str, FleetQuota],
) -> tuple[dict[str, TierRuntime], list[Any]]:
    """The tiers and the HTTP clients they opened, both closed with `stack`; the list is the
    one later parts add their own clients to (closed with it)."""
    clients: list[Any] = []
    stack.push_async_callback(_close_all, clients)
    tiers, tier_clients = await build_tiers(tier_file, stats, providers, remembered, quotas)
    clients.extend(tier_clients)
    for tier in tiers.values():
        for deployment in tier.deployments:
            stack.push_async_callback(deployment.provider.aclose)
    return tiers, clients


async def build_tiers(
    tier_file: TierFile,
    stats: ServiceStats,
    providers: dict[str, CompletionProvider] | None = None,
    remembered: RememberedEvidence | None = None,
    quotas: dict[str, FleetQuota] | None = None,
) -> tuple[dict[str, TierRuntime], list[Any]]:
    """One TierRuntime per configured tier; also returns the HTTP clients to close.

    `providers` replaces the HTTP adapters of the tiers it names, or of a tier's deployment
    by `TIER.DEPLOYMENT` (tests and benchmarks);
    `remembered`: the batching evidence earlier runs left (see `consumer.runtime.evidence`);
    `quotas`: the fleet quotas (`fleet_quotas`), handed to the limiters of the tiers naming them.
    A tier that cannot be built (ConfigError) closes the clients made so far before it raises.
    """
    tiers: dict[str, TierRuntime] = {}
    clients: list[Any] = []
    tenants = tier_file.tenant_policies()
    try:
        for name, config in tier_file.tiers.items():
            parts = []
            for dep_name, where, _weight, dep_config in config.deployment_configs(name):
                quota = quotas[dep_config.quota] if quotas and dep_config.quota is not None else None
                key = name if dep_name is None else f"{name}.{dep_name}"
                if providers and key in providers:
                    provider = providers[key]
                else:
                    client = make_http_client(dep_config, where, name=connection_name(name, dep_name))
                    clients.append(client)
                    provider = build_provider(where, dep_config, client)
                parts.append((provider, quota))
            configs = [c for *_, c in config.deployment_configs(name)]
            unverified = any(c.tls is not None and not c.tls.verify for c in configs)
            stats.tier(name).tls_unverified = int(unverified)
            tiers[name] = TierRuntime.build(
                name, config, parts[0][0], stats.tier(name), remembered, parts[0][1], deployments=parts,
                tenants=tenants,
            )
    except BaseException:
        for client in clients:
            await client.close()
        raise
    return tiers, clients


def connection_name(tier: str, deployment: str | None) -> str:
    """What a deployment's proxy and TLS errors call it: `tier small deployment eu`."""
    return f"tier {tier}" if deployment is None else f"tier {tier} deployment {deployment}"


def fleet_quotas(tier_file: TierFile) -> dict[str, FleetQuota]:
    """One `FleetQuota` per entry of the tier file's `quotas` (none without the section)."""
    return {name: FleetQuota(name, q.figures()) for name, q in (tier_file.quotas or {}).items()}


async def _close_all(clients: list[Any]) -> None:
    for client in clients:
        await client.close()
