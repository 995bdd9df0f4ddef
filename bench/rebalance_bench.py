"""Rebalance bench: what a scale out, a scale in and a rolling restart cost a group whose
answers take seconds.

    .venv/bin/python bench/rebalance_bench.py [--answer-ms 6000] [--membership dynamic|static]
                                              [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON object
on stdout (`--save`: also bench/results/NAME.json, default rebalance_bench_<answer-ms>_<membership>);
progress goes to stderr.

The run: a fresh 12-partition jobs topic and group; the simulator (its own process) answers
every request in `--answer-ms` with a capacity of 256; three `promptbus run` processes join
and the bench waits until they share the 12 partitions. Then jobs (batch-eligible, one tier)
are produced at a steady 20 a second for 100 s, and the group changes three times:

    25 s  scale out 3 -> 6    three more processes start
    50 s  scale in 6 -> 3     the three newest get SIGTERM together (as KEDA scales a Deployment in)
    75 s  rolling restart     dynamic: a replacement starts and the oldest gets SIGTERM (a
                              Deployment's surge); static (PROMPTBUS_INSTANCE_ID per process):
                              the oldest gets SIGTERM and, once it has exited, starts again
                              under the same name (a StatefulSet's pod)

Every job's latency is its first outcome's record timestamp minus the time it was produced.
Per change (its window runs to the next change, or to the end of production):

- `longest_silence_s`: the longest time with no outcome at all from the whole group, from the
  change to the end of its window (steady: the same over 5..25 s);
- `p99_before_s`: the steady p99 (jobs produced from 5 s to one answer time before the scale
  out, three instances, no change: those produced later are in flight at the scale out, and
  count in its span; until the hand-over change the steady span ran to 25 s, so when the
  processes started fast enough for the scale out to move partitions within an answer time of
  25 s, its redone jobs raised the "steady" p99 to two answer times);
  `p99_after_s` / `p50_after_s` / `max_after_s`: jobs produced from one answer time before the
  change (those in flight at it) to one answer time before the next;
- `duplicates`: outcomes beyond the first of the jobs of that span; `lost`: jobs of it with no
  outcome when the run ends (bounded wait of 120 s after the last job);
- `redone`: input records read more than once by the group during the window (the sum of every
  instance's `items_in` from the stats topic minus the jobs produced; stats go out every
  0.25 s, so a window's figure is within a few records); `redone_total` is exact;
- `phases`: from the processes' logs: `detect_s` (the change to the first member's revoke:
  a new process's start, or a leaving one's drain, plus a heartbeat), `spread_s` (the first
  member's revoke to the last one's: each learns of the rebalance at its next heartbeat),
  `revoke_s` (the longest revoke), `join_sync_s` (the last revoke's end to the first
  assignment), `pause_s` (the first revoke to the last assignment: how long the first member
  held its outcomes) and `members` (members that took part).

Targets with 6 s answers: longest silence <= 3 s, p99 after <= steady p99 + 3 s, 0 lost,
duplicates <= 1% of the jobs, for every change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from pipeline_bench import SimProcess

from consumer.kafka.admin import ensure_topics
from consumer.kafka.connection import client_kwargs
from consumer.settings import Settings
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.faultrun import latest_stats
from consumer.testing.harness import job, service_env, settings_from_env
from consumer.testing.outcomes import Outcome, OutcomeFollower
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess, stop_gracefully

PARTITIONS = 12
RATE_PER_S = 20
INSTANCES = 3
CAPACITY = 256
#: when the group changes (s after production starts), and when production ends
CHANGES_S = {"scale_out": 25.0, "scale_in": 50.0, "rolling_restart": 75.0}
END_S = 100.0
STEADY_FROM_S = 5.0
#: bounded waits: the first three to share the partitions, every job to have an outcome
JOIN_WAIT_S, OUTCOME_WAIT_S = 120.0, 120.0
SILENCE_TARGET_S, P99_MARGIN_S, DUPLICATE_TARGET = 3.0, 3.0, 0.01
WORKDIR = REPO_ROOT / ".local" / "rebalance_bench"

log = logging.getLogger("rebalance_bench")
_DONE_IN = re.compile(r"revoke done in ([0-9.]+) s")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ consumer\.runtime\.pipeline: (.*)$")


def tier_file(base_url: str, answer_ms: int) -> dict[str, Any]:
    """One tier on the simulator; windows of 100 ms; a limiter that starts where the load is."""
    return {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": answer_ms / 1000 * 2 + 5,
                "batching": {"enabled": True, "max_items": 20, "window_ms": 100, "max_wait_ms": 2000},
                "limiter": {"algorithm": "aimd", "initial": 64, "min": 1, "max": 256},
                "retry": {"max_attempts": 10, "backoff_initial_s": 0.5, "backoff_max_s": 10},
            }
        }
    }


@dataclass
class Fleet:
    """The run's `promptbus run` processes by name; with static membership each has its name
    as PROMPTBUS_INSTANCE_ID."""

    env: dict[str, str]
    tiers: dict[str, Any]
    static: bool
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    every: list[ServiceProcess] = field(default_factory=list)
    started: int = 0

    def start(self, name: str | None = None) -> str:
        name = name or f"pb-{self.started}"
        self.started += 1
        env = {**self.env, "PROMPTBUS_INSTANCE_ID": name} if self.static else self.env
        proc = ServiceProcess(env, self.tiers, WORKDIR, name=f"{name}.{self.started}")
        proc.start()
        self.procs[name] = proc
        self.every.append(proc)
        return name

    async def stop(self, names: list[str]) -> None:
        """SIGTERM these together and wait for their drains."""
        procs = [self.procs.pop(n) for n in names]
        await asyncio.gather(*(stop_gracefully(p, 60) for p in procs))

    async def wait_shared(self) -> bool:
        """Until the running processes' latest assignments cover every partition (bounded)."""
        deadline = time.monotonic() + JOIN_WAIT_S
        while time.monotonic() < deadline:
            latest = [p.assignment() for p in self.procs.values()]
            if all(latest) and set().union(*latest) == set(range(PARTITIONS)):  # type: ignore[arg-type]
                return True
            await asyncio.sleep(0.2)
        return False


