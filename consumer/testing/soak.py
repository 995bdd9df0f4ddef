"""The soak: jobs at a steady rate through a 3-node cluster, with a schedule of faults.

`run_soak(SoakShape(minutes=30), workdir)` starts (unless it runs) the soak's own 3-node local
cluster (`SOAK_KAFKA_HOME`, ports 29092.. and 29192..; or runs on the `cluster` it is given),
the simulator in a background thread and one `promptbus run` process, then produces mixed chat
and batched jobs at `rate_per_s` while the schedule runs, each step at a share of the run:

    10%  instance a is SIGKILLed and restarted a second later
    25%  the broker node leading most of the jobs topic's partitions is SIGKILLed, and
         restarted `broker_down_s` later
    40%  the provider is out (every request 503) for `outage_s`
    55%  a 429 storm (most requests 429 + Retry-After) for `storm_s`
    65%  a second instance (b) joins the group; at 85%, once it holds partitions, it leaves
         (SIGTERM)
    all  a poison record (not JSON) every `poison_every` jobs

After the last minute it stops producing, waits (bounded) until every job has an outcome,
stops the instances and returns one row per minute: outcomes, lost, duplicates, dead letters
by kind (good jobs and poison apart) and each instance's resident memory and open file
descriptors (the largest of the minute's samples), and totals: besides the sums, each
instance's exit code on SIGTERM, the broker node killed, and the duplicates the SIGKILL of
instance a does not explain (`consumer.testing.faultrun.attribute_duplicates`: a kill may
redo what was acknowledged but not yet committed; anything else is a fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import job_producer
from consumer.settings import Settings
from consumer.testing.cluster import LocalKafka
from consumer.testing.faultrun import KillSnapshot, attribute_duplicates, era_of, kill_snapshot
from consumer.testing.harness import job, service_env, settings_from_env, tier_file_dict
from consumer.testing.outcomes import Outcome, OutcomeFollower
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess, open_fds, rss_bytes, stop_gracefully
from consumer.testing.simulator import SimulatorConfig, run_simulator

__all__ = ["SOAK_KAFKA_HOME", "SOAK_PORTS", "SoakShape", "run_soak", "soak_cluster", "soak_tiers"]

#: the soak's own cluster: apart from the 1-node broker (9092) and the test cluster (19092)
SOAK_KAFKA_HOME = REPO_ROOT / ".local" / "kafka-soak"
SOAK_PORTS = (29092, 29192)
#: a smaller heap per node than the script's default: three nodes beside the service
SOAK_HEAP = "-Xms128m -Xmx512m"
#: the simulator's normal service: 20-40 ms answers, a few 5xx
SOAK_PROVIDER = SimulatorConfig(seed=11, latency_ms=30, jitter_ms=10, error_rate=0.01)
#: batching, AIMD 4..32, retries and a circuit that holds jobs through an outage
SOAK_LIMITER = {"algorithm": "aimd", "initial": 4, "min": 1, "max": 32}
SOAK_RETRY = {"max_attempts": 12, "backoff_initial_s": 0.1, "backoff_max_s": 2.0}
POISON = b"{this is not json"
MB = 1024 * 1024
#: how long each instance may take to drain on SIGTERM, and b to be given partitions
STOP_WAIT_S = 60.0
JOIN_WAIT_S = 60.0
SAMPLE_EVERY_S = 2.0


@dataclass(frozen=True)
class SoakShape:
    minutes: float = 30.0
    rate_per_s: float = 20.0
    partitions: int = 4
    poison_every: int = 200
    broker_down_s: float = 10.0
    outage_s: float = 10.0
    storm_s: float = 10.0
    finish_wait_s: float = 180.0
    #: the service's consumer-group session (None: the service's default)
    session_timeout_s: float | None = None


def soak_cluster() -> LocalKafka:
    """The soak's own 3-node cluster (state in `SOAK_KAFKA_HOME`, ports `SOAK_PORTS`)."""
    return LocalKafka(SOAK_KAFKA_HOME, nodes=3, ports=SOAK_PORTS, heap=SOAK_HEAP)


def soak_tiers(base_url: str) -> dict[str, Any]:
    """One tier: batching, AIMD, retries and a circuit that holds jobs through an outage."""
    return tier_file_dict(
        base_url + "/v1", max_items=10, limiter=SOAK_LIMITER, timeout_s=2.0, retry=SOAK_RETRY
    )


