"""What each job costs: tokens and dollars per job, by how the jobs are sent.

    .venv/bin/python bench/cost_bench.py [--jobs 200] [--only PREFIX] [--save [NAME]]

The service (`run_service`, in this process, on the in-memory Kafka edges: no broker needed,
except for the deadline scenarios, whose offline jobs need one: `KAFKA_BOOTSTRAP_SERVERS`)
against the simulator speaking Anthropic's wire format with model `claude-sonnet-4-5`, which
caches a marked prefix of 1,024 tokens or more the way Anthropic does (`PromptCache`: the
first request writes it, later ones within 5 minutes read it). Every job is a classification
with a 1,500-token shared instruction and a 50-token input (4 characters a token), at
temperature 0. Priced at Claude Sonnet 4.5's list prices (USD per million tokens: input 3,
output 15, cache read 0.30, cache write 3.75). Scenarios, each on fresh topics:

    ordinary           one request per job, `prompt_cache: off`
    ordinary+cache     one request per job, `prompt_cache: auto` (a breakpoint after the instruction)
    batched            `batch: true`, up to 20 jobs a request, `prompt_cache: off`
    batched+cache      the same, `prompt_cache: auto`
    repeats            ordinary, 30% of the jobs repeat an earlier job's input, `dedupe: false`
    repeats+dedupe     the same stream, `dedupe: true`
    deadlines:online   1,000 jobs, half due in two days, half in ten minutes, all `mode: online`
    deadlines:auto     the same jobs with `mode: auto`: the ones due in two days go offline
                       (the Batch API at `batch_discount` 0.5), the others online

Per scenario: provider requests, input / cached / cache-written / output tokens per job, cost
per job (`consumer.core.cost`, from the tier's stats: the providers' own usage counts) and,
for batched ones, the saving of batching as the stats show it (an estimate from prompt lengths:
no `verify_fraction` here, so no job is asked twice). Tokens are the simulator's counts, so
they do not depend on the machine; nothing here is timed. Prints one JSON document (`--save`:
also bench/results/cost_bench.json, or cost_bench_PREFIX.json with `--only PREFIX`) and draws
`bench/results/cost_bench.png` (with `--only`: bench/out/cost_bench_PREFIX.png).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from consumer.core.cost import BatchSaving
from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.harness import MemoryBus
from consumer.testing.paths import REPO_ROOT
from consumer.testing.simulator import SimulatorConfig, SimulatorServer

MODEL = "claude-sonnet-4-5"
PRICING = {
    "input_per_mtok": 3.0,
    "output_per_mtok": 15.0,
    "cached_input_per_mtok": 0.30,
    "cache_write_per_mtok": 3.75,
}
_RULES = (
    "Read the customer review below and decide whether its overall sentiment is positive or "
    "negative. Weigh the reviewer's final verdict above passing remarks, treat sarcasm by what "
    "it means rather than what it says, and ignore shipping complaints unless they dominate. "
)
#: the shared instruction, about 1,500 tokens, ending with the data-marker line
INSTRUCTION = (_RULES * 24)[:5990] + "\nTEXT:\n"
PROMPT = INSTRUCTION + "${text}"
_WORDS = "great poor fine slow quick broken lovely awful decent sturdy cheap solid noisy calm".split()


def review(i: int) -> str:
    """A 50-token (about 200-character) input, distinct per `i`."""
    rng = random.Random(i)
    words = " ".join(rng.choice(_WORDS) for _ in range(40))
    return f"Review {i}: {words}"[:200]


#: the deadline scenarios' jobs, whatever --jobs says
DEADLINE_JOBS = 1000
#: the env var the offline tier reads its (simulated) key from: a Batch API call needs one
BENCH_KEY_ENV = "PB_COST_BENCH_KEY"


def tier_file(
    base_url: str, *, batching: bool, prompt_cache: str, dedupe: bool, offline: bool = False
) -> dict[str, Any]:
    """One Anthropic tier on the simulator; offline: its Batch API on, at half price."""
    extra: dict[str, Any] = {}
    if offline:
        extra = {
            "api_key_env": BENCH_KEY_ENV,
            "offline": {"enabled": True, "poll_s": 0.3, "collect_s": 0.3},
            "pricing": {**PRICING, "batch_discount": 0.5},
        }
    return {
        "tiers": {
            "claude": {
                "provider": "anthropic",
                "base_url": base_url,
                "model": MODEL,
                "options": {"temperature": 0, "max_tokens": 16},
                "timeout_s": 30,
                "batching": {"enabled": batching, "max_items": 20, "window_ms": 50, "max_wait_ms": 500},
                "limiter": {"algorithm": "fixed", "initial": 4, "min": 1, "max": 4},
                "prompt_cache": prompt_cache,
                "dedupe": dedupe,
                "pricing": PRICING,
                **extra,
            }
        }
    }


def jobs_for(n: int, *, batch: bool, repeat_share: float = 0.0) -> list[dict[str, Any]]:
    """`n` jobs; `repeat_share` of them repeat an earlier job's input (seeded)."""
    rng = random.Random(7)
    texts: list[str] = []
    for i in range(n):
        if texts and rng.random() < repeat_share:
            texts.append(rng.choice(texts))
        else:
            texts.append(review(i))
    return [
        {"id": f"job-{i}", "tier": "claude", "prompt": PROMPT, "variables": {"text": t}, "batch": batch}
        for i, t in enumerate(texts)
    ]


