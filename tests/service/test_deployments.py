"""A tier with several deployments, on the in-memory Kafka edges and on the real broker: the
requests spread over them by weight when nothing else tells them apart, results name the
deployment that answered, a deployment that refuses connections is given nothing while its
circuit is open (no job dead-lettered, no attempt spent), and its own listing probe brings it
back before the next job arrives."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from consumer.core.completion import CompletionRequest
from consumer.core.errors import ConnectionFailed, QuotaExhausted
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime.provider_calls import open_circuit_route
from consumer.settings.tiers import FallbackConfig
from consumer.testing.harness import job, tier_file_dict

RETRY = {
    "max_attempts": 3, "backoff_initial_s": 0.01, "backoff_max_s": 0.05, "circuit_failures": 2,
    "circuit_probe_s": 0.1, "circuit_probe_max_s": 0.2,
}


def _tiers(weights: dict[str, float]) -> dict[str, Any]:
    tiers = tier_file_dict("http://127.0.0.1:9/v1", batching=False, retry=RETRY)
    small = tiers["tiers"]["small"]
    small["limiter"] = {"algorithm": "fixed", "initial": 4, "min": 1, "max": 4}
    small["deployments"] = [
        {"name": name, "base_url": f"http://127.0.0.{i + 2}:9/v1", "weight": w}
        for i, (name, w) in enumerate(weights.items())
    ]
    return tiers


class _Endpoint:
    """A fake deployment: answers each request, or refuses connections while `down`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.down = False
        self.out_of_quota = False
        self.provider = FakeProvider(self._answer, name="openai_compat")

    def _answer(self, request: CompletionRequest) -> Any:
        if self.down:
            return ConnectionFailed(f"{self.name}: connection refused")
        if self.out_of_quota:
            return QuotaExhausted(f"{self.name}: insufficient_quota", status_code=429)
        return text_completion("ok " + request.messages[-1].content[-6:])

    def set_down(self, down: bool) -> None:
        self.down = down
        self.provider.unreachable = ConnectionFailed(f"{self.name}: connection refused") if down else None


def _by_deployment(results: dict[str, list[dict[str, Any]]], ids: set[str]) -> Counter[str]:
    return Counter(rs[0]["deployment"] for jid, rs in results.items() if jid in ids)


async def test_requests_spread_over_the_deployments_by_weight_and_results_name_them(
    make_bus: Callable[..., Any],
) -> None:
    endpoints = {name: _Endpoint(name) for name in ("a", "b", "c")}
    bus = make_bus(partitions=2)
    jobs = [job(i, batch=False) for i in range(400)]
    providers = {f"small.{name}": e.provider for name, e in endpoints.items()}
    async with bus.service(_tiers({"a": 1, "b": 1, "c": 2}), providers=providers) as service:
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        stats = service.stats_snapshot()
    assert not outcomes.dead
    counts = _by_deployment(outcomes.results, {j["id"] for j in jobs})
    assert sum(counts.values()) == len(jobs)
    assert counts == Counter({n: len(e.provider.requests) for n, e in endpoints.items()})
    # fakes answer at once: headroom is alike, so the weights set the shares (1:1:2)
    assert 0.15 <= counts["a"] / len(jobs) <= 0.35 and 0.15 <= counts["b"] / len(jobs) <= 0.35
    assert 0.4 <= counts["c"] / len(jobs) <= 0.6, counts
    deployments = stats["deployments"]
    assert {k: v["provider_requests"] for k, v in deployments.items()} == {
        f"small/{n}": c for n, c in counts.items()
    }


