"""Tenants benchmark: fair share behind another tenant's backlog, weighted shares, and a daily
budget that holds across a SIGKILL.

    .venv/bin/python bench/tenants_bench.py [--bulk 5000] [--beta 100] [--rate 2]
                                            [--parts fair,weights,budget] [--no-baseline]
                                            [--limiter fixed|default] [--save]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout (with `--save`, also bench/results/tenants_bench.json); progress goes to stderr. The
simulator (in a thread) has `capacity` 4 and 200 ms answers; the tier's limiter is fixed at
4 (`--limiter default`: the tier names none, the default AIMD finds the capacity itself), one
lane, every job unbatched, each run with fresh topics and group.

fair     idle: tenant beta's jobs at `--rate`/s on an empty service; loaded: tenant alpha's
         `--bulk` jobs queued, then 5 s later the same beta jobs; loaded_no_tenants: the same
         with no tenant on any job (one queue, today's behaviour without tenants). Latency =
         the result record's timestamp minus the producer's ack. Target: loaded beta p99 <=
         2 x idle p99 + 0.2 s.
weights  four tenants with weights 1, 1, 2, 4, each with a backlog larger than the run
         answers: the shares of the answered jobs (the first `--weights-jobs` results after
         the first 100) within 5% (relative) of the weights.
budget   a real `promptbus run` process; tenant capped has a $0.50 day and on_exhausted
         dead_letter and sends 100 jobs: its spend (the results' usage at the tier's
         pricing) at most $0.50 x 1.02 + one request's estimate, the rest budget_exhausted;
         the process is SIGKILLed and started again, and 10 more jobs are all refused.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from lanes_bench import (
    CAPACITY,
    LATENCY_MS,
    Running,
    _progress,
    backlog_then_paced,
    fresh_settings,
    latency_figures,
    produce_all,
    read_outcomes,
)

from consumer.core.completion import CHARS_PER_TOKEN
from consumer.core.templates import render
from consumer.kafka.admin import ensure_topics
from consumer.settings import Settings
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import service_env, settings_from_env
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, run_simulator

WEIGHTS = {"t1": 1.0, "t2": 1.0, "t3": 2.0, "t4": 4.0}
#: tenant capped's day, and the tier's prices (USD per million tokens): a job costs ~ $0.01
BUDGET_USD = 0.5
PRICING = {"input_per_mtok": 300.0, "output_per_mtok": 1200.0}
MAX_TOKENS = 16
BUDGET_JOBS, AFTER_RESTART_JOBS = 100, 10


#: the `--limiter` choices: fixed at the simulator's capacity, or the tier's default (the tier
#: names no limiter: AIMD, initial 4, max 256)
LIMITERS: dict[str, dict[str, Any]] = {
    "fixed": {"limiter": {"algorithm": "fixed", "initial": CAPACITY, "min": 1, "max": CAPACITY}},
    "default": {},
}
#: the limiter of this run's tiers (`--limiter`)
TIER_LIMITER: dict[str, Any] = dict(LIMITERS["fixed"])


def tier_file(base_url: str, tenants: dict[str, Any] | None = None, **tier: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": 600,
                **TIER_LIMITER,
                **tier,
            }
        }
    }
    if tenants is not None:
        data["tenants"] = tenants
    return data


def make_job(name: str, i: int, tenant: str | None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": f"{name}-{i}",
        "tier": "small",
        "prompt": "Classify the sentiment of the text.\nTEXT:\n${text}",
        "variables": {"text": f"{name} text number {i}"},
        "options": {"max_tokens": MAX_TOKENS},
    }
    if tenant is not None:
        job["tenant"] = tenant
    return job


# ---------------------------------------------------------------------------- fair share
async def fair_run(
    bootstrap: str, base_url: str, *, bulk: int, beta: int, rate: float, tenants: bool
) -> dict[str, Any]:
    """Beta's latency, after `bulk` alpha jobs were queued (0: on an empty service)."""
    settings = fresh_settings(bootstrap)
    await ensure_topics(settings)
    named: dict[str, Any] | None = {"alpha": {}, "beta": {}} if tenants else None
    alpha = [make_job("alpha", i, "alpha" if tenants else None) for i in range(bulk)]
    jobs = [make_job("beta", i, "beta" if tenants else None) for i in range(beta)]
    topic = settings.jobs_topic
    sent, outcomes = await backlog_then_paced(
        settings, tier_file(base_url, named), (topic, alpha), (topic, jobs), rate_per_s=rate
    )
    return {"tenants": tenants, "alpha_queued": bulk, "beta": beta, **latency_figures(sent, outcomes)}