async def produce(settings: Settings, t0: float, sent_s: dict[str, float]) -> None:
    """RATE_PER_S jobs a second until END_S; each job's send time into `sent_s`."""
    producer = AIOKafkaProducer(**client_kwargs(settings), linger_ms=0)
    await producer.start()
    try:
        for i in range(int(END_S * RATE_PER_S)):
            await asyncio.sleep(max(0.0, t0 + i / RATE_PER_S - time.time()))
            body = job(i, batch=True)
            sent_s[body["id"]] = time.time()
            await producer.send(settings.jobs_topic, orjson.dumps(body), key=body["id"].encode())
        await producer.flush()
    finally:
        await producer.stop()


async def change(fleet: Fleet, what: str) -> None:
    """One membership change (see the module docstring)."""
    running = list(fleet.procs)
    if what == "scale_out":
        for _ in range(INSTANCES):
            fleet.start()
    elif what == "scale_in":
        await fleet.stop(running[-INSTANCES:])
    elif fleet.static:
        await fleet.stop(running[:1])
        fleet.start(running[0])
    else:
        fleet.start()
        await fleet.stop(running[:1])


async def reads(settings: Settings) -> int:
    """Input records read by every instance run so far (their latest stats snapshots)."""
    return sum(int(s.get("items_in", 0)) for s in (await latest_stats(settings)).values())