async def test_a_deployment_that_refuses_connections_gets_nothing_and_its_listing_brings_it_back(
    make_bus: Callable[..., Any],
) -> None:
    endpoints = {name: _Endpoint(name) for name in ("a", "b")}
    endpoints["b"].set_down(True)
    bus = make_bus(partitions=2)
    providers = {f"small.{name}": e.provider for name, e in endpoints.items()}
    first = [job(i, batch=False) for i in range(200)]
    second = [job(1000 + i, batch=False) for i in range(200)]
    async with bus.service(_tiers({"a": 1, "b": 1}), providers=providers) as service:
        await bus.produce(first)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in first}, timeout_s=60)
        during = service.stats_snapshot()["deployments"]
        refused = len(endpoints["b"].provider.requests)
        endpoints["b"].set_down(False)
        for _ in range(200):  # bounded: until b's own listing probe closed its circuit
            if not service.stats_snapshot()["deployments"]["small/b"]["circuit_open"]:
                break
            await asyncio.sleep(0.05)
        closed_at_checks = len(endpoints["b"].provider.checked_at)
        await bus.produce(second)  # produced only after b is back: no job carried its probe
        later = await bus.wait_for_outcomes({j["id"] for j in second}, timeout_s=60)
    assert not outcomes.dead and not later.dead
    first_counts = _by_deployment(outcomes.results, {j["id"] for j in first})
    assert first_counts == Counter({"a": len(first)})
    assert all(rs[0]["attempts"] <= 2 for rs in outcomes.results.values()), "held, not retried"
    assert during["small/b"]["circuit_open"] == 1 and during["small/a"]["circuit_open"] == 0
    assert refused == RETRY["circuit_failures"], "after the circuit opened, b was sent nothing"
    assert closed_at_checks >= 1, "b's circuit closed on its listing"
    second_counts = _by_deployment(later.results, {j["id"] for j in second})
    assert second_counts["b"] >= len(second) // 4, second_counts


async def test_the_open_circuit_warning_says_where_requests_go_with_and_without_other_deployments(
    make_bus: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Two deployments: the one that fails sends its requests to the other. One deployment:
    there is no other, so its requests wait for it (and the warning says so)."""
    caplog.set_level(logging.WARNING, logger="consumer.runtime.provider_calls")
    for weights, says in (
        (
            {"a": 1, "b": 1},
            "circuit open: its requests go to the tier's other deployments, "
            "or are held (one probe at a time) while none is up",
        ),
        ({"only": 1}, "circuit open: its requests are held (one probe at a time) until it answers again"),
    ):
        caplog.clear()
        endpoints = {name: _Endpoint(name) for name in weights}
        failing = endpoints[list(weights)[-1]]
        failing.set_down(True)
        bus = make_bus(partitions=2)
        providers = {f"small.{name}": e.provider for name, e in endpoints.items()}
        jobs = [job(i, batch=False) for i in range(20)]
        async with bus.service(_tiers(weights), providers=providers) as service:
            await bus.produce(jobs)
            for _ in range(200):  # bounded: until the failing deployment's circuit opened
                if service.stats_snapshot()["deployments"][f"small/{failing.name}"]["circuit_open"]:
                    break
                await asyncio.sleep(0.05)
            failing.set_down(False)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=60)
        assert not outcomes.dead
        opened = [r.getMessage() for r in caplog.records if "circuit open" in r.getMessage()]
        assert len(opened) == 1, opened
        assert f"deployment {failing.name}: provider at" in opened[0]
        assert opened[0].endswith(says), opened[0]
        if len(weights) == 1:
            assert "other deployments" not in opened[0]


def test_the_open_circuit_warning_names_the_fallback_that_takes_held_requests() -> None:
    waits = "its requests are held (one probe at a time) until it answers again"
    assert open_circuit_route(1, FallbackConfig(tier="backup", after_s=20)) == (
        waits + "; after 20 s of outage its held requests move to tier backup"
    )
    assert open_circuit_route(1, FallbackConfig(tier="backup", on=("quota_exhausted",))) == waits
    assert open_circuit_route(3, None).startswith("its requests go to the tier's other deployments")


async def test_an_exhausted_quota_on_one_deployment_sends_its_work_to_the_others_at_once(
    make_bus: Callable[..., Any],
) -> None:
    endpoints = {name: _Endpoint(name) for name in ("a", "b")}
    endpoints["b"].out_of_quota = True
    bus = make_bus(partitions=2)
    providers = {f"small.{name}": e.provider for name, e in endpoints.items()}
    jobs = [job(i, batch=False) for i in range(200)]
    tiers = _tiers({"a": 1, "b": 1})
    tiers["tiers"]["small"]["retry"] = {**RETRY, "quota_cooldown_s": 600}
    async with bus.service(tiers, providers=providers) as service:
        await bus.produce(jobs)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=30)
        stats = service.stats_snapshot()["deployments"]
    assert not outcomes.dead
    assert _by_deployment(outcomes.results, {j["id"] for j in jobs}) == Counter({"a": len(jobs)})
    # b was asked only until its first answers said its quota is spent (its slots at most)
    assert 1 <= len(endpoints["b"].provider.requests) <= 4, len(endpoints["b"].provider.requests)
    assert stats["small/b"]["provider_errors"] == len(endpoints["b"].provider.requests)
