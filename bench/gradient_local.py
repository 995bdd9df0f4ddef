"""The latency-gradient limiter against the real local model (llama.cpp server, SmolLM2-135M).

llama-cpp-python's server has one slot: concurrent requests queue, so throughput is flat and
latency grows with concurrency. A limiter for such a server should settle at a low concurrency
that keeps latency near its no-queue value without losing throughput. Side by side in one run,
over the same N classification requests sent all at once through `AsyncLimiter`:

    gradient   consumer.core.limit.GradientLimit (initial 8, min 1, max 16)
    fixed-8    FixedLimit(8)
    fixed-1    FixedLimit(1)

Prints JSON: wall time, requests/s, p50/p95 provider-call latency, and the gradient limit's
trajectory (start, end, mean over the second half). No thresholds: compare the columns.

    python bench/gradient_local.py [--requests 64] [--port 8090] [--save [NAME]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from consumer import localmodel
from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.limit import ConcurrencyLimit, FixedLimit, GradientLimit
from consumer.providers.factory import build_provider, make_http_client
from consumer.runtime.limiter import AsyncLimiter
from consumer.settings import TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.paths import REPO_ROOT

PROMPT = "Classify the sentiment of the text as positive or negative. Answer with one word.\nTEXT:\n"


def texts(n: int) -> list[str]:
    lines = (REPO_ROOT / "examples" / "sentiment_labelled.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [rows[i % len(rows)]["text"] for i in range(n)]


async def run_mode(
    name: str, algorithm: ConcurrencyLimit, base_url: str, inputs: list[str]
) -> dict[str, Any]:
    tier = TierConfig(
        provider="openai_compat", base_url=base_url, model=localmodel.MODEL_ALIAS, timeout_s=300
    )
    client = make_http_client(tier)
    provider = build_provider(name, tier, client)
    limiter = AsyncLimiter(algorithm)
    latencies_ms: list[float] = []
    limits: list[int] = []

    async def one(text: str) -> None:
        token = await limiter.acquire()
        started = time.monotonic()
        try:
            await provider.complete(
                CompletionRequest(
                    (ChatMessage("user", PROMPT + text),),
                    localmodel.MODEL_ALIAS,
                    {"temperature": 0, "max_tokens": 4},
                )
            )
        except Exception:
            token.ignore()
            raise
        latencies_ms.append((time.monotonic() - started) * 1000)
        token.success()
        limits.append(limiter.limit)

    started = time.monotonic()
    await asyncio.gather(*(one(t) for t in inputs))
    wall_s = time.monotonic() - started
    await provider.aclose()
    await client.close()
    q = statistics.quantiles(latencies_ms, n=20)
    half = limits[len(limits) // 2 :]
    return {
        "mode": name,
        "requests": len(inputs),
        "wall_s": round(wall_s, 2),
        "requests_per_s": round(len(inputs) / wall_s, 2),
        "p50_ms": round(statistics.median(latencies_ms)),
        "p95_ms": round(q[18]),
        "limit_start": limits[0] if limits else None,
        "limit_end": limits[-1] if limits else None,
        "limit_mean_second_half": round(statistics.mean(half), 2) if half else None,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--port", type=int, default=8090)
    add_save_option(parser)
    args = parser.parse_args()
    handle = localmodel.serve(port=args.port, n_ctx=2048, wait_s=120)
    try:
        inputs = texts(args.requests)
        # warm the server (first prompt evaluation is slower)
        await run_mode("warmup", FixedLimit(1), handle.base_url, inputs[:4])
        rows = [
            await run_mode("gradient", GradientLimit(8, min_limit=1, max_limit=16), handle.base_url, inputs),
            await run_mode("fixed-8", FixedLimit(8), handle.base_url, inputs),
            await run_mode("fixed-1", FixedLimit(1), handle.base_url, inputs),
        ]
    finally:
        handle.stop()
    report = {"benchmark": "gradient limiter vs fixed on llama.cpp/SmolLM2", "rows": rows}
    emit_report(report, args.save, name="gradient_local")


if __name__ == "__main__":
    asyncio.run(main())
