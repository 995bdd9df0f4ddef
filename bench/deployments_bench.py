"""Deployments bench: one tier served by three deployments of different budgets, spread by
headroom, and one of them SIGKILLed and started again.

    .venv/bin/python bench/deployments_bench.py [--rows share,alone,kill] [--jobs 6000]
                                                [--kill-jobs 4000] [--alone-jobs 6000] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON report
on stdout (`--save`: also bench/results/deployments_bench.json); progress goes to stderr.

Three simulator processes are the deployments `d20`, `d40` and `d80`: each with a capacity of
16, 50 ms latency and a request bucket refilled over 1 s of 20, 40 and 80 requests a second
(the summed ceiling: 140/s). One `promptbus run` process serves a tier naming the three
(pipeline_bench's unbatched tier otherwise, weights equal) on a fresh 12-partition jobs topic;
the unbatched jobs are produced at once, once the service owns its partitions.

- `share` (6,000 jobs): the answer rate between 10% and 90% of the jobs answered (from the
  results' `completed_at`) over the summed ceiling, target at least 0.9; each deployment's share
  of the answers (the results' `deployment`) over its share of the ceiling, target within
  0.8-1.2; 429s over every request the simulators saw, target at most 2%.
- `alone` (6,000 jobs, the control): one simulator of 140 requests/s (the summed ceiling) as a
  tier's own endpoint (no `deployments`): the rate and 429s of pacing one provider at that
  rate on this machine in the same run.
- `kill` (4,000 jobs): `d80` SIGKILLed once 1,000 jobs are answered, started again on its port
  once 2,000 are. Targets: every job answered, none dead-lettered, none answered by `d80`
  between its death and its restart; after the restart (from its circuit's close: its first
  answer) its share of the answers within 0.8-1.2x of its share of the ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

# run as a script, this file's directory is importable: the simulator process and the jobs
# are pipeline_bench's own
from pipeline_bench import TIER, SimProcess, _progress, make_jobs, tier_dict

from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import submit_jobs
from consumer.settings import Settings
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.faultrun import latest_stats
from consumer.testing.harness import service_env, settings_from_env
from consumer.testing.outcomes import Outcome, OutcomeFollower
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess

PARTITIONS = 12
#: deployment name -> its simulator's requests per second
RATES = {"d20": 20, "d40": 40, "d80": 80}
CEILING_PER_S = float(sum(RATES.values()))
KILLED = "d80"
TARGET_RATE, TARGET_SHARE, TARGET_429 = 0.9, (0.8, 1.2), 0.02
KILL_AT, BACK_AT = 1000, 2000
#: row -> the simulators it runs; `alone` is the control: one simulator of the summed ceiling as
#: a tier's own endpoint (no `deployments`): what pacing 140 requests/s costs in 429s on this
#: machine in the same run, without deployments
ROW_RATES = {"share": RATES, "kill": RATES, "alone": {"one": sum(RATES.values())}}


def faults(rate: int) -> dict[str, Any]:
    return {"seed": rate, "latency_ms": 50, "capacity": 16, "rate_window_s": 1.0, "rpm": rate}


def tier_file(sims: dict[str, SimProcess], *, deployments: bool) -> dict[str, Any]:
    tiers = tier_dict(f"{next(iter(sims.values())).base}/v1", batching=False)
    tier = tiers["tiers"][TIER]
    if deployments:
        tier["deployments"] = [{"name": name, "base_url": f"{sim.base}/v1"} for name, sim in sims.items()]
    # a killed deployment's circuit: probed every second at most, so its return is seen at once
    tier["retry"] = {**tier["retry"], "circuit_probe_s": 0.5, "circuit_probe_max_s": 1.0}
    return tiers


def _at_s(outcome: Outcome) -> float:
    assert outcome.completed_at is not None
    return datetime.fromisoformat(outcome.completed_at.replace("Z", "+00:00")).timestamp()


def steady_rate(results: list[Outcome], n: int) -> float | None:
    """Answers per second between 10% and 90% of the `n` jobs answered."""
    times = sorted(_at_s(o) for o in results)
    if len(times) < 0.9 * n:
        return None
    t10, t90 = times[round(0.1 * n)], times[round(0.9 * n) - 1]
    return 0.8 * n / (t90 - t10) if t90 > t10 else None


def shares(results: list[Outcome]) -> dict[str, float]:
    """Each deployment's share of `results` over its share of the ceiling."""
    counts = Counter(o.deployment for o in results)
    total = sum(counts.values())
    return {
        name: round((counts[name] / total) / (rate / CEILING_PER_S), 3) if total else 0.0
        for name, rate in RATES.items()
    }


