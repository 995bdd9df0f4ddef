"""Probe the real local model server (llama.cpp + SmolLM2-135M-Instruct): what it costs, what it can do.

Measures and prints ONE JSON document (no thresholds; numbers for the README and for
choosing the local tier's limiter and batching settings):

- model_fetch_s: `ensure_model()` time (`cached` says whether the file was already there);
- server_start_s: `serve()` until `/v1/models` answers;
- single: sequential single-text classification requests (latency ms: min/median/max);
- concurrency: for each level (1, 2, 4, 8) the same N requests sent with that many in
  flight: wall time, requests/s, latency p50/p95, and speedup over level 1 -- the
  llama-cpp-python server runs one request at a time, so a speedup near 1.0 means "queued";
- batched: the sentiment texts packed with `consumer.core.packing.pack` at sizes 2, 4, 8,
  sent without a schema ("off"), with `response_format: {type: json_object, schema:
  answer_schema(aliases)}` (each value any string: "string") and with each value the job's
  own answer schema, an enum of the labels ("label_enum"): requests, answers with exactly
  the aliases (`parse_answer` COMPLETE), accuracy against the labels, output tokens, wall
  time; plus single requests on the same texts (free and label_enum) as the baseline;
- generation: decode speed of one long free-form answer (tokens/s).

Usage: python bench/local_model_probe.py [--base-url URL] [--texts 16] [--requests 16]
       [--levels 1,2,4,8] [--batch-sizes 2,4,8] [--n-threads N] [--save [NAME]]
Without --base-url a server is started on a free port and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from consumer import localmodel
from consumer.core.packing import AnswerKind, answer_schema, batch_max_tokens, pack, parse_answer
from consumer.testing.benchreport import add_save_option, emit_report

LABELS = ("positive", "negative")
# SmolLM2-135M is sensitive to wording: this prompt scored 44/48 on the labelled set as single
# requests, "Classify the sentiment ... Answer with one word: positive or negative." only 24/48
# (always "positive").
PREFIX = "Is the sentiment of this review positive or negative? Reply with a single word.\nREVIEW:\n"
# the job's own answer schema: when a job gives one, each batched item's answer is held to it
LABEL_SCHEMA: dict[str, Any] = {"type": "string", "enum": list(LABELS)}
#: structured modes of the batched check: none, aliases -> any string, aliases -> one label
MODES = ("off", "string", "label_enum")
VARIABLE = "text"
SINGLE_MAX_TOKENS = 8


def load_labelled(path: Path, count: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:count]


def label_of(answer: str) -> str | None:
    """The first label word in a model answer (the model is free-form; we only look for the word)."""
    text = answer.lower()
    hits = [(text.find(lbl), lbl) for lbl in LABELS if lbl in text]
    return min(hits)[1] if hits else None


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


async def chat(
    client: httpx.AsyncClient, content: str, max_tokens: int, response_format: dict[str, Any] | None = None
) -> tuple[dict[str, Any], float]:
    body: dict[str, Any] = {
        "model": localmodel.MODEL_ALIAS,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if response_format is not None:
        body["response_format"] = response_format
    started = time.perf_counter()
    resp = await client.post("/chat/completions", json=body)
    latency_ms = (time.perf_counter() - started) * 1000
    resp.raise_for_status()
    return resp.json(), latency_ms


def content_of(body: dict[str, Any]) -> tuple[str, str]:
    choice = body["choices"][0]
    return choice["message"]["content"] or "", choice.get("finish_reason") or ""


async def run_single(
    client: httpx.AsyncClient, rows: list[dict[str, str]], structured: bool
) -> dict[str, Any]:
    latencies: list[float] = []
    correct = 0
    fmt = {"type": "json_object", "schema": LABEL_SCHEMA} if structured else None
    started = time.perf_counter()
    for row in rows:
        body, ms = await chat(client, PREFIX + row["text"], SINGLE_MAX_TOKENS, fmt)
        latencies.append(ms)
        correct += label_of(content_of(body)[0]) == row["label"]
    return {
        "structured": "label_enum" if structured else "off",
        "requests": len(rows),
        "correct": correct,
        "wall_s": round(time.perf_counter() - started, 3),
        "latency_ms": {
            "min": round(min(latencies), 1),
            "median": round(statistics.median(latencies), 1),
            "max": round(max(latencies), 1),
        },
    }


async def run_level(client: httpx.AsyncClient, rows: list[dict[str, str]], level: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(level)
    latencies: list[float] = []

    async def one(row: dict[str, str]) -> None:
        async with sem:
            _, ms = await chat(client, PREFIX + row["text"], SINGLE_MAX_TOKENS)
            latencies.append(ms)

    started = time.perf_counter()
    await asyncio.gather(*(one(r) for r in rows))
    wall_s = time.perf_counter() - started
    return {
        "concurrency": level,
        "requests": len(rows),
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(rows) / wall_s, 2),
        "latency_p50_ms": round(percentile(latencies, 0.5), 1),
        "latency_p95_ms": round(percentile(latencies, 0.95), 1),
    }


async def run_batched(
    client: httpx.AsyncClient, rows: list[dict[str, str]], size: int, mode: str, rng: random.Random
) -> dict[str, Any]:
    requests = complete = correct = answered = completion_tokens = 0
    kinds: dict[str, int] = {}
    started = time.perf_counter()
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        packed = pack(PREFIX, VARIABLE, [r["text"] for r in chunk], rng)
        fmt = None
        if mode != "off":
            item = LABEL_SCHEMA if mode == "label_enum" else None
            fmt = {"type": "json_object", "schema": answer_schema(packed.aliases, item)}
        # the same sizing rule the service uses: members' max_tokens plus JSON overhead
        max_tokens = batch_max_tokens([SINGLE_MAX_TOKENS] * len(chunk), cap=None)
        body, _ = await chat(client, packed.text, max_tokens, fmt)
        requests += 1
        completion_tokens += body["usage"]["completion_tokens"]
        text, finish = content_of(body)
        verdict = parse_answer(text, packed.aliases, finish)
        kinds[verdict.kind.value] = kinds.get(verdict.kind.value, 0) + 1
        complete += verdict.kind is AnswerKind.COMPLETE
        for alias, row in zip(packed.aliases, chunk, strict=True):
            if alias in verdict.answers:
                answered += 1
                correct += label_of(verdict.answers[alias]) == row["label"]
    return {
        "size": size,
        "structured": mode,
        "requests": requests,
        "complete_answers": complete,
        "verdicts": kinds,
        "items_answered": answered,
        "correct": correct,
        "completion_tokens": completion_tokens,
        "wall_s": round(time.perf_counter() - started, 3),
    }


async def run_generation(client: httpx.AsyncClient, max_tokens: int = 128) -> dict[str, Any]:
    """Decode speed: one long free-form answer (no stop expected before max_tokens)."""
    body, ms = await chat(client, "Write a long story about a lighthouse keeper and a storm.", max_tokens)
    usage = body["usage"]
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "latency_ms": round(ms, 1),
        "tokens_per_s": round(usage["completion_tokens"] / (ms / 1000), 1),
    }


async def probe(
    base_url: str, args: argparse.Namespace, texts: list[dict[str, str]], load: list[dict[str, str]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        await chat(client, "warm up", 4)
        out["generation"] = await run_generation(client)
        progress(f"generation {out['generation']}")
        out["single"] = []
        for structured in (False, True):
            out["single"].append(await run_single(client, texts, structured))
            progress(f"single {out['single'][-1]}")
        levels = []
        for level in args.levels:
            levels.append(await run_level(client, load, level))
            progress(f"concurrency {levels[-1]}")
        base_rps = levels[0]["requests_per_s"]
        for entry in levels:
            entry["speedup_vs_first"] = round(entry["requests_per_s"] / base_rps, 2)
        out["concurrency"] = levels
        rng = random.Random(7)
        out["batched"] = []
        for size in args.batch_sizes:
            for mode in MODES:
                out["batched"].append(await run_batched(client, texts, size, mode, rng))
                progress(f"batched {out['batched'][-1]}")
    return out


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process from /proc (None where there is no /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def progress(message: str) -> None:
    print(f"[probe] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="use this running server instead of starting one")
    parser.add_argument("--texts", type=int, default=16, help="labelled texts for the quality checks")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--levels", default="1,2,4,8")
    parser.add_argument("--batch-sizes", default="2,4,8")
    parser.add_argument("--n-threads", type=int, default=None)
    parser.add_argument("--n-threads-batch", type=int, default=None)
    parser.add_argument("--n-ctx", type=int, default=localmodel.DEFAULT_N_CTX)
    add_save_option(parser)
    args = parser.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",")]
    args.batch_sizes = [int(x) for x in args.batch_sizes.split(",")]

    report: dict[str, Any] = {"model": localmodel.MODEL_ALIAS}
    handle = None
    if args.base_url:
        base_url = args.base_url
    else:
        was_cached = (localmodel.cache_dir() / localmodel.MODEL_FILENAME).is_file()
        started = time.perf_counter()
        model = localmodel.ensure_model()
        report["model_fetch_s"] = round(time.perf_counter() - started, 2)
        report["model_cached"] = was_cached
        started = time.perf_counter()
        handle = localmodel.serve(
            port=0, n_ctx=args.n_ctx, n_threads=args.n_threads, model_path=model,
            n_threads_batch=args.n_threads_batch, directory=Path("bench/out/local-model"),
        )
        report["server_start_s"] = round(time.perf_counter() - started, 2)
        report["n_ctx"] = handle.info.n_ctx
        report["n_threads"] = handle.info.n_threads
        report["n_threads_batch"] = handle.info.n_threads_batch
        base_url = handle.base_url
    report["cpu_count"] = os.cpu_count()
    report["load_avg_1m_before"] = round(os.getloadavg()[0], 2)
    try:
        rows_path = Path(__file__).resolve().parents[1] / "examples" / "sentiment_labelled.jsonl"
        texts = load_labelled(rows_path, args.texts)
        load = load_labelled(rows_path, args.requests)
        report.update(asyncio.run(probe(base_url, args, texts, load)))
        report["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        if handle is not None:
            report["server_rss_mb"] = rss_mb(handle.process.pid)
    finally:
        if handle is not None:
            handle.stop()
    emit_report(report, args.save, name="local_model_probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