def deadline_jobs(n: int, mode: str) -> list[dict[str, Any]]:
    """`n` jobs of `mode`, every other one due in two days, the rest in ten minutes."""
    now = datetime.now(UTC)
    later, soon = (now + timedelta(days=2)).isoformat(), (now + timedelta(minutes=10)).isoformat()
    return [
        {**j, "mode": mode, "deadline": later if i % 2 == 0 else soon}
        for i, j in enumerate(jobs_for(n, batch=False))
    ]


SCENARIOS: dict[str, dict[str, Any]] = {
    "ordinary": {"batching": False, "prompt_cache": "off", "dedupe": False, "repeat": 0.0},
    "ordinary+cache": {"batching": False, "prompt_cache": "auto", "dedupe": False, "repeat": 0.0},
    "batched": {"batching": True, "prompt_cache": "off", "dedupe": False, "repeat": 0.0},
    "batched+cache": {"batching": True, "prompt_cache": "auto", "dedupe": False, "repeat": 0.0},
    "repeats": {"batching": False, "prompt_cache": "off", "dedupe": False, "repeat": 0.3},
    "repeats+dedupe": {"batching": False, "prompt_cache": "off", "dedupe": True, "repeat": 0.3},
    "deadlines:online": {"batching": False, "prompt_cache": "off", "dedupe": False, "mode": "online"},
    "deadlines:auto": {"batching": False, "prompt_cache": "off", "dedupe": False, "mode": "auto"},
}