async def run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    env = service_env(
        bootstrap,
        partitions=PARTITIONS,
        PROMPTBUS_STATS_INTERVAL_S="0.25",
        PROMPTBUS_SHUTDOWN_TIMEOUT_S="30",
        PROMPTBUS_REVOKE_TIMEOUT_S="10",
    )
    settings = settings_from_env(env)
    await ensure_topics(settings)
    shutil.rmtree(WORKDIR, ignore_errors=True)  # the logs are read back: this run's only
    WORKDIR.mkdir(parents=True, exist_ok=True)
    faults = {"seed": 1, "latency_ms": args.answer_ms, "capacity": CAPACITY}
    async with SimProcess(faults, WORKDIR / "simulator.log") as sim:
        fleet = Fleet(env, tier_file(sim.base, args.answer_ms), args.membership == "static")
        try:
            for _ in range(INSTANCES):
                fleet.start()
            if not await fleet.wait_shared():
                raise RuntimeError("the first instances did not share the partitions in time")
            async with OutcomeFollower(settings) as follower:
                return await _timeline(settings, fleet, follower, args)
        finally:
            for proc in fleet.every:
                proc.ensure_stopped()


async def _timeline(
    settings: Settings, fleet: Fleet, follower: OutcomeFollower, args: argparse.Namespace
) -> dict[str, Any]:
    sent_s: dict[str, float] = {}
    t0 = time.time() + 1.0
    producing = asyncio.create_task(produce(settings, t0, sent_s))
    changed_s: dict[str, float] = {}
    redone_at: dict[str, int] = {}
    for what, at_s in CHANGES_S.items():
        await asyncio.sleep(max(0.0, t0 + at_s - time.time()))
        redone_at[what] = await reads(settings) - len(sent_s)
        changed_s[what] = time.time()
        print(f"{at_s:5.1f} s: {what}", file=sys.stderr)
        await change(fleet, what)
    await producing
    answered = await follower.wait_for_ids(set(sent_s), timeout_s=OUTCOME_WAIT_S)
    await asyncio.sleep(1.0)  # the last stats snapshots
    redone_at["end"] = await reads(settings) - len(sent_s)
    await fleet.stop(list(fleet.procs))
    print(f"every job answered: {answered}", file=sys.stderr)
    return summarize(sent_s, list(follower.outcomes), t0, changed_s, redone_at, fleet, args.answer_ms / 1000)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _silence(times: list[float], start: float, end: float) -> float:
    """The longest gap between outcomes within [start, end) (the edges count as outcomes)."""
    inside = [start] + [t for t in times if start <= t < end] + [end]
    return round(max(b - a for a, b in itertools.pairwise(inside)), 3)


def _span(
    sent_s: dict[str, float], first: dict[str, float], counts: dict[str, int], start: float, end: float
) -> dict[str, Any]:
    ids = [j for j, t in sent_s.items() if start <= t < end]
    latencies = [first[j] - sent_s[j] for j in ids if j in first]
    return {
        "jobs": len(ids),
        "p50_s": _percentile(latencies, 0.50),
        "p99_s": _percentile(latencies, 0.99),
        "max_s": round(max(latencies), 3) if latencies else None,
        "duplicates": sum(counts.get(j, 0) - 1 for j in ids if counts.get(j, 0) > 1),
        "lost": sum(1 for j in ids if j not in first),
    }