# ---------------------------------------------------------------------------- weights
async def weights_run(bootstrap: str, base_url: str, *, counted: int) -> dict[str, Any]:
    """Four backlogged tenants: the shares of the answered jobs against their weights."""
    settings = fresh_settings(bootstrap)
    await ensure_topics(settings)
    skip = 100  # the first answers: the plans started before every tenant's jobs were read
    per_tenant = counted + skip  # more than any tenant is answered in the counted span
    jobs = [make_job(t, i, t) for i in range(per_tenant) for t in WEIGHTS]  # interleaved
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        await produce_all(producer, settings.jobs_topic, jobs)
    finally:
        await producer.stop()
    tenants = {t: {"weight": w} for t, w in WEIGHTS.items()}
    want = skip + counted
    async with Running(settings, tier_file(base_url, tenants)):
        outcomes = await _first_outcomes(settings, {j["id"] for j in jobs}, want)
    ordered = sorted(outcomes.values(), key=lambda o: o["ts_ms"])[skip:want]
    served = Counter(o["tenant"] for o in ordered)
    total_weight = sum(WEIGHTS.values())
    shares = {}
    for tenant, weight in WEIGHTS.items():
        share, expected = served[tenant] / len(ordered), weight / total_weight
        shares[tenant] = {
            "weight": weight,
            "answered": served[tenant],
            "share": round(share, 4),
            "expected": round(expected, 4),
            "relative_error": round(abs(share - expected) / expected, 4),
        }
    return {"counted": len(ordered), "skipped_first": skip, "shares": shares}


async def _first_outcomes(settings: Settings, ids: set[str], want: int) -> dict[str, dict[str, Any]]:
    """Read outcomes until `want` of `ids` have one (bounded)."""
    deadline = time.monotonic() + 120 + 3 * want * LATENCY_MS / 1000.0 / CAPACITY
    outcomes: dict[str, dict[str, Any]] = {}
    while len(outcomes) < want and time.monotonic() < deadline:
        outcomes = await read_outcomes(settings, ids, timeout_s=5)
    return outcomes


