"""Embed jobs: windowed array requests against single-input ones, and the service's throughput.

    .venv/bin/python bench/embed_bench.py [--parts local,service] [--texts 256] [--jobs 50000] [--repeats 3]
        [--providers fake,sim] [--spy] [--save [NAME]]

Prints one JSON object on stdout; progress goes to stderr.

1. local: the real local model (`promptbus local-model serve --embeddings`: llama.cpp's
   server with SmolLM2-135M mean-pooled), started here on a free port. The same `--texts`
   short texts through the tier's adapter (`build_provider`, the service's own call), once
   as single-input requests (one at a time: llama-cpp-python's server runs one request at a
   time) and once windowed: array requests of `max_items` (32). Items/s of each, their ratio
   (target: windowed >= 3x single), and the cosine similarity between each text's two
   vectors (target: >= 0.999 for every text).
2. service: 50,000 embed jobs through the service (max_items 20), against the raw Kafka loop
   that consumes and re-produces the same records (`bench/pipeline_bench.py`'s `raw_loop`,
   measured the same way: items/s from the output records' Kafka timestamps, medians of
   interleaved repeats), with each provider of `--providers`: `fake`, the in-memory
   `FakeProvider` answering every input with the same short vector (the service's own cost, as
   pipeline_bench's fake variant), and `sim`, the simulator with no latency in its own process.
   Target: >= 0.6 of raw, as for batched chat jobs. Raw and the service run on the service's
   own event loop (uvloop where installed), as in pipeline_bench. Needs a broker
   (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

# run as a script, this file's directory is importable: the raw loop is pipeline_bench's own
from pipeline_bench import (
    TIER,
    WORDS,
    SimProcess,
    _progress,
    raw_loop,
    service_run,
    spy_run,
    tier_dict,
)

from consumer.core.completion import Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.kafka.admin import ensure_topics
from consumer.kafka.clients import submit_jobs
from consumer.providers.embeddings import EmbeddingProvider
from consumer.providers.factory import build_provider, make_http_client
from consumer.providers.fake import FakeProvider
from consumer.runtime import eventloop
from consumer.runtime.heap import tune_gc
from consumer.settings import Settings, TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import service_env, settings_from_env
from consumer.testing.paths import REPO_ROOT

WINDOW = 32


def make_texts(n: int, seed: int = 1) -> list[str]:
    """n short sentences (about 8 words each), all different."""
    rng = random.Random(seed)
    return [f"review {i}: " + " ".join(rng.choice(WORDS) for _ in range(8)) for i in range(n)]


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def local_model(texts: list[str]) -> dict[str, Any]:
    """Single-input against windowed requests on the real local embedding server."""
    from consumer import localmodel

    state = Path(tempfile.mkdtemp(prefix="embed-bench-"))
    handle = await asyncio.to_thread(localmodel.serve, port=0, wait_s=180, directory=state, embeddings=True)
    try:
        tier = TierConfig(
            provider="openai_compat",
            base_url=handle.base_url,
            model=localmodel.EMBED_MODEL_ALIAS,
            timeout_s=300,
        )
        provider = build_provider(TIER, tier, make_http_client(tier))
        assert isinstance(provider, EmbeddingProvider)
        try:
            model = tier.model
            await provider.embed(EmbeddingRequest((texts[0],), model))  # warm up
            t0 = time.perf_counter()
            single = [(await provider.embed(EmbeddingRequest((t,), model))).vectors[0] for t in texts]
            single_s = time.perf_counter() - t0
            _progress("local: %d single-input requests in %.1f s", len(texts), single_s)
            t0 = time.perf_counter()
            windowed: list[tuple[float, ...]] = []
            for i in range(0, len(texts), WINDOW):
                answer = await provider.embed(EmbeddingRequest(tuple(texts[i : i + WINDOW]), model))
                windowed.extend(answer.vectors)
            windowed_s = time.perf_counter() - t0
            _progress("local: %d texts in windows of %d in %.1f s", len(texts), WINDOW, windowed_s)
        finally:
            await provider.aclose()  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(handle.stop)
    sims = [cosine(a, b) for a, b in zip(single, windowed, strict=True)]
    single_rate, windowed_rate = len(texts) / single_s, len(texts) / windowed_s
    return {
        "model": localmodel.EMBED_MODEL_ALIAS,
        "texts": len(texts),
        "dimensions": len(single[0]),
        "max_items": WINDOW,
        "single_items_per_s": round(single_rate, 1),
        "windowed_items_per_s": round(windowed_rate, 1),
        "windowed_vs_single": round(windowed_rate / single_rate, 2),
        "target_windowed_vs_single": 3.0,
        "cosine_min": round(min(sims), 6),
        "cosine_median": round(statistics.median(sims), 6),
        "target_cosine_min": 0.999,
    }


def embed_jobs(n: int) -> list[dict[str, Any]]:
    return [
        {"id": f"emb-{i}", "tier": TIER, "kind": "embed", "input": text, "options": {"dimensions": 16}}
        for i, text in enumerate(make_texts(n, seed=2))
    ]


#: the vector the fake provider answers for every input (the jobs ask for 16 dimensions)
FAKE_VECTOR = [0.125] * 16


def fake_embeddings(request: EmbeddingRequest) -> Embeddings:
    """An answer of the right shape at almost no cost (the fake variant times the service)."""
    return Embeddings(
        vectors=tuple(FAKE_VECTOR for _ in request.inputs),
        usage=Usage(input_tokens=request.estimated_tokens()),
        provider="openai_compat",
        model=request.model,
    )


def _unused_chat(request: Any) -> Any:
    raise AssertionError("the embed bench sends no chat request")


async def service(args: argparse.Namespace, base: Settings) -> dict[str, Any]:
    """50,000 embed jobs through the service with each provider, against raw Kafka."""
    n = args.jobs
    base = base.model_copy(update={"jobs_topic": f"bench-embed-jobs-{uuid.uuid4().hex[:6]}"})
    await ensure_topics(base)
    t0 = time.monotonic()
    sent = await submit_jobs(
        base, (orjson.dumps(j) for j in embed_jobs(n)), key_of=lambda v: orjson.loads(v)["id"].encode()
    )
    _progress("service: produced %d embed jobs in %.1fs", sent, time.monotonic() - t0)
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], **{p: [] for p in args.providers}}
    async with contextlib.AsyncExitStack() as stack:
        sim = None
        if "sim" in args.providers:
            log_path = REPO_ROOT / "bench/out/sim-embed.log"
            sim = await stack.enter_async_context(SimProcess({"seed": 1}, log_path))
        for rep in range(args.repeats):
            runs["raw"].append(await raw_loop(base, n, args.variant_timeout_s))
            _progress("service raw #%d: %s", rep + 1, runs["raw"][-1])
            for provider in args.providers:
                if provider == "fake":
                    res = await fake_run(base, n, args.variant_timeout_s)
                else:
                    assert sim is not None
                    await sim.reset()
                    tiers = tier_dict(f"{sim.base}/v1", batching=True)
                    res, _ = await service_run(base, "embed", tiers, n, args.variant_timeout_s)
                    counters = await sim.stats()
                    res["simulator"] = {
                        k: counters.get(k) for k in ("requests", "embedding_requests", "items_answered")
                    }
                runs[provider].append(res)
                _progress("service %s #%d: %s", provider, rep + 1, res)
    out: dict[str, Any] = {"jobs": n, "max_items": 20, "partitions": 4, "repeats": args.repeats}
    for variant, results in runs.items():
        rates = [r["items_per_s"] for r in results]
        cpu = [r["cpu_us_per_item"] for r in results if r.get("cpu_us_per_item") is not None]
        out[variant] = {
            "items_per_s_median": round(statistics.median(rates), 1),
            "items_per_s_runs": rates,
            "cpu_us_per_item_median": round(statistics.median(cpu), 1) if cpu else None,
            "last_run": results[-1],
        }
    raw_rate = out["raw"]["items_per_s_median"]
    for provider in args.providers:
        out[provider]["ratio_vs_raw"] = round(out[provider]["items_per_s_median"] / raw_rate, 3)
    out["target_ratio"] = 0.6
    if args.spy:
        out["spy_fake"] = await spy_run("fake-embed", lambda: fake_run(base, n, args.variant_timeout_s))
    return out


async def fake_run(base: Settings, n: int, timeout_s: float) -> dict[str, Any]:
    """The service with the in-memory provider answering every embeddings request."""
    fake = FakeProvider(_unused_chat, name="openai_compat", embed_handler=fake_embeddings)
    tiers = tier_dict("http://127.0.0.1:9/v1", batching=True)
    res, _ = await service_run(base, "embed-fake", tiers, n, timeout_s, providers={TIER: fake})
    return res


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tune_gc()
    result: dict[str, Any] = {
        "bench": "embed_bench",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    t0 = time.monotonic()
    if "local" in args.parts:
        result["local"] = await local_model(make_texts(args.texts))
    if "service" in args.parts:
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
        base = settings_from_env(service_env(bootstrap, partitions=4, PROMPTBUS_SHUTDOWN_TIMEOUT_S="30"))
        result["service"] = await service(args, base)
    result["bench_s"] = round(time.monotonic() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="local,service", help="comma list: local, service")
    parser.add_argument("--texts", type=int, default=256, help="texts for the local model part")
    parser.add_argument("--jobs", type=int, default=50_000, help="embed jobs for the service part")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of raw and the service")
    parser.add_argument(
        "--providers", default="fake,sim", help="the service part's providers, comma list: fake, sim"
    )
    parser.add_argument(
        "--spy", action="store_true", help="also sample the fake run with py-spy (bench/out/spy-*.txt)"
    )
    parser.add_argument("--variant-timeout-s", type=float, default=300.0, help="bound of one service run")
    add_save_option(parser)
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    args.providers = [p for p in args.providers.split(",") if p]
    unknown = sorted(set(args.providers) - {"fake", "sim"})
    if unknown or not args.providers:
        parser.error(f"--providers: unknown {unknown}; known: fake, sim")
    with contextlib.suppress(KeyboardInterrupt):
        # on the loop the service runs on (`promptbus run`'s default: uvloop where installed)
        report = eventloop.run(main_async(args))
        emit_report(report, args.save, name="embed_bench_" + "_".join(args.parts))
        return 0
    return 130


if __name__ == "__main__":
    sys.exit(main())
