"""The default limiter against a hosted provider's quota, when answer times spread widely.

    .venv/bin/python bench/limiter_bench.py [--quick] [--rows NAME,...] [--run-s 60] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout (`--save`: also into bench/results/); progress and the table go to stderr.

A hosted model's answer times vary with the answer's length and the pack's size, far more than
any queue on the client's side would make them: the limiter must fill the quota the provider
gives whatever that spread. Each row is one run of real `promptbus run` processes (1, or 3 in
one group sharing a fleet quota of the provider's figure) with **the default limiter** (the tier
names no `limiter`), against the simulator as its own process with no concurrency limit of its
own (it never queues), answer times drawn uniformly from a row's range, and one rate limit as
the providers enforce theirs (a token bucket, full at the start):

    rpm60   1,200 requests a minute, a bucket of 1,200 refilled over 60 s (20 requests/s)
    rpm1    the same 20 requests/s, a bucket of 20 refilled over 1 s
    tpm     36,000 tokens a minute (input + output), a bucket of 36,000 refilled over 60 s
            (600 tokens/s), as OpenAI's TPM

Row names: `LATENCY-LIMIT-JOBS-INSTANCES`, LATENCY `short` (0.1-1.9 s) or `long` (0.2-8 s),
JOBS `unbatched` or `batched` (every job `batch: true`, the tier's batching on, max_items 20).
Each run: a fresh 12-partition jobs topic and group, the processes started and waited for until
the group has formed, then enough jobs produced that they never run out, then `--run-s` seconds
(60 s more for a bucket refilled over 60 s, which must run dry first), then SIGTERM.

From the simulator's own counters, sampled every 0.1 s: the bucket's level is replayed from the
requests (or tokens) it admitted; the steady part of the run starts once the bucket has run dry
for the first time and the run is at least `--warmup-s` old (the limit starting at `initial`
needs a few answers' time to grow), and ends with the run. `rate_vs_ceiling`: what the bucket
admitted per second in the steady part over its refill rate (a bucket that never ran dry: the
second half of the run, `drained: false`); `share_429`: 429s over every request sent in the
run. Targets per row: rate_vs_ceiling >= 0.95, share_429 <= 0.01. Each row also gives what the
instances' stats snapshots said of the tier's limit at the end (`limit`, `limit_reason`).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from fleet_bench import group_env, running_group
from pipeline_bench import PROMPT, TIER, Sampler, SimProcess, _progress, make_jobs, tokens_per_request

from consumer.kafka.clients import submit_jobs
from consumer.settings import TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.faultrun import latest_stats
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess

TARGET_RATE, TARGET_429 = 0.95, 0.01
#: the provider's figures: 20 requests a second, or 600 tokens a second
RPS, TOKENS_PER_S = 20, 600
#: answer time ranges, seconds (uniform)
LATENCIES = {"short": (0.1, 1.9), "long": (0.2, 8.0)}
#: limit kind -> (requests or tokens, refill window in seconds)
LIMITS = {"rpm60": ("requests", 60.0), "rpm1": ("requests", 1.0), "tpm": ("tokens", 60.0)}
MAX_ITEMS = 20


@dataclass(frozen=True)
class Shape:
    """One row: answer times, the provider's limit, batched or not, instances."""

    latency: str
    limit: str
    batched: bool
    instances: int

    @property
    def name(self) -> str:
        jobs = "batched" if self.batched else "unbatched"
        return f"{self.latency}-{self.limit}-{jobs}-{self.instances}"


ALL_ROWS = {
    s.name: s
    for s in (
        Shape(latency, limit, batched, instances)
        for latency in LATENCIES
        for limit in LIMITS
        for batched in (False, True)
        for instances in (1, 3)
    )
}
#: the rows a plain run measures: every limit and latency unbatched on one instance, batched
#: and shared rows on the limits that let them reach a steady state within a minute
DEFAULT_ROWS = (
    "short-rpm60-unbatched-1", "short-rpm1-unbatched-1", "short-tpm-unbatched-1",
    "long-rpm60-unbatched-1", "long-rpm1-unbatched-1", "long-tpm-unbatched-1",
    "short-rpm1-batched-1", "long-rpm1-batched-1", "long-tpm-batched-1",
    "short-rpm1-unbatched-3", "long-rpm60-unbatched-3", "long-rpm1-batched-3",
)  # fmt: skip
QUICK_ROWS = ("short-rpm1-unbatched-1", "long-rpm1-unbatched-1", "long-rpm1-batched-3")


