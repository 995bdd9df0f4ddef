"""Network faults on a steady stream: the fault tests' and `bench/netfaults.py`'s one runner.

`run_fault(rig, fault, ...)` runs the service in-process with its provider link and its broker
links through Toxiproxy (`NetRig`), produces a steady stream of jobs on the direct listeners,
waits until results flow, applies one `Fault` for its duration, and then waits (bounded) until
every job has an outcome. The test's own clients (the stream, the outcome follower, the commit
snapshots) use the direct listeners, so what they see is never the fault's doing.

While the fault and the recovery run it snapshots the group's commits and the outcome topics'
ends every `SNAPSHOT_EVERY_S` (`faultrun.kill_snapshot`): an input offset a commit covers must
have an outcome created (its record timestamp) before that commit's read ended
(`committed_ahead`), which is what
"no offset is committed ahead of its outcome" means, checked while the fault is on.

The report (`FaultReport`) gives per fault the jobs in flight when it began, lost, duplicated
and dead-lettered jobs, wrong answers, whether work flowed again within the bound after the
fault ended (and how long it took), and the service's stats before, at the end of, and after
the fault, for the test to check what it expects to see happen (a retry, a circuit opened).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from consumer.kafka.admin import ensure_topics
from consumer.settings import Settings
from consumer.testing.faultrun import KillSnapshot, kill_snapshot
from consumer.testing.harness import (
    InProcessService,
    JobStream,
    job,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.netcluster import ProxiedKafka, cut, toxics
from consumer.testing.outcomes import Outcome, OutcomeFollower
from consumer.testing.simulator import answer_for
from consumer.testing.toxiproxy import Link

__all__ = [
    "FAULTS",
    "Fault",
    "FaultReport",
    "NetRig",
    "ScheduleReport",
    "committed_ahead",
    "fault_tiers",
    "rig_settings",
    "run_fault",
    "run_schedule",
]

#: how often the group's commits are read while a fault and its recovery run
SNAPSHOT_EVERY_S = 1.0
#: results that must arrive after a fault ends for work to count as flowing again
FLOWING_AGAIN = 20
#: results before the fault begins: the service has joined and answers
WARMUP_RESULTS = 50
#: what a client sent just before a fault may still land this long into it
FAULT_SETTLE_S = 1.0


@dataclass(frozen=True)
class NetRig:
    """Where the faults act: the provider's link and the cluster's links. `node` is the node
    a node fault cuts off."""

    provider: Link
    cluster: ProxiedKafka
    node: int = 1


@dataclass(frozen=True)
class Fault:
    """One network fault: applied for `duration_s` by entering `apply(rig)`."""

    name: str
    duration_s: float
    apply: Callable[[NetRig], AbstractContextManager[None]]
    #: what it does, for reports
    what: str = ""


def _fault(
    name: str, duration_s: float, what: str, apply: Callable[[NetRig], AbstractContextManager[None]]
) -> Fault:
    return Fault(name, duration_s, apply, what)


#: every network fault the tests and the loop inject, by name (docs/operations.md, "Network
#: faults", says what promptbus does under each)
FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        _fault("provider_latency", 20.0, "500 ms on every provider answer",
               lambda r: r.provider.toxic("latency", "latency", latency=500)),
        _fault("provider_half_open", 10.0, "provider answers swallowed, connections left open",
               lambda r: r.provider.toxic("half_open", "timeout", timeout=0)),
        # the slicer passes the first 120 bytes of an answer (its head, ~110 bytes, and the
        # start of its body), then holds the rest for a minute: status 200 read, the body stalls
        _fault("provider_stalled_body", 10.0, "provider answers stop early in their body, connections open",
               lambda r: r.provider.toxic("stalled_body", "slicer", average_size=120, size_variation=0,
                                          delay=60_000_000)),
        _fault("provider_reset", 10.0, "half the provider connections reset (RST) as answers come",
               lambda r: r.provider.toxic("reset", "reset_peer", timeout=0, toxicity=0.5)),
        _fault("provider_trickle", 15.0, "provider answers at 10 KB/s",
               lambda r: r.provider.toxic("trickle", "bandwidth", rate=10)),
        _fault("provider_down", 30.0, "provider connections refused",
               lambda r: r.provider.cut()),
        _fault("broker_latency", 20.0, "300 ms on every broker answer",
               lambda r: toxics(r.cluster.broker_links(), "latency", "latency", latency=300)),
        _fault("broker_half_open", 8.0, "broker answers swallowed, connections left open",
               lambda r: toxics(r.cluster.broker_links(), "half_open", "timeout", timeout=0)),
        _fault("brokers_down", 20.0, "every broker's connections refused",
               lambda r: cut(r.cluster.broker_links())),
        _fault("node_cut", 20.0, "one node cut off from clients and controllers",
               lambda r: cut(r.cluster.node_links(r.node))),
    )
}


@dataclass
class FaultReport:
    """What one fault run saw (module docstring)."""

    fault: str
    jobs: int
    #: jobs the service held (read, not finished) or sent without an outcome when the fault began
    in_flight: int = 0
    lost: int = 0
    duplicates: int = 0
    dead: int = 0
    wrong: int = 0
    #: outcome records read (by the direct follower) while the fault was on
    during: int = 0
    #: outcome records the broker took from FAULT_SETTLE_S into the fault to its end
    #: (transaction markers included: both ends are log end offsets)
    written_during: int = 0
    #: whether FLOWING_AGAIN results came within the bound after the fault ended, and when
    flowing_again: bool = False
    recover_s: float | None = None
    finished: bool = False
    #: when the fault began (ms since the epoch)
    started_ms: int = 0
    #: whether the service still ran when the fault ended (it must not exit over a fault)
    running_after_fault: bool = False
    #: commit snapshots read, and the input offsets a commit covered before their outcome
    snapshots: int = 0
    ahead: list[tuple[int, int]] = field(default_factory=list)
    #: the service's stats when the fault began, when it ended, and at the end
    before: dict[str, Any] = field(default_factory=dict)
    at_end_of_fault: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    #: what the run's probe saw at the fault's end
    probe: Any = None

    def summary(self) -> dict[str, Any]:
        """The figures, without the stats snapshots (for printing)."""
        keep = ("fault", "jobs", "in_flight", "lost", "duplicates", "dead", "wrong", "during",
                "written_during",
                "flowing_again", "recover_s", "finished", "running_after_fault", "snapshots")
        return {k: getattr(self, k) for k in keep} | {"ahead": len(self.ahead)}


def committed_ahead(outcomes: list[Outcome], snapshots: list[KillSnapshot]) -> list[tuple[int, int]]:
    """(partition, offset) of inputs a snapshot's commit covered while no outcome of theirs
    had been written before that snapshot was read."""
    first_ms: dict[tuple[int, int], int] = {}
    for o in outcomes:
        key = (o.source_partition, o.source_offset)
        first_ms[key] = min(first_ms.get(key, o.timestamp_ms), o.timestamp_ms)
    ahead: set[tuple[int, int]] = set()
    for snap in snapshots:
        for partition, (offset, done, _) in snap.committed.items():
            covered = [(partition, o) for o in range(offset)] + [(partition, o) for o in done]
            for key in covered:
                written = first_ms.get(key)
                if written is None or written > snap.at_ms:
                    ahead.add(key)
    return sorted(ahead)


def fault_tiers(rig: NetRig, **tier: Any) -> dict[str, Any]:
    """The tier on the rig's provider link: batches of up to 10, a 2 s request timeout,
    6 attempts, quick circuit probes (other keywords: the tier's own keys)."""
    return tier_file_dict(
        f"http://{rig.provider.address}/v1",
        max_items=10,
        timeout_s=tier.pop("timeout_s", 2),
        limiter={"algorithm": "aimd", "initial": 8, "min": 1, "max": 32},
        retry={"max_attempts": 6, "backoff_initial_s": 0.05, "backoff_max_s": 1,
               "circuit_probe_s": 0.5, "circuit_probe_max_s": 2},
        **tier,
    )


def rig_settings(rig: NetRig, **env: Any) -> tuple[Settings, Settings]:
    """(the service's settings, through path 1's proxies; the test's, direct): same topics."""
    service = service_env(rig.cluster.proxied(), **env)
    direct = service | {"KAFKA_BOOTSTRAP_SERVERS": rig.cluster.direct}
    return settings_from_env(service), settings_from_env(direct)


async def commit_snapshot(settings: Settings) -> KillSnapshot:
    """The group's commits and the outcome topics' ends, stamped with when the read ENDED: a
    commit it saw was made by then, so an outcome created after that stamp came after it."""
    snap = await kill_snapshot(settings)
    return dataclasses.replace(snap, at_ms=int(time.time() * 1000))


async def _snapshot_until(settings: Settings, stop: asyncio.Event, into: list[KillSnapshot]) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a snapshot that fails is skipped, not a verdict
            into.append(await commit_snapshot(settings))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SNAPSHOT_EVERY_S)