@dataclass
class _Minute:
    produced: list[str] = field(default_factory=list)
    poison: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


async def run_soak(
    shape: SoakShape,
    workdir: Path,
    *,
    cluster: LocalKafka | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The soak (module docstring): {"minutes": [...rows], "totals": {...}}.

    cluster: a running 3-node cluster to soak (its owner starts and stops it); None: the
    soak's own, started here unless it runs, and stopped at the end when it was started here.
    """
    if cluster is not None:
        return await _SoakRun.run(shape, workdir, cluster, progress)
    own = soak_cluster()
    progress("starting the 3-node cluster")
    await asyncio.to_thread(own.start)
    try:
        return await _SoakRun.run(shape, workdir, own, progress)
    finally:
        if own.started_here:
            await asyncio.to_thread(own.stop)


async def _jobs_leader(cluster: LocalKafka, topic: str, partitions: int) -> tuple[int, int]:
    """The node leading most of `topic`'s partitions (the lowest id on a tie), and how many."""
    leaders = Counter([await cluster.leader_of(topic, p) for p in range(partitions)])
    leaders.pop(-1, None)
    if not leaders:
        raise RuntimeError(f"no partition of {topic} has a leader")
    node = min(leaders, key=lambda n: (-leaders[n], n))
    return node, leaders[node]


@dataclass
class _SoakRun:
    """One soak's state: what was produced per minute, the instances, the faults' notes."""

    shape: SoakShape
    settings: Settings
    cluster: LocalKafka
    base_url: str
    a: ServiceProcess
    b: ServiceProcess
    follower: OutcomeFollower
    progress: Callable[[str], None]
    minutes: list[_Minute]
    t0: float = field(default_factory=time.monotonic)
    #: the commits and outcome ends right after instance a was SIGKILLed
    kill: KillSnapshot | None = None
    killed_broker: int = -1
    exit_codes: dict[str, int] = field(default_factory=dict)

    @classmethod
    async def run(
        cls, shape: SoakShape, workdir: Path, cluster: LocalKafka, progress: Callable[[str], None]
    ) -> dict[str, Any]:
        session_s = shape.session_timeout_s
        session: dict[str, Any] = {} if session_s is None else {"PROMPTBUS_SESSION_TIMEOUT_S": session_s}
        env = service_env(
            cluster.bootstrap,
            partitions=shape.partitions,
            PROMPTBUS_STATS_INTERVAL_S=1,
            PROMPTBUS_TOPIC_REPLICATION=3,
            **session,
        )
        settings = settings_from_env(env)
        await ensure_topics(settings)
        count = max(1, int(-(-shape.minutes * 60 // 60)))
        with run_simulator(SOAK_PROVIDER) as base_url:
            tiers = soak_tiers(base_url)
            a = ServiceProcess(env, tiers, workdir, name="svc-a")
            b = ServiceProcess(env, tiers, workdir, name="svc-b")
            async with OutcomeFollower(settings) as follower:
                minutes = [_Minute() for _ in range(count)]
                soak = cls(shape, settings, cluster, base_url, a, b, follower, progress, minutes)
                finished = await soak.traffic_under_faults()
                return soak.report(finished)

    # ------------------------------------------------------------------ the run
    @property
    def total_s(self) -> float:
        return self.shape.minutes * 60

    def minute(self) -> _Minute:
        return self.minutes[min(len(self.minutes) - 1, int((time.monotonic() - self.t0) // 60))]

    def note(self, text: str) -> None:
        self.minute().events.append(text)
        self.progress(f"{time.monotonic() - self.t0:6.1f}s {text}")

    async def traffic_under_faults(self) -> bool:
        """Step 1: produce and sample while the schedule runs; step 2: wait for every outcome;
        step 3: stop the instances. True when every job got an outcome in time."""
        self.t0 = time.monotonic()
        self.a.start()
        sampling = asyncio.create_task(self.sample())
        try:
            await asyncio.gather(self.produce(), self.schedule())
            finished = await self.wait_for_outcomes()
            for name, svc in (("a", self.a), ("b", self.b)):
                if svc.alive():
                    self.exit_codes[name] = await stop_gracefully(svc, STOP_WAIT_S)
            await self.follower.settle()
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            self.a.ensure_stopped()
            self.b.ensure_stopped()
        return finished

    async def produce(self) -> None:
        """Jobs at `rate_per_s` (a poison record every `poison_every`) until the run's end."""
        producer = job_producer(self.settings)
        await producer.start()
        try:
            n = 0
            while time.monotonic() - self.t0 < self.total_s:
                n += 1
                if self.shape.poison_every and n % self.shape.poison_every == 0:
                    await producer.send(self.settings.jobs_topic, POISON)
                    self.minute().poison += 1
                else:
                    j = job(n, batch=n % 2 == 0)
                    await producer.send(self.settings.jobs_topic, orjson.dumps(j), key=j["id"].encode())
                    self.minute().produced.append(j["id"])
                await asyncio.sleep(max(0.0, self.t0 + n / self.shape.rate_per_s - time.monotonic()))
            await producer.flush()
        finally:
            await producer.stop()

    async def sample(self) -> None:
        """Each instance's RSS and open fds, the largest per minute."""
        while True:
            m = self.minute()
            for name, svc in (("a", self.a), ("b", self.b)):
                if svc.alive() and svc.pid is not None:
                    m.memory[name] = max(m.memory.get(name, 0), rss_bytes(svc.pid))
                    m.fds[name] = max(m.fds.get(name, 0), open_fds(svc.pid))
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def at(self, share: float) -> None:
        await asyncio.sleep(max(0.0, self.t0 + share * self.total_s - time.monotonic()))

    async def schedule(self) -> None:
        """The faults, in order (module docstring)."""
        await self.at(0.10)
        await self.kill_instance_a()
        await self.at(0.25)
        await self.kill_the_jobs_leader()
        await self.at(0.40)
        await self.provider_fault(
            "provider outage (every request 503)", "overload_rate", 1.0, self.shape.outage_s
        )
        await self.at(0.55)
        await self.provider_fault("429 storm", "shared_429_rate", 0.8, self.shape.storm_s)
        await self.at(0.65)
        self.b.start()
        self.note("instance b joins")
        await self.at(0.85)
        await self.instance_b_leaves()

    # ------------------------------------------------------------------ the faults
    async def kill_instance_a(self) -> None:
        self.a.kill()
        self.kill = await kill_snapshot(self.settings)
        self.note("SIGKILL instance a")
        await asyncio.sleep(1.0)
        self.a.start()
        self.note("instance a restarted")

    async def kill_the_jobs_leader(self) -> None:
        node, led = await _jobs_leader(self.cluster, self.settings.jobs_topic, self.shape.partitions)
        self.killed_broker = node
        await asyncio.to_thread(self.cluster.kill, node)
        self.note(f"SIGKILL broker node {node} (leader of {led} of {self.shape.partitions} jobs partitions)")
        await asyncio.sleep(self.shape.broker_down_s)
        await asyncio.to_thread(self.cluster.restart, node)
        self.note(f"broker node {node} restarted")

    async def provider_fault(self, name: str, knob: str, rate: float, lasts_s: float) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            url = f"{self.base_url}/_sim/config"
            (await client.post(url, json={knob: rate})).raise_for_status()
            self.note(name)
            await asyncio.sleep(lasts_s)
            (await client.post(url, json={knob: 0.0})).raise_for_status()
            self.note(f"{name}: over")

    async def instance_b_leaves(self) -> None:
        """SIGTERM b once it holds partitions (bounded), so it leaves with work of its own."""
        await self.follower.wait(
            lambda: bool(self.b.assignment()) or not self.b.alive(), timeout_s=JOIN_WAIT_S
        )
        held = sorted(self.b.assignment() or set())
        self.exit_codes["b"] = await stop_gracefully(self.b, STOP_WAIT_S)
        self.note(f"instance b left (partitions {held}, exit {self.exit_codes['b']})")

    async def wait_for_outcomes(self) -> bool:
        produced = {jid for m in self.minutes for jid in m.produced}
        finished = await self.follower.wait_for_ids(produced, timeout_s=self.shape.finish_wait_s)
        # a poison record produced last may still be on its way to the dead-letter topic
        poison = sum(m.poison for m in self.minutes)
        await self.follower.wait_for_dead(
            lambda o: o.job_id is None, poison, timeout_s=self.shape.finish_wait_s / 4
        )
        return finished

    # ------------------------------------------------------------------ the report
    def report(self, finished: bool) -> dict[str, Any]:
        t0_wall_ms = int((time.time() - (time.monotonic() - self.t0)) * 1000)
        outcomes = list(self.follower.outcomes)
        report = _report(self.minutes, outcomes, t0_wall_ms=t0_wall_ms, finished=finished)
        good = {jid for m in self.minutes for jid in m.produced}
        causes = attribute_duplicates(
            [o for o in outcomes if o.job_id in good], [self.kill] if self.kill is not None else []
        )
        explained = causes.pop("acked_uncommitted", 0) + causes.pop("metadata_full", 0)
        report["totals"].update(
            duplicates_by_the_kill=explained,
            duplicates_unexplained=dict(causes),
            exit_codes=dict(sorted(self.exit_codes.items())),
            killed_broker=self.killed_broker,
        )
        if causes:
            report["unexplained_examples"] = self._unexplained(outcomes, good, t0_wall_ms)
        return report

    def _unexplained(self, outcomes: list[Outcome], good: set[str], t0_wall_ms: int) -> dict[str, Any]:
        """Up to 5 jobs answered twice after the kill: each copy's topic partition and offset,
        its input offset and when it was written (s into the run), to find the cause in the logs."""
        snapshots = [self.kill] if self.kill is not None else []
        copies: dict[Any, list[Outcome]] = defaultdict(list)
        for o in outcomes:
            if o.job_id in good and era_of(o, snapshots) == len(snapshots):
                copies[o.job_id].append(o)
        twice = sorted((jid, found) for jid, found in copies.items() if len(found) > 1)[:5]

        def where(o: Outcome) -> list[Any]:
            written_s = (o.timestamp_ms - t0_wall_ms) / 1000
            return [o.partition, o.offset, o.source_partition, o.source_offset, written_s]

        return {str(jid): [where(o) for o in found] for jid, found in twice}


def _report(
    minutes: list[_Minute], outcomes: list[Outcome], *, t0_wall_ms: int, finished: bool
) -> dict[str, Any]:
    good = {jid for m in minutes for jid in m.produced}
    seen: Counter[Any] = Counter()
    rows: list[dict[str, Any]] = [
        {"minute": i + 1, "outcomes": 0, "duplicates": 0} for i in range(len(minutes))
    ]
    dead_good: list[Counter[str]] = [Counter() for _ in minutes]
    dead_poison: list[Counter[str]] = [Counter() for _ in minutes]
    for o in sorted(outcomes, key=lambda o: o.timestamp_ms):
        i = min(len(rows) - 1, max(0, (o.timestamp_ms - t0_wall_ms) // 60_000))
        rows[i]["outcomes"] += 1
        if o.job_id in good:
            seen[o.job_id] += 1
            if seen[o.job_id] > 1:
                rows[i]["duplicates"] += 1
            if o.dead:
                dead_good[i][str(o.output)] += 1
        elif o.dead:
            dead_poison[i][str(o.output)] += 1
    for i, m in enumerate(minutes):
        rows[i].update(
            produced=len(m.produced),
            poison=m.poison,
            lost=sum(1 for jid in m.produced if jid not in seen),
            dead_letters_good=dict(dead_good[i]),
            dead_letters_poison=dict(dead_poison[i]),
            rss_mb={k: round(v / MB, 1) for k, v in sorted(m.memory.items())},
            open_fds=dict(sorted(m.fds.items())),
            events=m.events,
        )
    by_kind: defaultdict[str, int] = defaultdict(int)
    for c in dead_good:
        for k, v in c.items():
            by_kind[k] += v
    return {
        "minutes": rows,
        "totals": {
            "jobs": len(good),
            "poison": sum(m.poison for m in minutes),
            "outcomes": len(outcomes),
            "lost": sum(r["lost"] for r in rows),
            "duplicates": sum(r["duplicates"] for r in rows),
            "dead_letters_good": dict(by_kind),
            "dead_letters_poison": sum(sum(c.values()) for c in dead_poison),
            "finished": finished,
        },
    }
