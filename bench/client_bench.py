"""The client's own overhead: outcomes per second collected, beside `promptbus results`.

    .venv/bin/python bench/client_bench.py [--inputs 20000] [--repeats 3]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). Prints one JSON
object on stdout; progress goes to stderr.

1. Fill: fresh 4-partition topics; the service (in this process) against the simulator with
   no latency answers one `Client.map` of N short batched inputs; then the service stops, so
   the results topic holds exactly those N outcomes and nothing writes to it any more.
2. Read the same, complete topic, each way `--repeats` times, interleaved, medians:
     collect       `AsyncClient.collect(run_id, N)` from a new client (it finds the run's start
                   by the time in its run id): read both output topics, match keys to the run,
                   parse, dedupe, assemble N outcomes in input order;
     results       what `promptbus results` does: `read_topic` from the beginning to the end,
                   each record decoded and written as a line (to an in-memory sink);
     cli_collect   `promptbus map --collect RUN --total N --out /dev/null` as a process;
     cli_results   `promptbus results > /dev/null` as a process (both include interpreter
                   start and imports).
   Rates are outcomes per second; `ratio` = collect / results (in process) and
   cli_collect / cli_results.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from consumer.client import AsyncClient
from consumer.kafka.clients import read_topic
from consumer.settings import Settings
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import InProcessService, service_env, settings_from_env, tier_file_dict
from consumer.testing.paths import PROMPTBUS, REPO_ROOT
from consumer.testing.simulator import SimulatorConfig, SimulatorServer

TEMPLATE = "Classify the sentiment of the text.\nTEXT:\n${text}"


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def fill(settings: Settings, n: int) -> str:
    """N outcomes of one run in the results topic; returns the run id."""
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        async with InProcessService(settings, tier_file_dict(base_url + "/v1", max_items=20)):
            async with AsyncClient(settings) as client:
                started = time.monotonic()
                inputs = [f"text number {i}" for i in range(n)]
                outcomes = await client.map("small", inputs, prompt=TEMPLATE, batch=True, timeout_s=600)
                note(f"fill: {n} outcomes in {time.monotonic() - started:.1f} s (service + simulator)")
    assert all(o.ok for o in outcomes), "the fill run had failures"
    return outcomes[0].id.rsplit("-", 1)[0]


async def time_collect(settings: Settings, run_id: str, n: int) -> float:
    started = time.perf_counter()
    async with AsyncClient(settings) as client:
        outcomes = await client.collect(run_id, n, timeout_s=600)
    took = time.perf_counter() - started
    assert len(outcomes) == n and all(o.ok for o in outcomes)
    return took


async def time_results(settings: Settings, n: int) -> float:
    """The loop of `promptbus results` (cmd_results): decode each value, write it as a line."""
    sink = io.StringIO()
    count = 0
    started = time.perf_counter()
    async for _, value in read_topic(settings, settings.results_topic, from_beginning=True, follow=False):
        if value is None:
            continue
        sink.write(value.decode("utf-8") + "\n")
        count += 1
    took = time.perf_counter() - started
    assert count == n, count
    return took


def time_cli(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [*PROMPTBUS, *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
        check=False,
    )
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    add_save_option(parser)
    args = parser.parse_args()
    n = args.inputs
    env = service_env(os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"), partitions=4)
    settings = settings_from_env(env)
    run_id = await fill(settings, n)

    times: dict[str, list[float]] = {"collect": [], "results": [], "cli_collect": [], "cli_results": []}
    for r in range(args.repeats):
        times["collect"].append(await time_collect(settings, run_id, n))
        times["results"].append(await time_results(settings, n))
        times["cli_collect"].append(
            await asyncio.to_thread(
                time_cli, ["map", "--collect", run_id, "--total", str(n), "--out", os.devnull], env
            )
        )
        times["cli_results"].append(await asyncio.to_thread(time_cli, ["results"], env))
        note(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))

    medians = {k: statistics.median(v) for k, v in times.items()}
    rates = {k: round(n / s) for k, s in medians.items()}
    out: dict[str, Any] = {
        "outcomes": n,
        "repeats": args.repeats,
        "seconds_median": {k: round(v, 3) for k, v in medians.items()},
        "outcomes_per_s": rates,
        "ratio_collect_vs_results": round(rates["collect"] / rates["results"], 3),
        "ratio_cli_collect_vs_cli_results": round(rates["cli_collect"] / rates["cli_results"], 3),
        "seconds_all": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }
    emit_report(out, args.save, name="client_bench")


if __name__ == "__main__":
    asyncio.run(main())