@dataclass
class ScheduleReport:
    """A run of several faults: one `FaultReport` per fault (its figures over its window: from
    its start to the next fault's) and the totals over the run."""

    faults: list[FaultReport]
    totals: FaultReport


async def run_fault(
    rig: NetRig,
    fault: Fault,
    tiers: dict[str, Any],
    *,
    jobs: int,
    rate_per_s: float = 100.0,
    batch_every: int = 2,
    finish_wait_s: float = 120.0,
    settings: tuple[Settings, Settings] | None = None,
    probe: Callable[[], Awaitable[Any]] | None = None,
    **env: Any,
) -> FaultReport:
    """One fault on a steady stream of `jobs` jobs at `rate_per_s` (module docstring); `env`
    holds extra PROMPTBUS_* settings of the service, or `settings` the service's and the
    direct ones (`rig_settings`). `probe` is awaited at the fault's end, while it is still on;
    its answer is the report's `probe`."""
    run = await run_schedule(
        rig, [(0.0, fault)], tiers, jobs=jobs, rate_per_s=rate_per_s, batch_every=batch_every,
        finish_wait_s=finish_wait_s, settings=settings, probe=probe, **env,
    )
    return run.faults[0]


async def run_schedule(
    rig: NetRig,
    schedule: Sequence[tuple[float, Fault]],
    tiers: dict[str, Any],
    *,
    jobs: int,
    rate_per_s: float = 100.0,
    batch_every: int = 2,
    finish_wait_s: float = 120.0,
    stop_stream_after_s: float | None = None,
    settings: tuple[Settings, Settings] | None = None,
    probe: Callable[[], Awaitable[Any]] | None = None,
    **env: Any,
) -> ScheduleReport:
    """Each fault of `schedule` after its gap (seconds after the previous one's recovery), on
    one steady stream of up to `jobs` jobs; the stream stops `stop_stream_after_s` after the
    last fault's recovery (None: when its jobs run out). Then every job sent must get its
    outcome (bounded by `finish_wait_s`)."""
    service_settings, direct = settings or rig_settings(rig, **env)
    await ensure_topics(direct)
    stream_jobs = [job(i, batch=i % batch_every != 0) for i in range(jobs)]
    stream = JobStream(direct, stream_jobs, chunk=max(1, int(rate_per_s / 10)), interval_s=0.1)
    windows: list[tuple[FaultReport, list[KillSnapshot]]] = []
    async with OutcomeFollower(direct) as follower, InProcessService(service_settings, tiers) as svc:
        feeding = asyncio.create_task(stream.run())
        finished = False
        try:
            await follower.wait(lambda: len(follower.results()) >= WARMUP_RESULTS, timeout_s=60)
            for gap_s, fault in schedule:
                await asyncio.sleep(gap_s)
                window = FaultReport(fault.name, 0)
                windows.append((window, []))
                await _apply_fault(rig, fault, svc, follower, stream, direct, window, windows[-1][1], probe)
            if stop_stream_after_s is not None:
                await asyncio.sleep(stop_stream_after_s)
                stream.stop.set()
            await feeding
            finished = await follower.wait_for_ids({j["id"] for j in stream.sent}, timeout_s=finish_wait_s)
        finally:
            stream.stop.set()
            await feeding
        after = svc.stats_snapshot()
    await _settled(direct, follower)
    return _schedule_report(windows, follower.outcomes, stream, finished, after)


