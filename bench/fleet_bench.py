"""Fleet bench: N `promptbus run` processes in one group on one API key, with and without a
fleet quota (`quotas:` in the tier file), against the simulator enforcing the same figures.

    .venv/bin/python bench/fleet_bench.py [--quick] [--rows NAME,...] [--jobs 2400]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout and writes it to bench/results/fleet_bench.json (`--no-save`: not); progress and the
table go to stderr.

Each row is one run: a fresh 12-partition jobs topic and group, N service processes started
(`python -m consumer.cli run`, each its own tier file copy) and waited for until the group has
given every one of them partitions, then the unbatched jobs produced (2,400 by default). The
simulator runs as its own process with a capacity of 8 and 50 ms latency and a rate limit as a
token bucket refilled over 1 s: `rpm` rows 20 requests/s (bucket of 20), `tpm` rows 600
tokens/s (bucket of 600) with no request limit. A row WITH the quota gives the tier
`quota: key` and `quotas: {key: {requests_per_minute: 1200}}` (or `tokens_per_minute: 36000`):
the same figures. The ceiling is the simulator's rate: 20 requests/s, or 600 tokens/s (a `tpm`
row's rate against it is the tokens the simulator's limit counted per second in the steady part:
the jobs' prompts differ by a few tokens, so a rate in requests/s over one request's tokens would
be off by that spread; `ceiling_per_s` gives the requests/s of the first job's tokens).

Per row, from the simulator's own counters (sampled every 0.1 s, as pipeline_bench.py does):
`rate_vs_ceiling`, the answer rate between 10% and 90% of the jobs answered over the ceiling;
`share_429`, 429s over every request sent in the run (and `share_429_steady` in the same 10-90%
part); `answered` (jobs with a result or dead letter, from the outcome topics) and
`dead_letters`. Targets WITH the quota: rate_vs_ceiling >= 0.97 and share_429 <= 0.01, every
job answered.

The `kill` row runs 6 instances with the request quota and SIGKILLs one once 40% of the jobs
are answered. Every job must still get an outcome (at least once: duplicates allowed), and the
survivors' shares must add up to the quota again within the session timeout plus 2 s: the
time from the kill to the first moment the survivors' stats snapshots (published every
0.5 s, each carrying its instance's share) add up to at least 0.99 of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

# run as a script, this file's directory is importable: the simulator process, its sampler and
# the steady-rate summary are pipeline_bench's own
from pipeline_bench import (
    TIER,
    Sampler,
    SimProcess,
    _progress,
    make_jobs,
    summarize,
    tier_dict,
    tokens_per_request,
)

from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import submit_jobs
from consumer.settings import Settings, TierConfig
from consumer.testing.faultrun import latest_stats
from consumer.testing.harness import service_env, settings_from_env
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess

#: partitions of the jobs topic: shared evenly by 1, 3, 6 and 12 instances
PARTITIONS = 12
#: the provider's figures: 20 requests a second, or 600 tokens a second
RPS, TOKENS_PER_S = 20, 600
#: the consumer group's session timeout (PROMPTBUS_SESSION_TIMEOUT_S, the default)
SESSION_TIMEOUT_S = 10.0
TARGET_RATE, TARGET_429 = 0.97, 0.01
#: the kill row: one instance is SIGKILLed once this share of the jobs is answered
KILL_AT = 0.4

#: name -> (instances, limit kind, with the quota, SIGKILL one instance)
ROWS: dict[str, tuple[int, str, bool, bool]] = {
    "rpm-1-none": (1, "rpm", False, False),
    "rpm-3-none": (3, "rpm", False, False),
    "rpm-6-none": (6, "rpm", False, False),
    "rpm-12-none": (12, "rpm", False, False),
    "rpm-1-quota": (1, "rpm", True, False),
    "rpm-3-quota": (3, "rpm", True, False),
    "rpm-6-quota": (6, "rpm", True, False),
    "rpm-12-quota": (12, "rpm", True, False),
    "tpm-6-none": (6, "tpm", False, False),
    "tpm-6-quota": (6, "tpm", True, False),
    "rpm-6-quota-kill": (6, "rpm", True, True),
}
QUICK_ROWS = ("rpm-6-none", "rpm-6-quota", "tpm-6-quota")


def simulator_faults(kind: str) -> dict[str, Any]:
    """The simulator: capacity 8, 50 ms, and one limit as a bucket refilled over 1 s."""
    limit = {"rpm": RPS} if kind == "rpm" else {"tpm": TOKENS_PER_S}
    return {"seed": 1, "latency_ms": 50, "capacity": 8, "rate_window_s": 1.0, **limit}


def fleet_tier_file(base_url: str, kind: str, *, quota: bool) -> dict[str, Any]:
    """pipeline_bench's unbatched tier; with the quota, the simulator's figure as `quotas.key`."""
    tiers = tier_dict(base_url, batching=False)
    if quota:
        tiers["tiers"][TIER]["quota"] = "key"
        figure = (
            {"requests_per_minute": RPS * 60} if kind == "rpm" else {"tokens_per_minute": TOKENS_PER_S * 60}
        )
        tiers["quotas"] = {"key": figure}
    return tiers


async def wait_for_group(settings: Settings, procs: list[ServiceProcess], timeout_s: float) -> float:
    """Seconds until every process's stats snapshot shows partitions of its own and together
    all of them (the group has formed; bounded)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        dead = [p for p in procs if not p.alive()]
        if dead:
            raise RuntimeError(f"a service process exited: {dead[0].log_tail()}")
        now_s = time.time()
        live = [
            s for s in (await latest_stats(settings)).values() if now_s - float(s.get("updated_at", 0)) < 3.0
        ]
        owned = [len(s.get("lag", [])) for s in live]
        if len(live) == len(procs) and all(owned) and sum(owned) == PARTITIONS:
            return time.monotonic() - t0
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the group did not form within {timeout_s:.0f} s")