async def run_scenario(name: str, spec: dict[str, Any], n: int) -> dict[str, Any]:
    """One scenario on fresh in-memory topics and a fresh simulator; its per-job numbers."""
    bus: Any = MemoryBus(partitions=2)
    mode = spec.get("mode")
    if mode is not None:
        # offline batches are tracked on a compacted Kafka topic: these run on a real broker
        from consumer.testing.harness import KafkaBus

        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not bootstrap:
            raise SystemExit(f"{name}: set KAFKA_BOOTSTRAP_SERVERS (offline jobs need a broker)")
        bus = KafkaBus(bootstrap, partitions=2)
        n = DEADLINE_JOBS
        jobs = deadline_jobs(n, mode)
        os.environ.setdefault(BENCH_KEY_ENV, "bench")
    else:
        jobs = jobs_for(n, batch=spec["batching"], repeat_share=spec["repeat"])
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        tiers = tier_file(
            base_url,
            batching=spec["batching"],
            prompt_cache=spec["prompt_cache"],
            dedupe=spec["dedupe"],
            offline=mode is not None,
        )
        service = bus.service(tiers)
        async with service:
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=300)
        t = service.stats_snapshot()["tiers"]["claude"]
    answered = len(outcomes.results)
    if answered != n or outcomes.dead:
        raise RuntimeError(f"{name}: {answered}/{n} answered, {len(outcomes.dead)} dead letters")
    late = sum(
        1
        for j in jobs
        if "deadline" in j
        and _when(outcomes.results[j["id"]][0]["completed_at"]) > datetime.fromisoformat(j["deadline"])
    )
    modes = [rs[0].get("mode", "online") for rs in outcomes.results.values()]
    saving = BatchSaving.from_counts(
        verify_batched_tokens=t["verify_batched_tokens"],
        verify_alone_tokens=t["verify_alone_tokens"],
        batched_tokens=t["batched_tokens"],
        alone_tokens_estimate=t["alone_tokens_estimate"],
    )
    return {
        "scenario": name,
        "jobs": n,
        "provider_requests": t["provider_requests"],
        "deduped": t["deduped"],
        "input_tokens_per_job": round(t["input_tokens"] / n, 1),
        "cached_input_tokens_per_job": round(t["cached_input_tokens"] / n, 1),
        "cache_write_tokens_per_job": round(t["cache_write_tokens"] / n, 1),
        "output_tokens_per_job": round(t["output_tokens"] / n, 1),
        "cost_usd_per_1000_jobs": round(t["cost_usd"] / n * 1000, 4),
        "batching_saved_tokens": (
            None
            if saving.saved_fraction is None
            else {"fraction": round(saving.saved_fraction, 3), "measured": saving.measured}
        ),
        "offline_jobs": modes.count("offline"),
        "answered_after_deadline": late,
    }


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Cost per 1,000 jobs and input tokens per job (cached part shaded) per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["scenario"] for r in rows]
    fig, (cost_ax, tok_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    cost_ax.bar(names, [r["cost_usd_per_1000_jobs"] for r in rows], color="#4c72b0")
    cost_ax.set_ylabel("USD per 1,000 jobs")
    cost_ax.set_title(f"Cost per 1,000 jobs ({MODEL} list prices)")
    uncached = [r["input_tokens_per_job"] - r["cached_input_tokens_per_job"] for r in rows]
    tok_ax.bar(names, uncached, color="#dd8452", label="input, not from the cache")
    tok_ax.bar(
        names,
        [r["cached_input_tokens_per_job"] for r in rows],
        bottom=uncached,
        color="#f2c49b",
        label="input read from the cache",
    )
    tok_ax.set_ylabel("input tokens per job")
    tok_ax.set_title("Input tokens per job (1,500-token instruction, 50-token input)")
    tok_ax.legend()
    for ax in (cost_ax, tok_ax):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name, spec in SCENARIOS.items():
        if args.only and not name.startswith(args.only):
            continue
        print(f"cost_bench: {name} ...", file=sys.stderr)
        rows.append(await run_scenario(name, spec, args.jobs))
    by_name = {r["scenario"]: r for r in rows}
    auto, online = by_name.get("deadlines:auto"), by_name.get("deadlines:online")
    deadline_row = None
    if auto is not None and online is not None:
        deadline_row = {
            "jobs": DEADLINE_JOBS,
            "online_usd_per_1000_jobs": online["cost_usd_per_1000_jobs"],
            "auto_usd_per_1000_jobs": auto["cost_usd_per_1000_jobs"],
            "auto_over_online": round(auto["cost_usd_per_1000_jobs"] / online["cost_usd_per_1000_jobs"], 4),
            "answered_after_deadline": auto["answered_after_deadline"] + online["answered_after_deadline"],
        }
    return {
        "model": MODEL,
        "pricing_usd_per_mtok": PRICING,
        "instruction_tokens": len(INSTRUCTION) // 4,
        "input_tokens": 50,
        "rows": rows,
        "deadlines": deadline_row,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--only", default="", help="run only the scenarios whose name starts with this")
    parser.add_argument("--plot", type=Path, default=None, help="where the plot goes (default above)")
    add_save_option(parser)
    args = parser.parse_args(argv)
    name = "cost_bench" + (f"_{re.sub(r'[^a-z0-9]+', '_', args.only.lower())}" if args.only else "")
    report = asyncio.run(main_async(args))
    emit_report(report, args.save, name=name)
    default_plot = REPO_ROOT / "bench" / ("out" if args.only else "results") / f"{name}.png"
    plot(report["rows"], args.plot or default_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
