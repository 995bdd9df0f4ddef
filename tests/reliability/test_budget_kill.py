"""A tenant's daily budget across a SIGKILL: a real `promptbus run` process, a real broker, the
simulator over real HTTP in a background thread.

Tenant `capped` has a budget of a few requests and `on_exhausted: dead_letter`; its jobs are
answered until the budget is spent, the rest dead-lettered `budget_exhausted`. The process is
SIGKILLed (no drain, no final record: whatever it claimed stays claimed) and started again; the
new process reads what the killed one claimed from the budgets topic before it admits
anything, so every job of the tenant it reads is refused too, and another tenant's are answered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from consumer.testing.harness import (
    create_topics,
    job,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, run_simulator

pytestmark = pytest.mark.integration

#: $0.001 a token (input and output): a job of ~20 tokens costs ~$0.02, its estimate ~$0.03
PRICING = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
BUDGET_USD = 0.2
FIRST, AFTER = 30, 10


def _tiers(base_url: str) -> dict[str, Any]:
    tiers = tier_file_dict(base_url + "/v1", batching=False, options={"max_tokens": 8}, pricing=PRICING)
    tiers["tiers"]["small"]["limiter"] = {"algorithm": "fixed", "initial": 2, "min": 1, "max": 2}
    tiers["tenants"] = {"capped": {"budget": {"usd_per_day": BUDGET_USD}, "on_exhausted": "dead_letter"}}
    return tiers


Outcome = tuple[str, dict[str, object]]


async def _wait_for(settings: object, ids: set[str], timeout_s: float) -> dict[str, Outcome]:
    """id -> ("result" | the dead letter's kind, the record), once every id has one (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcomes = await read_outcomes(settings)  # type: ignore[arg-type]
        seen = {i: ("result", r[0]) for i, r in outcomes.results.items() if i in ids}
        seen.update({i: (d[0]["error"]["kind"], d[0]) for i, d in outcomes.dead.items() if i in ids})
        if ids <= set(seen) or time.monotonic() > deadline:
            return seen
        await asyncio.sleep(0.5)


async def test_the_budget_spent_before_a_sigkill_stays_spent_after_the_restart(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=2, PROMPTBUS_STATS_INTERVAL_S="1")
    settings = settings_from_env(env)
    await create_topics(settings)
    capped = [{**job(i, batch=False), "id": f"capped-{i}", "tenant": "capped"} for i in range(FIRST)]
    after = [{**job(i, batch=False), "id": f"after-{i}", "tenant": "capped"} for i in range(AFTER)]
    others = [{**job(i, batch=False), "id": f"free-{i}", "tenant": "free"} for i in range(AFTER)]
    with run_simulator(SimulatorConfig(latency_ms=20, seed=5)) as base_url:
        service = ServiceProcess(env, _tiers(base_url), tmp_path)
        try:
            service.start()
            await produce(settings, capped)
            first = await _wait_for(settings, {j["id"] for j in capped}, timeout_s=120)
            assert len(first) == FIRST, service.log_tail()
            service.kill()
            service.start()
            await produce(settings, after + others)
            later = await _wait_for(settings, {j["id"] for j in after + others}, timeout_s=120)
            assert len(later) == 2 * AFTER, service.log_tail()
        finally:
            if service.alive():
                service.terminate(timeout_s=30)
            service.ensure_stopped()
    answered = [r for kind, r in first.values() if kind == "result"]
    refused = [kind for kind, _ in first.values() if kind != "result"]
    assert answered and refused and set(refused) == {"budget_exhausted"}
    spent = sum(
        (r["usage"]["input_tokens"] + r["usage"]["output_tokens"]) * 1000.0 / 1e6  # type: ignore[index]
        for r in answered
    )
    assert spent <= BUDGET_USD, "the estimates (prompt and max_tokens) are above the usage: never past it"
    assert all(later[j["id"]][0] == "budget_exhausted" for j in after), "the restart forgot the spend"
    assert all(later[j["id"]][0] == "result" for j in others), "another tenant was refused"