class ShareWatch:
    """Follows the stats topic: each instance's share of the quota over time (for the kill row)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: (snapshot time, instance, fraction), in the order read
        self.points: list[tuple[float, str, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            for instance, snap in (await latest_stats(self.settings)).items():
                quota = (snap.get("quotas") or {}).get("key")
                if quota is not None:
                    point = (float(snap.get("updated_at", 0)), instance, float(quota.get("fraction", 0)))
                    if point not in self.points:
                        self.points.append(point)
            await asyncio.sleep(0.25)

    def refilled_at(self, killed: str, after_s: float, survivors: int) -> float | None:
        """The first snapshot time after `after_s` at which the survivors' latest shares add up
        to at least 0.99 of the quota."""
        latest: dict[str, float] = {}
        for at_s, instance, fraction in sorted(self.points):
            if instance.startswith(killed):
                continue
            latest[instance] = fraction
            if at_s > after_s and len(latest) >= survivors and sum(latest.values()) >= 0.99:
                return at_s
        return None

    def sum_while(self, instances: int) -> float | None:
        """The mean over snapshots of the instances' latest shares added up, once all of them
        have published one (what the group took of the quota)."""
        latest: dict[str, float] = {}
        sums = []
        for _at_s, instance, fraction in sorted(self.points):
            latest[instance] = fraction
            if len(latest) >= instances:
                sums.append(sum(sorted(latest.values(), reverse=True)[:instances]))
        return round(sum(sums) / len(sums), 3) if sums else None

    def shares_at_kill(self, killed: str, at_s: float) -> float:
        latest: dict[str, float] = {}
        for t, instance, fraction in sorted(self.points):
            if t <= at_s and not instance.startswith(killed):
                latest[instance] = fraction
        return sum(latest.values())


async def group_env(bootstrap: str, shutdown_timeout_s: float) -> tuple[dict[str, str], Settings]:
    """A fresh group's service environment (PARTITIONS, SESSION_TIMEOUT_S) and settings, its
    topics created."""
    env = service_env(
        bootstrap,
        partitions=PARTITIONS,
        PROMPTBUS_SHUTDOWN_TIMEOUT_S=str(shutdown_timeout_s),
        PROMPTBUS_SESSION_TIMEOUT_S=str(SESSION_TIMEOUT_S),
    )
    settings = settings_from_env(env)
    await ensure_topics(settings)
    return env, settings


@contextlib.asynccontextmanager
async def running_group(settings: Settings, procs: list[ServiceProcess]) -> AsyncIterator[float]:
    """The processes started and waited for until the group has formed (yields the seconds
    that took); SIGTERM, then stopped for sure, at the end."""
    try:
        for proc in procs:
            proc.log_path.unlink(missing_ok=True)
            proc.start()
        yield await wait_for_group(settings, procs, 180.0)
    finally:
        for proc in procs:
            if proc.alive():
                proc.terminate(timeout_s=30)
        for proc in procs:
            proc.ensure_stopped()


async def run_row(args: argparse.Namespace, name: str, bootstrap: str, workdir: Path) -> dict[str, Any]:
    instances, kind, with_quota, kill = ROWS[name]
    faults = simulator_faults(kind)
    env, settings = await group_env(bootstrap, 10.0)
    async with SimProcess(faults, REPO_ROOT / f"bench/out/sim-fleet-{name}.log") as sim:
        tiers = fleet_tier_file(f"{sim.base}/v1", kind, quota=with_quota)
        jobs = make_jobs(args.jobs, batched_share=0.0, seed=2)
        if kind == "rpm":
            ceiling = float(RPS)
        else:
            cost = await tokens_per_request(TierConfig.model_validate(tiers["tiers"][TIER]), jobs[0])
            ceiling = TOKENS_PER_S / cost
        procs = [ServiceProcess(env, tiers, workdir, name=f"{name}-{i}") for i in range(instances)]
        out: dict[str, Any] = {
            "instances": instances,
            "limit": kind,
            "quota": tiers.get("quotas", {}).get("key"),
            "jobs": len(jobs),
            "ceiling_per_s": round(ceiling, 2),
        }
        async with running_group(settings, procs) as formed_s:
            out["group_formed_s"] = round(formed_s, 1)
            await sim.reset()
            sampler = Sampler(sim)
            expected = {j["id"] for j in jobs}
            async with OutcomeFollower(settings) as recorder, sampler.running():
                watch = ShareWatch(settings) if with_quota else None
                watcher = asyncio.create_task(watch.run()) if watch is not None else None
                await submit_jobs(
                    settings, (orjson.dumps(j) for j in jobs), key_of=lambda v: orjson.loads(v)["id"].encode()
                )
                timeout_s = max(180.0, 4 * len(jobs) / ceiling)
                if kill:
                    assert watch is not None
                    out["kill"] = await kill_one(procs, recorder, watch, len(jobs), timeout_s)
                answered_all = await recorder.wait_for_ids(expected, timeout_s=timeout_s)
                if watcher is not None:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
            token_limit = float(TOKENS_PER_S) if kind == "tpm" else None
            out.update(summarize(sampler.samples, len(jobs), ceiling, token_limit_per_s=token_limit))
            if watch is not None:
                out["shares_sum_while_all_busy"] = watch.sum_while(len(procs) - int(kill))
            dead = [o for o in recorder.outcomes if o.dead]
            out["answered"] = len(recorder.ids() & expected)
            out["all_answered"] = answered_all
            out["dead_letters"] = len({o.job_id for o in dead})
            out["duplicates"] = recorder.duplicates()
    return out


async def kill_one(
    procs: list[ServiceProcess], recorder: OutcomeFollower, watch: ShareWatch, n: int, timeout_s: float
) -> dict[str, Any]:
    """SIGKILL the last process once KILL_AT of the jobs are answered; when the survivors'
    shares add up to the quota again."""
    await recorder.wait_for_count(round(KILL_AT * n), timeout_s=timeout_s)
    victim = procs[-1]
    killed = f"{socket.gethostname()}-{victim.pid}-"
    kill_s = time.time()
    victim.kill()
    killed_at = len(recorder.outcomes)
    _progress("killed %s (%s) at %d outcomes", victim.log_path.name, killed, killed_at)
    # wait (bounded) for the survivors' shares to come back
    deadline = time.monotonic() + 3 * SESSION_TIMEOUT_S + 10
    refilled = None
    while refilled is None and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        refilled = watch.refilled_at(killed, kill_s, len(procs) - 1)
    return {
        "killed_at_outcomes": killed_at,
        "survivors_share_at_kill": round(watch.shares_at_kill(killed, kill_s), 3),
        "shares_back_after_s": round(refilled - kill_s, 2) if refilled is not None else None,
        "bound_s": SESSION_TIMEOUT_S + 2.0,
    }


def verdict(name: str, row: dict[str, Any]) -> bool | None:
    """Whether a row WITH the quota met its targets (None: a row without the quota, measured only)."""
    if not ROWS[name][2]:
        return None
    answered = row.get("all_answered", False)
    if ROWS[name][3]:
        back = (row.get("kill") or {}).get("shares_back_after_s")
        return bool(answered and back is not None and back <= SESSION_TIMEOUT_S + 2.0)
    rate, share = row.get("rate_vs_ceiling"), row.get("share_429")
    return bool(
        answered and rate is not None and rate >= TARGET_RATE and share is not None and share <= TARGET_429
    )


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The rows as bench/README.md shows them."""
    lines = [
        "| row | instances | limit | quota | rate / ceiling | 429 share (steady) | answered "
        "| dead letters | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | {r.get('instances')} | | | error: {r['error']} | | | | |")
            continue
        share = r.get("share_429")
        steady = r.get("share_429_steady")
        kill = r.get("kill")
        note = f" (kill: shares back after {kill.get('shares_back_after_s')} s)" if kill else ""
        met = r.get("met")
        lines.append(
            f"| {name} | {r['instances']} | {r['limit']} | {'yes' if r['quota'] else 'no'} "
            f"| {r.get('rate_vs_ceiling')} | {_pct(share)} ({_pct(steady)}) "
            f"| {r.get('answered')}/{r['jobs']} "
            f"| {r.get('dead_letters')} | {'-' if met is None else 'yes' if met else 'NO'}{note} |"
        )
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    result: dict[str, Any] = {
        "bench": "fleet_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "jobs": args.jobs,
        "partitions": PARTITIONS,
        "session_timeout_s": SESSION_TIMEOUT_S,
        "targets": {"rate_vs_ceiling": TARGET_RATE, "share_429": TARGET_429},
        "rows": {},
    }
    t0 = time.monotonic()
    logs = REPO_ROOT / "bench" / "out" / "fleet"
    logs.mkdir(parents=True, exist_ok=True)
    for name in args.rows:
        _progress("row %s: %s (process logs in %s)", name, ROWS[name], logs.relative_to(REPO_ROOT))
        try:
            row = await run_row(args, name, bootstrap, logs)
        except Exception as exc:  # one row's failure is reported, the others still run
            logging.exception("row %s failed", name)
            row = {"instances": ROWS[name][0], "error": f"{type(exc).__name__}: {exc}"}
        row["met"] = verdict(name, row) if "error" not in row else False
        row["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
        result["rows"][name] = row
        _progress("row %s: %s", name, row)
    result["bench_s"] = round(time.monotonic() - t0, 1)
    result["table"] = table(result["rows"])
    return result


def save(result: dict[str, Any]) -> None:
    """Into bench/results/fleet_bench.json: this run's rows replace those of the same name,
    the rows of earlier runs of other names are kept (each says when it was measured)."""
    path = REPO_ROOT / "bench" / "results" / "fleet_bench.json"
    rows: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError, KeyError):
            rows = dict(json.loads(path.read_text(encoding="utf-8"))["rows"])
    rows.update(result["rows"])
    saved = {**result, "rows": {name: rows[name] for name in ROWS if name in rows}}
    saved["table"] = table(saved["rows"])
    path.write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")
    _progress("wrote %s", path.relative_to(REPO_ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"rows {', '.join(QUICK_ROWS)} with 1,200 jobs")
    parser.add_argument("--rows", default=None, help=f"comma list of rows (default all: {', '.join(ROWS)})")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per row (default 2400; quick 1200)")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/fleet_bench.json")
    args = parser.parse_args(argv)
    names = (
        [r.strip() for r in args.rows.split(",")] if args.rows else list(QUICK_ROWS if args.quick else ROWS)
    )
    unknown = [r for r in names if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    args.rows = names
    if args.jobs is None:
        args.jobs = 1200 if args.quick else 2400
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    print(text)
    print(result["table"], file=sys.stderr)
    if not args.no_save:
        save(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