async def wait_for_partitions(settings: Settings, proc: ServiceProcess, timeout_s: float) -> None:
    """Until the service's stats snapshot shows it owns every partition (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"the service exited: {proc.log_tail()}")
        snaps = [s for s in (await latest_stats(settings)).values() if time.time() - s["updated_at"] < 3]
        if snaps and len(snaps[0].get("lag", [])) == PARTITIONS:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the service did not own its partitions within {timeout_s:.0f} s")


async def run_row(name: str, n: int, bootstrap: str, workdir: Path) -> dict[str, Any]:
    env = service_env(bootstrap, partitions=PARTITIONS, PROMPTBUS_SHUTDOWN_TIMEOUT_S="10")
    settings = settings_from_env(env)
    await ensure_topics(settings)
    rates = ROW_RATES[name]
    ceiling_per_s = float(sum(rates.values()))
    sims = {d: SimProcess(faults(r), workdir / f"sim-{name}-{d}.log") for d, r in rates.items()}
    for sim in sims.values():
        await sim.__aenter__()
    proc = ServiceProcess(
        env, tier_file(sims, deployments=name != "alone"), workdir, name=f"deployments-{name}"
    )
    proc.log_path.unlink(missing_ok=True)
    jobs = make_jobs(n, batched_share=0.0, seed=3)
    out: dict[str, Any] = {"jobs": n, "ceiling_per_s": ceiling_per_s, "rates_per_s": rates}
    try:
        proc.start()
        await wait_for_partitions(settings, proc, 120)
        for sim in sims.values():
            await sim.reset()
        async with OutcomeFollower(settings) as follower:
            await submit_jobs(
                settings, (orjson.dumps(j) for j in jobs), key_of=lambda v: orjson.loads(v)["id"].encode()
            )
            if name == "kill":
                out.update(await kill_and_restart(sims, follower, workdir, n))
            answered = await follower.wait_for_ids({j["id"] for j in jobs}, timeout_s=max(180.0, 4 * n / 100))
            await follower.settle()
            results = follower.results()
            out["all_answered"] = answered
            out["answered"] = len({o.job_id for o in results})
            out["dead_letters"] = len({o.job_id for o in follower.dead_letters()})
            out["duplicates"] = follower.duplicates()
        if name != "kill":
            rate = steady_rate(results, n)
            out["steady_rate_per_s"] = round(rate, 2) if rate else None
            out["rate_vs_ceiling"] = round(rate / ceiling_per_s, 3) if rate else None
            if name == "share":
                out["share_vs_ceiling_share"] = shares(results)
            stats = [await sim.stats() for sim in sims.values()]
            out["by_deployment"] = {
                d: {"requests": st["requests"], "status_429": st["status_429"]}
                for d, st in zip(sims, stats, strict=True)
            }
            requests, rejected = sum(s["requests"] for s in stats), sum(s["status_429"] for s in stats)
            out["requests"], out["status_429"] = requests, rejected
            out["share_429"] = round(rejected / requests, 4) if requests else None
        else:
            killed_s, back_s = out["killed_at_s"], out["restarted_at_s"]
            out["answered_by_killed_while_dead"] = sum(
                1 for o in results if o.deployment == KILLED and killed_s < _at_s(o) < back_s
            )
            back_first = min(
                (_at_s(o) for o in results if o.deployment == KILLED and _at_s(o) > back_s), default=None
            )
            out["back_after_restart_s"] = round(back_first - back_s, 2) if back_first else None
            after = [o for o in results if back_first is not None and _at_s(o) >= back_first]
            out["answers_after_back"] = len(after)
            out["share_vs_ceiling_share_after_back"] = shares(after)
            out["share_vs_ceiling_share_while_dead"] = shares(
                [o for o in results if killed_s < _at_s(o) < back_s]
            )
    finally:
        proc.terminate(timeout_s=30)
        proc.ensure_stopped()
        for sim in sims.values():
            await sim.__aexit__(None, None, None)
    out["met"] = verdict(name, out)
    return out


async def kill_and_restart(
    sims: dict[str, SimProcess], follower: OutcomeFollower, workdir: Path, n: int
) -> dict[str, Any]:
    """SIGKILL the fastest deployment once KILL_AT jobs are answered; start it again on its port
    once BACK_AT are."""
    timeout_s = max(180.0, 4 * n / 100)
    await follower.wait_for_count(KILL_AT, timeout_s=timeout_s)
    victim = sims[KILLED]
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait(timeout=30)
    killed_s = time.time()
    _progress("killed %s at %d outcomes", KILLED, len(follower.outcomes))
    await follower.wait_for_count(BACK_AT, timeout_s=timeout_s)
    await victim.__aexit__(None, None, None)
    again = SimProcess(victim.faults, workdir / f"sim-kill-{KILLED}-again.log", port=victim.port)
    await again.__aenter__()
    sims[KILLED] = again
    restarted_s = time.time()
    _progress("started %s again at %d outcomes", KILLED, len(follower.outcomes))
    return {"killed_at_s": killed_s, "restarted_at_s": restarted_s}


def _within(value: Any) -> bool:
    return isinstance(value, float) and TARGET_SHARE[0] <= value <= TARGET_SHARE[1]


def verdict(name: str, row: dict[str, Any]) -> bool | None:
    """Whether a row met its targets (None: the control row, measured only)."""
    if name == "alone":
        return None
    done = bool(row.get("all_answered")) and row.get("dead_letters") == 0
    if name == "share":
        rate, rejected = row.get("rate_vs_ceiling"), row.get("share_429")
        return bool(
            done
            and rate is not None
            and rate >= TARGET_RATE
            and rejected is not None
            and rejected <= TARGET_429
            and all(_within(v) for v in row["share_vs_ceiling_share"].values())
        )
    return bool(
        done
        and row.get("answered_by_killed_while_dead") == 0
        and row.get("back_after_restart_s") is not None
        and _within(row["share_vs_ceiling_share_after_back"][KILLED])
    )


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The rows as bench/README.md shows them."""
    lines = [
        "| row | jobs | rate / ceiling | share / ceiling share (d20, d40, d80) | 429 share | answered "
        "| dead letters | by d80 while dead | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | {r.get('jobs')} | error: {r['error']} | | | | | | |")
            continue
        key = "share_vs_ceiling_share" if name == "share" else "share_vs_ceiling_share_after_back"
        split = (
            ", ".join(str(r.get(key, {}).get(d)) for d in RATES)
            if name != "alone"
            else "- (one endpoint of 140/s)"
        )
        if name == "kill":
            split += f" (after it is back, {r.get('back_after_restart_s')} s after its restart)"
        share_429 = r.get("share_429")
        lines.append(
            f"| {name} | {r['jobs']} | {r.get('rate_vs_ceiling', '-')} | {split} "
            f"| {'-' if share_429 is None else f'{share_429:.2%}'} | {r.get('answered')}/{r['jobs']} "
            f"| {r.get('dead_letters')} | {r.get('answered_by_killed_while_dead', '-')} "
            f"| {'-' if r.get('met') is None else 'yes' if r.get('met') else 'NO'} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    workdir = REPO_ROOT / "bench" / "out" / "deployments"
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "bench": "deployments_bench",
        "targets": {
            "rate_vs_ceiling": TARGET_RATE,
            "share_vs_ceiling_share": TARGET_SHARE,
            "share_429": TARGET_429,
        },
        "rows": {},
    }
    sizes = {"share": args.jobs, "kill": args.kill_jobs, "alone": args.alone_jobs}
    for name in args.rows:
        _progress("row %s: %d jobs", name, sizes[name])
        try:
            row = await run_row(name, sizes[name], bootstrap, workdir)
        except Exception as exc:  # one row's failure is reported, the others still run
            logging.exception("row %s failed", name)
            row = {"jobs": sizes[name], "error": f"{type(exc).__name__}: {exc}", "met": False}
        report["rows"][name] = row
        _progress("row %s: %s", name, row)
    report["table"] = table(report["rows"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="share,alone,kill", help="comma list of rows: share, alone, kill")
    parser.add_argument("--jobs", type=int, default=6000, help="jobs of the share row")
    parser.add_argument("--kill-jobs", type=int, default=4000, help="jobs of the kill row")
    parser.add_argument("--alone-jobs", type=int, default=6000, help="jobs of the alone row (the control)")
    add_save_option(parser)
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROW_RATES]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROW_RATES)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    report = asyncio.run(main_async(args))
    print(report["table"], file=sys.stderr)
    emit_report(report, args.save, name="deployments_bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