def simulator_faults(shape: Shape) -> dict[str, Any]:
    """No concurrency limit, uniform answer times, one bucket."""
    low_s, high_s = LATENCIES[shape.latency]
    what, window_s = LIMITS[shape.limit]
    per_window = round((RPS if what == "requests" else TOKENS_PER_S) * window_s)
    return {
        "seed": 1,
        "latency_ms": round((low_s + high_s) / 2 * 1000),
        "jitter_ms": round((high_s - low_s) / 2 * 1000),
        "capacity": 0,
        "rate_window_s": window_s,
        ("rpm" if what == "requests" else "tpm"): per_window,
    }


def tier_file(base_url: str, shape: Shape) -> dict[str, Any]:
    """The tier with the default limiter (no `limiter` key); 3 instances share a fleet quota of
    the provider's figure."""
    tier: dict[str, Any] = {
        "provider": "openai_compat",
        "base_url": base_url,
        "model": "sim-model",
        "timeout_s": 30,
        "batching": {"enabled": shape.batched, "max_items": MAX_ITEMS},
    }
    out: dict[str, Any] = {"tiers": {TIER: tier}}
    if shape.instances > 1:
        what, _window_s = LIMITS[shape.limit]
        tier["quota"] = "key"
        if what == "requests":
            out["quotas"] = {"key": {"requests_per_minute": RPS * 60}}
        else:
            out["quotas"] = {"key": {"tokens_per_minute": TOKENS_PER_S * 60}}
    return out


def replay_bucket(
    samples: list[dict[str, Any]], key: str, capacity: float, rate_per_s: float
) -> list[float]:
    """The bucket's level at each sample: full at the start, refilled at rate_per_s up to
    capacity, less what it admitted (`key`'s count) between samples."""
    levels, level, last_t, last_n = [], capacity, 0.0, 0.0
    for s in samples:
        level = min(capacity, level + (s["t_s"] - last_t) * rate_per_s) - (s[key] - last_n)
        last_t, last_n = s["t_s"], s[key]
        levels.append(level)
    return levels


def steady(
    samples: list[dict[str, Any]], shape: Shape, warmup_s: float, token_cost: float
) -> dict[str, Any]:
    """The steady part's rate against the ceiling, the 429 share, when the bucket ran dry."""
    what, window_s = LIMITS[shape.limit]
    rate_per_s = float(RPS if what == "requests" else TOKENS_PER_S)
    capacity = rate_per_s * window_s
    for s in samples:
        s["admitted"] = s["requests"] - s["status_429"] - s["status_5xx"]
    key = "admitted" if what == "requests" else "tokens_admitted"
    levels = replay_bucket(samples, key, capacity, rate_per_s)
    # dry: less than one request (or one request's tokens) left
    dry_level = 1.0 if what == "requests" else token_cost
    dry_at = next((s["t_s"] for s, level in zip(samples, levels, strict=True) if level < dry_level), None)
    end = samples[-1]
    start_t = max(dry_at, warmup_s) if dry_at is not None else end["t_s"] / 2
    first = next(s for s in samples if s["t_s"] >= start_t)
    span_s = end["t_s"] - first["t_s"]
    rate = (end[key] - first[key]) / span_s if span_s > 0 else 0.0
    requests = end["requests"]
    return {
        "ceiling": f"{rate_per_s:g} {what}/s",
        "drained": dry_at is not None,
        "dry_at_s": round(dry_at, 1) if dry_at is not None else None,
        "steady_from_s": round(first["t_s"], 1),
        "steady_s": round(span_s, 1),
        "rate_vs_ceiling": round(rate / rate_per_s, 3),
        "requests": requests,
        "status_429": end["status_429"],
        "share_429": round(end["status_429"] / requests, 4) if requests else None,
        "answered_items": end["answered"],
    }


def jobs_needed(shape: Shape, run_s: float, token_cost: float) -> int:
    """Enough jobs that the run never runs out: what the ceiling admits over the run plus the
    bucket, as packs of MAX_ITEMS when batched, with a margin."""
    what, window_s = LIMITS[shape.limit]
    per_s = RPS if what == "requests" else TOKENS_PER_S / token_cost
    requests = per_s * (run_s + window_s)
    items = MAX_ITEMS if shape.batched else 1
    return math.ceil(1.3 * requests * items) + 200