# ---------------------------------------------------------------------------- budget
async def budget_run(bootstrap: str, base_url: str, workdir: Path) -> dict[str, Any]:
    """Tenant capped's $0.50 day across a SIGKILL of a real `promptbus run`."""
    env = service_env(bootstrap, PROMPTBUS_STATS_INTERVAL_S=1)
    settings = settings_from_env(env)
    await ensure_topics(settings)
    tenants = {"capped": {"budget": {"usd_per_day": BUDGET_USD}, "on_exhausted": "dead_letter"}}
    service = ServiceProcess(env, tier_file(base_url, tenants, pricing=PRICING), workdir, "budget")
    first = [make_job("capped", i, "capped") for i in range(BUDGET_JOBS)]
    after = [make_job("after", i, "capped") for i in range(AFTER_RESTART_JOBS)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        service.start()
        await produce_all(producer, settings.jobs_topic, first)
        outcomes = await read_outcomes(settings, {j["id"] for j in first}, timeout_s=180)
        service.kill()  # SIGKILL: no drain, no final record, nothing given back
        killed_s = time.monotonic()
        service.start()
        await produce_all(producer, settings.jobs_topic, after)
        later = await read_outcomes(settings, {j["id"] for j in after}, timeout_s=180)
        restart_s = time.monotonic() - killed_s
    finally:
        await producer.stop()
        if service.alive():
            service.terminate(timeout_s=30)
        service.ensure_stopped()
    return budget_figures(outcomes, later, restart_s)


def job_cost_usd(usage: dict[str, int]) -> float:
    return (
        usage.get("input_tokens", 0) * PRICING["input_per_mtok"]
        + usage.get("output_tokens", 0) * PRICING["output_per_mtok"]
    ) / 1_000_000


def budget_figures(
    outcomes: dict[str, dict[str, Any]], later: dict[str, dict[str, Any]], restart_s: float
) -> dict[str, Any]:
    answered = [o for o in outcomes.values() if not o["dead"]]
    refused = [o for o in outcomes.values() if o["dead"] and o["error"]["kind"] == "budget_exhausted"]
    spend = sum(job_cost_usd(o["usage"]) for o in answered)
    # one request's estimate, as the service makes it: its prompt's characters over
    # CHARS_PER_TOKEN, and its max_tokens (the longest prompt of the run)
    job = make_job("capped", BUDGET_JOBS, "capped")
    input_tokens = len(render(job["prompt"], job["variables"])) // CHARS_PER_TOKEN + 1
    estimate = (input_tokens * PRICING["input_per_mtok"] + MAX_TOKENS * PRICING["output_per_mtok"]) / 1e6
    bound = BUDGET_USD * 1.02 + estimate
    later_refused = [o for o in later.values() if o["dead"] and o["error"]["kind"] == "budget_exhausted"]
    return {
        "budget_usd": BUDGET_USD,
        "jobs": BUDGET_JOBS,
        "answered": len(answered),
        "budget_exhausted": len(refused),
        "other_outcomes": BUDGET_JOBS - len(answered) - len(refused),
        "spend_usd": round(spend, 6),
        "spend_bound_usd": round(bound, 6),
        "one_request_estimate_usd": round(estimate, 6),
        "after_restart_jobs": AFTER_RESTART_JOBS,
        "after_restart_refused": len(later_refused),
        "after_restart_answered": sum(1 for o in later.values() if not o["dead"]),
        "sigkill_to_last_outcome_s": round(restart_s, 2),
    }


# ---------------------------------------------------------------------------- main
def targets(result: dict[str, Any]) -> dict[str, Any]:
    met: dict[str, Any] = {}
    if "fair" in result:
        fair = result["fair"]
        idle_p99, loaded_p99 = fair["idle"]["p99_s"], fair["loaded"]["p99_s"]
        limit = 2 * idle_p99 + 0.2 if idle_p99 is not None else None
        met["beta_p99_limit_s"] = round(limit, 3) if limit is not None else None
        met["beta_p99_met"] = limit is not None and loaded_p99 is not None and loaded_p99 <= limit
        met["beta_none_lost"] = all(
            r["lost"] == 0 and r["dead_lettered"] == 0 for r in fair.values() if isinstance(r, dict)
        )
    if "weights" in result:
        errors = [s["relative_error"] for s in result["weights"]["shares"].values()]
        met["weights_max_relative_error"] = max(errors)
        met["weights_met"] = max(errors) <= 0.05
    if "budget" in result:
        b = result["budget"]
        met["budget_spend_met"] = b["spend_usd"] <= b["spend_bound_usd"]
        met["budget_rest_refused"] = b["other_outcomes"] == 0 and b["budget_exhausted"] > 0
        met["budget_after_restart_all_refused"] = b["after_restart_refused"] == b["after_restart_jobs"]
    return met


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    parts = set(args.parts.split(","))
    config = SimulatorConfig(latency_ms=LATENCY_MS, capacity=CAPACITY, seed=3)
    TIER_LIMITER.clear()
    TIER_LIMITER.update(LIMITERS[args.limiter])
    result: dict[str, Any] = {
        "simulator": {"latency_ms": LATENCY_MS, "capacity": CAPACITY},
        "limiter": TIER_LIMITER.get("limiter", "default"),
    }
    with run_simulator(config) as base_url:
        if "fair" in parts:
            common = {"beta": args.beta, "rate": args.rate}
            fair: dict[str, Any] = {"beta_rate_per_s": args.rate}
            _progress("fair: idle, %d beta jobs at %.1f/s", args.beta, args.rate)
            fair["idle"] = await fair_run(bootstrap, base_url, bulk=0, tenants=True, **common)
            _progress("fair: %d alpha jobs queued, then beta", args.bulk)
            fair["loaded"] = await fair_run(bootstrap, base_url, bulk=args.bulk, tenants=True, **common)
            if not args.no_baseline:
                _progress("fair: the same without tenants (minutes: beta waits behind the backlog)")
                fair["loaded_no_tenants"] = await fair_run(
                    bootstrap, base_url, bulk=args.bulk, tenants=False, **common
                )
            result["fair"] = fair
        if "weights" in parts:
            _progress("weights: four backlogged tenants, weights 1, 1, 2, 4")
            result["weights"] = await weights_run(bootstrap, base_url, counted=args.weights_jobs)
        if "budget" in parts:
            _progress("budget: a $%.2f day, dead_letter, across a SIGKILL", BUDGET_USD)
            with tempfile.TemporaryDirectory() as workdir:
                result["budget"] = await budget_run(bootstrap, base_url, Path(workdir))
    result["targets"] = targets(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bulk", type=int, default=5000, help="alpha's jobs queued (default 5000)")
    parser.add_argument("--beta", type=int, default=100, help="beta's jobs (default 100)")
    parser.add_argument("--rate", type=float, default=2.0, help="beta's jobs per second (default 2)")
    parser.add_argument("--weights-jobs", type=int, default=1200, help="answers counted for shares")
    parser.add_argument("--parts", default="fair,weights,budget", help="fair,weights,budget")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without tenants")
    parser.add_argument(
        "--limiter", choices=sorted(LIMITERS), default="fixed", help="the tier's limiter (default fixed)"
    )
    add_save_option(parser)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    emit_report(result, args.save, name="tenants_bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