def summarize(
    sent_s: dict[str, float],
    outcomes: list[Outcome],
    t0: float,
    changed_s: dict[str, float],
    redone_at: dict[str, int],
    fleet: Fleet,
    answer_s: float,
) -> dict[str, Any]:
    first: dict[str, float] = {}
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.job_id] = counts.get(o.job_id, 0) + 1
        first[o.job_id] = min(first.get(o.job_id, float("inf")), o.timestamp_ms / 1000)
    times = sorted(o.timestamp_ms / 1000 for o in outcomes)
    # steady ends where the scale out's span begins: a job produced later is still in flight
    # at the change, and its latency is the change's
    steady_until = changed_s.get("scale_out", t0 + CHANGES_S["scale_out"]) - answer_s
    steady = _span(sent_s, first, counts, t0 + STEADY_FROM_S, steady_until)
    steady["longest_silence_s"] = _silence(times, t0 + STEADY_FROM_S, t0 + CHANGES_S["scale_out"])
    events = _log_events(fleet)
    names = list(changed_s)
    changes: dict[str, Any] = {}
    for i, what in enumerate(names):
        at = changed_s[what]
        until = changed_s[names[i + 1]] if i + 1 < len(names) else t0 + END_S
        after = _span(sent_s, first, counts, at - answer_s, until - answer_s)
        next_redone = redone_at[names[i + 1]] if i + 1 < len(names) else redone_at["end"]
        changes[what] = {
            "longest_silence_s": _silence(times, at, until),
            "p99_before_s": steady["p99_s"],
            "p99_after_s": after["p99_s"],
            "p50_after_s": after["p50_s"],
            "max_after_s": after["max_s"],
            "jobs": after["jobs"],
            "duplicates": after["duplicates"],
            "lost": after["lost"],
            "redone": next_redone - redone_at[what],
            "phases": _phases(events, at, until),
        }
        changes[what]["meets_targets"] = _meets(changes[what], steady, answer_s)
    total_dups = sum(c - 1 for c in counts.values() if c > 1)
    return {
        "answer_ms": round(answer_s * 1000),
        "membership": "static" if fleet.static else "dynamic",
        "jobs": len(sent_s),
        "lost": sum(1 for j in sent_s if j not in first),
        "duplicates": total_dups,
        "redone_total": redone_at["end"],
        "steady": steady,
        "changes": changes,
    }


def _meets(row: dict[str, Any], steady: dict[str, Any], answer_s: float) -> bool | None:
    """The issue's targets hold for this change (None: they are set for 6 s answers only)."""
    if round(answer_s) != 6 or row["p99_after_s"] is None or steady["p99_s"] is None:
        return None
    return bool(
        row["longest_silence_s"] <= SILENCE_TARGET_S
        and row["p99_after_s"] <= steady["p99_s"] + P99_MARGIN_S
        and row["lost"] == 0
        and row["duplicates"] <= DUPLICATE_TARGET * row["jobs"]
    )


def _log_events(fleet: Fleet) -> list[tuple[float, str, str]]:
    """(time, process log, pipeline message) of every rebalance line of every process."""
    out: list[tuple[float, str, str]] = []
    for proc in fleet.every:
        path: Path = proc.log_path
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m is None:
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, path.name, m.group(2)))
    return sorted(out)


def _phases(events: list[tuple[float, str, str]], start: float, end: float) -> dict[str, Any]:
    """The rebalance phases seen in the logs between `start` and `end` (first rebalance only)."""
    inside = [e for e in events if start <= e[0] < end]
    starts = ("rebalance: ", "revoked [")  # this tree's revoke, and the one before it
    revokes = [t for t, _, msg in inside if msg.startswith(starts) and "done in" not in msg]
    done = [t for t, _, msg in inside if "revoke done in" in msg]
    took = [float(m.group(1)) for _, _, msg in inside if (m := _DONE_IN.search(msg))]
    assigned = [t for t, _, msg in inside if msg.startswith("assigned [")]
    if not assigned:
        return {"members": 0}
    first_assigned = min(assigned)
    # the first rebalance only: its revokes come before its first assignment
    revokes = [t for t in revokes if t <= first_assigned]
    done = [t for t in done if t <= first_assigned]
    last_assigned = max(t for t in assigned if t - first_assigned < 5.0)
    out: dict[str, Any] = {"members": len({p for t, p, m in inside if m.startswith("assigned [")})}
    if revokes:
        out["detect_s"] = round(min(revokes) - start, 3)
        out["pause_s"] = round(last_assigned - min(revokes), 3)
        out["spread_s"] = round(max(revokes) - min(revokes), 3)
        out["revoke_s"] = max(took) if took else None
        out["join_sync_s"] = round(first_assigned - max(done or revokes), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answer-ms", type=int, default=6000)
    parser.add_argument("--membership", choices=("dynamic", "static"), default="dynamic")
    add_save_option(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    report = asyncio.run(run(args, bootstrap))
    with contextlib.suppress(Exception):
        for what, row in report["changes"].items():
            print(f"{what:16} {row}", file=sys.stderr)
    emit_report(report, args.save, name=f"rebalance_bench_{args.answer_ms}_{args.membership}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
