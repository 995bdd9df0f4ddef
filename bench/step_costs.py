"""The costs of single steps that the code's comments cite, each timed alone, side by side.

    .venv/bin/python bench/step_costs.py [--requests 2000] [--repeats 3] [--save [NAME]]

Needs nothing but this checkout (the HTTP part starts the simulator in a process of its own).
Prints one JSON object (`--save`: also bench/results/step_costs.json):

    murmur2   the partition hash of one 24-byte job-id key, aiokafka's byte-by-byte
              `murmur2` against `consumer.kafka.partitioning.murmur2` (the key's 4-byte
              words in one `struct` call): ns per key, the best of 7 timeit rounds
    task      what a task of its own costs a request: `await asyncio.create_task(send())`
              against `await send()` of the same trivial coroutine, us per request (the plan
              runner sends a plan's first request in the plan's own task)
    http      the client CPU of one chat POST to the simulator (a packed prompt of 20 short
              inputs, 16 requests in flight): a bare aiohttp session, a bare httpx client,
              the service's transport (`consumer.providers.transport`: keep-alive HTTP/1.1
              parsed by httptools) and the tier's own adapter on it (`build_provider`: the
              answer decoded and checked), and the transport through a real HTTP proxy
              (`transport_proxy`: a tinyproxy process, `deploy/tinyproxy/install.sh`; absolute-
              form requests over the pool's connections to the proxy, kept per (proxy, origin));
              CPU of the event-loop thread per request (the proxy's own CPU is its process's),
              median of `--repeats` interleaved rounds

Everything runs on the event loop the service runs on (`--loop`, as PROMPTBUS_EVENT_LOOP).

No thresholds: compare the columns of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

# run as a script, this file's directory is importable: the simulator process is pipeline_bench's
from pipeline_bench import TIER, SimProcess, tier_dict

from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.packing import pack
from consumer.kafka.partitioning import murmur2
from consumer.providers.factory import build_provider, make_http_client
from consumer.providers.transport.base import parse_target
from consumer.runtime import eventloop
from consumer.settings import TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.paths import REPO_ROOT
from consumer.testing.tinyproxy import run_tinyproxy

ROOT = REPO_ROOT
PREFIX = "Classify the sentiment of the text.\nTEXT:\n"
WORDS = "good bad slow fast cold warm fine rude kind late early cheap dear clean loud calm".split()
#: requests in flight in the HTTP part (the batched pipeline runs about this many)
IN_FLIGHT = 16


def murmur2_costs() -> dict[str, Any]:
    key = b"20261201T081330123Z-9f3a"  # a job id's length
    number = 200_000

    def ns(fn: Callable[[bytes], int]) -> float:
        return min(timeit.repeat(lambda: fn(key), number=number, repeat=7)) / number * 1e9

    ours, theirs = ns(murmur2), ns(aiokafka_murmur2)
    return {
        "key_bytes": len(key),
        "aiokafka_ns_per_key": round(theirs, 1),
        "promptbus_ns_per_key": round(ours, 1),
        "promptbus_over_aiokafka": round(ours / theirs, 3),
    }


async def task_costs(n: int = 200_000) -> dict[str, Any]:
    async def send() -> int:
        return 1

    async def in_place() -> None:
        for _ in range(n):
            await send()

    async def own_task() -> None:
        for _ in range(n):
            await asyncio.create_task(send())

    times = {}
    for name, loop in (("await_us_per_request", in_place), ("task_us_per_request", own_task)):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            await loop()
            best = min(best, time.perf_counter() - t0)
        times[name] = round(best / n * 1e6, 3)
    extra = times["task_us_per_request"] - times["await_us_per_request"]
    times["task_extra_us_per_request"] = round(extra, 3)
    return times


def chat_body() -> tuple[str, dict[str, Any]]:
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(5)) for _ in range(20)]
    content = pack(PREFIX, "text", texts, rng).text
    messages = [{"role": "user", "content": content}]
    return content, {"model": "sim-model", "messages": messages, "max_tokens": 400}


async def cpu_per_request(n: int, call: Callable[[], Awaitable[object]]) -> float:
    """Event-loop thread CPU per call, `IN_FLIGHT` calls at a time (us)."""
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            queue.pop()
            await call()

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))  # warm: connections, caches
    queue = list(range(n))
    cpu0 = time.thread_time()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return (time.thread_time() - cpu0) / n * 1e6


#: a client made for one round and closed after it (uvicorn closes a connection idle 5 s, so
#: a pool kept across rounds would meet a connection the server has closed)
Call = Callable[[], Awaitable[object]]
ClientRound = Callable[[str, bytes, dict[str, str]], contextlib.AbstractAsyncContextManager[Call]]


@contextlib.asynccontextmanager
async def aiohttp_round(url: str, payload: bytes, headers: dict[str, str]) -> AsyncIterator[Call]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=IN_FLIGHT)) as session:

        async def post() -> object:
            async with session.post(url, data=payload, headers=headers) as r:
                return orjson.loads(await r.read())

        yield post


@contextlib.asynccontextmanager
async def httpx_round(url: str, payload: bytes, headers: dict[str, str]) -> AsyncIterator[Call]:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=IN_FLIGHT)) as client:

        async def post() -> object:
            return orjson.loads((await client.post(url, content=payload, headers=headers)).content)

        yield post


def transport_round(tier: TierConfig, content: str, *, adapter: bool) -> ClientRound:
    """The service's transport: a bare POST through it, or the tier's adapter on it."""

    @contextlib.asynccontextmanager
    async def round_(url: str, payload: bytes, headers: dict[str, str]) -> AsyncIterator[Call]:
        transport = make_http_client(tier)
        provider = build_provider(TIER, tier, transport)
        target = parse_target(url)
        request = CompletionRequest((ChatMessage("user", content),), tier.model, {"max_tokens": 400})

        async def post() -> object:
            if adapter:
                return await provider.complete(request)
            return orjson.loads((await transport.request("POST", target, headers, payload)).body)

        try:
            yield post
        finally:
            await provider.aclose()
            await transport.close()

    return round_


async def http_costs(n: int, repeats: int) -> dict[str, Any]:
    content, body = chat_body()
    payload = orjson.dumps(body)
    headers = {"content-type": "application/json"}
    with tempfile.TemporaryDirectory() as proxy_dir, run_tinyproxy(Path(proxy_dir)) as proxy:
        async with SimProcess({"seed": 1}, ROOT / "bench" / "out" / "sim-step-costs.log") as sim:
            url = f"{sim.base}/v1/chat/completions"
            tier = TierConfig.model_validate(tier_dict(f"{sim.base}/v1", batching=False)["tiers"][TIER])
            proxied = tier.model_copy(update={"proxy": proxy.url})
            clients: dict[str, ClientRound] = {
                "aiohttp": aiohttp_round,
                "httpx": httpx_round,
                "transport": transport_round(tier, content, adapter=False),
                "adapter": transport_round(tier, content, adapter=True),
                "transport_proxy": transport_round(proxied, content, adapter=False),
            }
            runs: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(repeats):
                for name, client_round in clients.items():
                    async with client_round(url, payload, headers) as call:
                        runs[name].append(round(await cpu_per_request(n, call), 1))
    medians = {name: statistics.median(values) for name, values in runs.items()}
    return {
        "requests": n,
        "in_flight": IN_FLIGHT,
        "body_bytes": len(payload),
        "cpu_us_per_request_runs": runs,
        "cpu_us_per_request_median": medians,
        "httpx_over_aiohttp": round(medians["httpx"] / medians["aiohttp"], 2),
        "transport_over_aiohttp": round(medians["transport"] / medians["aiohttp"], 2),
        "adapter_over_aiohttp": round(medians["adapter"] / medians["aiohttp"], 2),
        "transport_proxy_over_transport": round(medians["transport_proxy"] / medians["transport"], 2),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "murmur2": murmur2_costs(),
        "task": await task_costs(),
        "http": await http_costs(args.requests, args.repeats),
    }


def main(argv: list[str] | None = None) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--requests", type=int, default=2000, help="chat POSTs per client and round")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the three clients")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto")
    add_save_option(parser)
    args = parser.parse_args(argv)
    report = eventloop.run(main_async(args), args.loop)
    report["event_loop"] = args.loop
    emit_report(report, args.save, name="step_costs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
