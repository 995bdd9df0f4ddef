"""The soak: jobs at a steady rate through a 3-node cluster, with a schedule of faults.

`run_soak(SoakShape(minutes=30))` starts (unless it runs) a 3-node local cluster in its own
state dir and ports (`deploy/kafka-local/kafka`, `KAFKA_LOCAL_HOME`), the simulator in a
background thread and one `promptbus run` process, then produces mixed chat and batched jobs
at `rate_per_s` while the schedule runs, each step at a share of the run:

    10%  the service is SIGKILLed and restarted a second later
    25%  a broker node is SIGKILLed, and restarted `broker_down_s` later
    40%  the provider is out (every request 503) for `outage_s`
    55%  a 429 storm (most requests 429 + Retry-After) for `storm_s`
    65%  a second instance joins the group; at 85% it leaves (SIGTERM)
    all  a poison record (not JSON) every `poison_every` jobs

After the last minute it stops producing, waits (bounded) until every job has an outcome,
stops the instances and returns one row per minute: outcomes, lost, duplicates, dead letters
by kind (good jobs and poison apart) and each instance's resident memory and open file
descriptors (the largest of the minute's samples).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
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
from consumer.testing.faultrun import OutcomeRecorder, open_fds, rss_bytes
from consumer.testing.harness import job, service_env, settings_from_env
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, run_simulator

KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "kafka-local" / "kafka"
#: the soak's own cluster: apart from the 1-node broker (9092) and the test cluster (19092)
SOAK_KAFKA_HOME = Path(os.environ.get("PROMPTBUS_SOAK_KAFKA_HOME", "/tmp/promptbus-soak-kafka"))
SOAK_PORTS = (29092, 29192)
#: the simulator's normal service: 20-40 ms answers, a few 5xx
SOAK_PROVIDER = SimulatorConfig(seed=11, latency_ms=30, jitter_ms=10, error_rate=0.01)
POISON = b"{this is not json"
MB = 1024 * 1024


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


class LocalCluster:
    """A cluster of `deploy/kafka-local/kafka` in its own state dir and on its own ports."""

    def __init__(
        self, home: Path = SOAK_KAFKA_HOME, nodes: int = 3, ports: tuple[int, int] = SOAK_PORTS
    ) -> None:
        self.nodes = nodes
        self.env = {
            **os.environ,
            "KAFKA_LOCAL_HOME": str(home),
            "KAFKA_LOCAL_BROKER_PORT": str(ports[0]),
            "KAFKA_LOCAL_CONTROLLER_PORT": str(ports[1]),
            "KAFKA_LOCAL_HEAP": os.environ.get("KAFKA_LOCAL_HEAP", "-Xms128m -Xmx512m"),
        }
        self.started_here = False
        self.bootstrap = ""

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KAFKA_SCRIPT), *args], env=self.env, capture_output=True, text=True, timeout=600, check=False
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kafka {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return proc

    def start(self) -> str:
        running = self._run("status", check=False).returncode == 0
        self.bootstrap = self._run("start", "--nodes", str(self.nodes)).stdout.strip().splitlines()[-1]
        self.started_here = not running
        return self.bootstrap

    def kill(self, node: int) -> None:
        self._run("kill", str(node))

    def restart(self, node: int) -> None:
        self._run("restart", str(node))

    def stop(self) -> None:
        self._run("stop", check=False)


@dataclass
class _Minute:
    produced: list[str] = field(default_factory=list)
    poison: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)


async def _configure(base_url: str, **knobs: Any) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        (await client.post(f"{base_url}/_sim/config", json=knobs)).raise_for_status()


def soak_tiers(base_url: str) -> dict[str, Any]:
    """One tier: batching, AIMD, retries and a circuit that holds jobs through an outage."""
    return {
        "tiers": {
            "small": {
                "provider": "openai_compat",
                "base_url": base_url + "/v1",
                "model": "sim-model",
                "timeout_s": 2.0,
                "batching": {"enabled": True, "max_items": 10, "window_ms": 50, "max_wait_ms": 500},
                "limiter": {"algorithm": "aimd", "initial": 4, "min": 1, "max": 32},
                "retry": {"max_attempts": 12, "backoff_initial_s": 0.1, "backoff_max_s": 2.0},
            }
        }
    }


async def run_soak(
    shape: SoakShape, workdir: Path, *, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """The soak (module docstring): {"minutes": [...rows], "totals": {...}}."""
    cluster = LocalCluster()
    progress("starting the 3-node cluster")
    bootstrap = await asyncio.to_thread(cluster.start)
    try:
        return await _soak(shape, workdir, cluster, bootstrap, progress)
    finally:
        if cluster.started_here:
            await asyncio.to_thread(cluster.stop)


async def _soak(
    shape: SoakShape, workdir: Path, cluster: LocalCluster, bootstrap: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    env = service_env(
        bootstrap, partitions=shape.partitions, PROMPTBUS_STATS_INTERVAL_S=1, PROMPTBUS_TOPIC_REPLICATION=3
    )
    settings = settings_from_env(env)
    await ensure_topics(settings)
    total_s = shape.minutes * 60
    minutes = [_Minute() for _ in range(max(1, int(-(-total_s // 60))))]
    with run_simulator(SOAK_PROVIDER) as base_url:
        tiers = soak_tiers(base_url)
        first = ServiceProcess(env, tiers, workdir, name="svc-a")
        second = ServiceProcess(env, tiers, workdir, name="svc-b")
        instances = {"a": first, "b": second}
        producer = job_producer(settings)
        await producer.start()
        t0 = time.monotonic()

        def minute() -> _Minute:
            return minutes[min(len(minutes) - 1, int((time.monotonic() - t0) // 60))]

        def note(text: str) -> None:
            minute().events.append(text)
            progress(f"{time.monotonic() - t0:6.1f}s {text}")

        async def produce() -> None:
            n = 0
            while time.monotonic() - t0 < total_s:
                n += 1
                if shape.poison_every and n % shape.poison_every == 0:
                    await producer.send(settings.jobs_topic, POISON)
                    minute().poison += 1
                else:
                    j = job(n, batch=n % 2 == 0)
                    await producer.send(settings.jobs_topic, orjson.dumps(j), key=j["id"].encode())
                    minute().produced.append(j["id"])
                await asyncio.sleep(max(0.0, t0 + n / shape.rate_per_s - time.monotonic()))
            await producer.flush()

        async def sample() -> None:
            while True:
                m = minute()
                for name, svc in instances.items():
                    if svc.alive() and svc.pid is not None:
                        m.memory[name] = max(m.memory.get(name, 0), rss_bytes(svc.pid))
                        m.fds[name] = max(m.fds.get(name, 0), open_fds(svc.pid))
                await asyncio.sleep(2.0)

        async def at(share: float) -> None:
            await asyncio.sleep(max(0.0, t0 + share * total_s - time.monotonic()))

        async def schedule() -> None:
            await at(0.10)
            first.kill()
            note("SIGKILL instance a")
            await asyncio.sleep(1.0)
            first.start()
            note("instance a restarted")
            await at(0.25)
            await asyncio.to_thread(cluster.kill, 2)
            note("SIGKILL broker node 2")
            await asyncio.sleep(shape.broker_down_s)
            await asyncio.to_thread(cluster.restart, 2)
            note("broker node 2 restarted")
            await at(0.40)
            await _configure(base_url, overload_rate=1.0)
            note("provider outage (every request 503)")
            await asyncio.sleep(shape.outage_s)
            await _configure(base_url, overload_rate=0.0)
            note("provider back")
            await at(0.55)
            await _configure(base_url, shared_429_rate=0.8)
            note("429 storm")
            await asyncio.sleep(shape.storm_s)
            await _configure(base_url, shared_429_rate=0.0)
            note("429 storm over")
            await at(0.65)
            second.start()
            note("instance b joins")
            await at(0.85)
            code = await asyncio.to_thread(second.terminate, 60)
            note(f"instance b left (exit {code})")

        async with OutcomeRecorder(settings) as recorder:
            first.start()
            tasks = [asyncio.create_task(c) for c in (produce(), sample(), schedule())]
            try:
                await asyncio.gather(tasks[0], tasks[2])
                produced = {jid for m in minutes for jid in m.produced}
                finished = await recorder.wait(produced, shape.finish_wait_s)
                # a poison record produced last may still be on its way to the dead-letter topic
                poison = sum(m.poison for m in minutes)
                await recorder.wait_for_dead(lambda o: o.job_id is None, poison, shape.finish_wait_s / 4)
                for svc in instances.values():
                    if svc.alive():
                        await asyncio.to_thread(svc.terminate, 60)
                await asyncio.sleep(1.0)
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                for svc in instances.values():
                    svc.kill()
                await producer.stop()
            outcomes = list(recorder.outcomes)
    return _report(
        minutes, outcomes, t0_wall_ms=int((time.time() - (time.monotonic() - t0)) * 1000), finished=finished
    )


def _report(
    minutes: list[_Minute], outcomes: list[Any], *, t0_wall_ms: int, finished: bool
) -> dict[str, Any]:
    good = {jid for m in minutes for jid in m.produced}
    seen: Counter[Any] = Counter()
    rows = [
        {
            "minute": i + 1,
            "outcomes": 0,
            "duplicates": 0,
            "lost": 0,
            "dead_letters_good": {},
            "dead_letters_poison": {},
        }
        for i in range(len(minutes))
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
        rows[i]["produced"] = len(m.produced)
        rows[i]["poison"] = m.poison
        rows[i]["lost"] = sum(1 for jid in m.produced if jid not in seen)
        rows[i]["dead_letters_good"] = dict(dead_good[i])
        rows[i]["dead_letters_poison"] = dict(dead_poison[i])
        rows[i]["rss_mb"] = {k: round(v / MB, 1) for k, v in sorted(m.memory.items())}
        rows[i]["open_fds"] = dict(sorted(m.fds.items()))
        rows[i]["events"] = m.events
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