async def _apply_fault(
    rig: NetRig,
    fault: Fault,
    svc: InProcessService,
    follower: OutcomeFollower,
    stream: JobStream,
    direct: Settings,
    report: FaultReport,
    snapshots: list[KillSnapshot],
    probe: Callable[[], Awaitable[Any]] | None,
) -> None:
    """Step 1: the fault for its duration, commits snapshotted; step 2: wait (bounded by the
    session + 5 s) for results to flow again, still snapshotting."""
    stop_snapshots = asyncio.Event()
    snapshotting = asyncio.create_task(_snapshot_until(direct, stop_snapshots, snapshots))
    try:
        report.before = svc.stats_snapshot()
        unanswered_sent = len({j["id"] for j in stream.sent} - follower.ids())
        report.in_flight = max(int(report.before["inflight"]), unanswered_sent)
        report.started_ms = int(time.time() * 1000)
        records_at_start = follower.records
        settle_s = min(FAULT_SETTLE_S, fault.duration_s / 2)
        with fault.apply(rig):
            # what reached the broker from a moment into the fault to its end (read direct)
            await asyncio.sleep(settle_s)
            first = await kill_snapshot(direct)
            await asyncio.sleep(max(0.0, fault.duration_s - settle_s))
            last = await kill_snapshot(direct)
            report.written_during = sum(last.ends.values()) - sum(first.ends.values())
            report.at_end_of_fault = svc.stats_snapshot()
            report.running_after_fault = svc.task is not None and not svc.task.done()
            if probe is not None:
                report.probe = await probe()
        ended = time.monotonic()
        records_at_end = follower.records
        report.during = records_at_end - records_at_start
        unanswered = len({j["id"] for j in stream.jobs} - follower.ids())
        wanted = records_at_end + min(FLOWING_AGAIN, unanswered)
        report.flowing_again = await follower.wait(
            lambda: follower.records >= wanted, timeout_s=direct.session_timeout_s + 5
        )
        if report.flowing_again:
            report.recover_s = round(time.monotonic() - ended, 2)
    finally:
        stop_snapshots.set()
        await snapshotting