async def run_row(args: argparse.Namespace, shape: Shape, bootstrap: str, workdir: Path) -> dict[str, Any]:
    env, settings = await group_env(bootstrap, 5.0)
    run_s = args.run_s + (60.0 if LIMITS[shape.limit][1] >= 60.0 else 0.0)
    faults = simulator_faults(shape)
    async with SimProcess(faults, REPO_ROOT / f"bench/out/sim-limiter-{shape.name}.log") as sim:
        tiers = tier_file(f"{sim.base}/v1", shape)
        probe_job = make_jobs(1, batched_share=0.0, seed=2)[0]
        tier = TierConfig.model_validate(tiers["tiers"][TIER])
        token_cost = float(await tokens_per_request(tier, probe_job))
        n = jobs_needed(shape, run_s, token_cost)
        jobs = make_jobs(n, batched_share=1.0 if shape.batched else 0.0, seed=2)
        procs = [
            ServiceProcess(env, tiers, workdir, name=f"{shape.name}-{i}") for i in range(shape.instances)
        ]
        out: dict[str, Any] = {"shape": shape.__dict__, "simulator": faults, "jobs": n, "run_s": run_s}
        async with running_group(settings, procs) as formed_s:
            out["group_formed_s"] = round(formed_s, 1)
            await sim.reset()
            sampler = Sampler(sim)
            async with sampler.running():
                await submit_jobs(
                    settings, (orjson.dumps(j) for j in jobs), key_of=lambda v: orjson.loads(v)["id"].encode()
                )
                await asyncio.sleep(run_s)
            out.update(steady(sampler.samples, shape, args.warmup_s, token_cost))
            snaps = (await latest_stats(settings)).values()
            tiers_seen = [(s.get("tiers") or {}).get(TIER) or {} for s in snaps]
            out["limit"] = [t.get("limit") for t in tiers_seen]
            out["limit_reason"] = [t.get("limit_reason") for t in tiers_seen]
    share = out["share_429"]
    out["met"] = bool(out["rate_vs_ceiling"] >= TARGET_RATE and share is not None and share <= TARGET_429)
    return out


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The rows as bench/README.md shows them."""
    lines = [
        "| row | ceiling | rate / ceiling | 429 share | bucket dry at | limit at the end (why) | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | | error: {r['error']} | | | | NO |")
            continue
        limits = ", ".join(
            f"{limit} ({reason})" if reason else str(limit)
            for limit, reason in zip(r.get("limit", []), r.get("limit_reason", []), strict=False)
        )
        dry = f"{r['dry_at_s']} s" if r.get("drained") else "never"
        lines.append(
            f"| {name} | {r['ceiling']} | {r['rate_vs_ceiling']} | {r['share_429']:.2%} | {dry} "
            f"| {limits} | {'yes' if r['met'] else 'NO'} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    result: dict[str, Any] = {
        "bench": "limiter_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "prompt": PROMPT,
        "targets": {"rate_vs_ceiling": TARGET_RATE, "share_429": TARGET_429},
        "rows": {},
    }
    t0 = time.monotonic()
    logs = REPO_ROOT / "bench" / "out" / "limiter"
    logs.mkdir(parents=True, exist_ok=True)
    for name in args.rows:
        _progress("row %s (process logs in %s)", name, logs.relative_to(REPO_ROOT))
        try:
            row = await run_row(args, ALL_ROWS[name], bootstrap, logs)
        except Exception as exc:  # one row's failure is reported, the others still run
            _progress("row %s failed: %r", name, exc)
            row = {"error": f"{type(exc).__name__}: {exc}", "met": False}
        result["rows"][name] = row
        _progress("row %s: %s", name, {k: v for k, v in row.items() if k not in ("shape", "simulator")})
    result["all_met"] = all(r.get("met") for r in result["rows"].values())
    result["bench_s"] = round(time.monotonic() - t0, 1)
    result["table"] = table(result["rows"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK_ROWS)}")
    parser.add_argument("--rows", default=None, help="comma list of rows, or 'all' (default: DEFAULT_ROWS)")
    parser.add_argument(
        "--run-s", type=float, default=60.0, help="seconds per row (a bucket refilled over 60 s: +60)"
    )
    parser.add_argument("--warmup-s", type=float, default=20.0, help="the steady part starts no sooner")
    add_save_option(parser)
    args = parser.parse_args(argv)
    if args.rows == "all":
        names = list(ALL_ROWS)
    elif args.rows:
        names = [r.strip() for r in args.rows.split(",")]
    else:
        names = list(QUICK_ROWS if args.quick else DEFAULT_ROWS)
    unknown = [r for r in names if r not in ALL_ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ALL_ROWS)}")
    args.rows = names
    result = asyncio.run(main_async(args))
    print(result["table"], file=sys.stderr)
    emit_report(result, args.save, name="limiter_bench")
    return 0 if result["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