async def _settled(direct: Settings, follower: OutcomeFollower) -> None:
    """Every outcome the stopped service wrote is read (bounded)."""
    async with OutcomeFollower(direct) as last:
        await last.settle()
        follower.outcomes[:] = last.outcomes


def _schedule_report(
    windows: list[tuple[FaultReport, list[KillSnapshot]]],
    outcomes: list[Outcome],
    stream: JobStream,
    finished: bool,
    after: dict[str, Any],
) -> ScheduleReport:
    """Totals over the run; per fault, the jobs sent and the extra copies written in its window
    (from its start to the next fault's; the first window from the run's start, the last to
    its end)."""
    expected = {j["id"]: answer_for(j["variables"]["text"]) for j in stream.sent}
    sent_ms = dict(zip([j["id"] for j in stream.sent], stream.sent_ms, strict=True))
    every = [snap for _, snaps in windows for snap in snaps]
    totals = FaultReport("all", len(expected), finished=finished, after=after)
    _tally(totals, outcomes, expected, every, outcomes)
    starts = [0] + [w.started_ms for w, _ in windows[1:]] + [2**62]
    for i, (window, snapshots) in enumerate(windows):
        lo, hi = starts[i], starts[i + 1]
        ids = {jid for jid, at in sent_ms.items() if lo <= at < hi}
        mine = [o for o in outcomes if o.job_id in ids]
        window.jobs = len(ids)
        window.finished, window.after = finished, after
        _tally(window, mine, {jid: expected[jid] for jid in ids}, snapshots, outcomes)
    return ScheduleReport([w for w, _ in windows], totals)


def _tally(
    report: FaultReport,
    outcomes: list[Outcome],
    expected: dict[str, str],
    snapshots: list[KillSnapshot],
    every_outcome: list[Outcome],
) -> None:
    """Counts over `outcomes` (the jobs of `expected`); commits ahead over `snapshots`, judged
    against every outcome of the run (a commit covers older windows' jobs too)."""
    seen = {o.job_id for o in outcomes}
    report.lost = len(set(expected) - seen)
    report.duplicates = len(outcomes) - len(seen)
    report.dead = sum(1 for o in outcomes if o.dead)
    report.wrong = sum(1 for o in outcomes if not o.dead and o.output != expected.get(o.job_id))
    report.snapshots = len(snapshots)
    report.ahead = committed_ahead(every_outcome, snapshots)
