"""The kill loop: duplicates left by SIGKILLs of a real `promptbus run` under provider faults.

    .venv/bin/python bench/kill_loop.py [--jobs 1500] [--kill-at 4,9,14] [--seeds 1,2,3]
        [--kill-after-outcomes N] [--save [NAME]]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). The run
(`consumer.testing.faultrun.run_kill_loop`): N jobs (every other one batchable) on a fresh
4-partition topic; one tier on the simulator (20-50 ms answers, 429s, 500s, malformed batched
answers, requests that hang past the 1.5 s timeout; batching max_items 16, window 50 ms,
max_wait 500 ms; AIMD initial 4 max 32; up to 8 attempts); the service SIGKILLed at the given
seconds from its first start (or, with --kill-after-outcomes N, each time it has written N
outcomes of its own) and restarted a second later each time. One run per seed of the
simulator's faults, one after the other. Prints one JSON object: per run jobs, outcomes,
duplicates, lost, wrong, the duplicates per cause (see faultrun's docstring) and per kill the
outcomes the killed process had written and the ids still open; over the runs the mean and the
worst duplicates. `--save` writes it to bench/results/ (default name: kill_loop_by_time, or
kill_loop_after_outcomes).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.faultrun import KILL_LOOP_FAULTS, KillLoopShape, run_kill_loop


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Duplicates over the runs: each seed's, the mean and the worst (counts and shares)."""
    dups = [r["duplicates"] for r in runs]
    jobs = runs[0]["jobs"]
    return {
        "duplicates_by_seed": {str(r["seed"]): r["duplicates"] for r in runs},
        "duplicates_mean": round(sum(dups) / len(dups), 1),
        "duplicates_mean_share": round(sum(dups) / len(dups) / jobs, 4),
        "duplicates_max": max(dups),
        "duplicates_max_share": round(max(dups) / jobs, 4),
        "lost": sum(r["lost"] for r in runs),
        "wrong": sum(r["wrong"] for r in runs),
        "causes": {
            cause: sum(r["causes"].get(cause, 0) for r in runs)
            for cause in sorted({c for r in runs for c in r["causes"]})
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=KillLoopShape.jobs)
    parser.add_argument("--kill-at", default="4,9,14", help="seconds from the first start, comma-separated")
    parser.add_argument(
        "--seeds",
        default=str(KILL_LOOP_FAULTS.seed),
        help="seeds of the simulator's faults, comma-separated: one run each",
    )
    parser.add_argument(
        "--kill-after-outcomes",
        type=int,
        default=0,
        help="kill each process once it wrote this many outcomes of its own, as many kills as"
        " --kill-at names (default 0: at the --kill-at times)",
    )
    add_save_option(parser)
    args = parser.parse_args(argv)
    try:
        kill_at = tuple(float(s) for s in args.kill_at.split(",") if s.strip())
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--kill-at and --seeds take comma-separated numbers: {args.kill_at!r}, {args.seeds!r}")
    if not seeds:
        parser.error("--seeds names no seed")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    runs = []
    for seed in seeds:
        shape = KillLoopShape(
            jobs=args.jobs,
            kills=len(kill_at),
            kill_at_s=kill_at,
            kill_after_outcomes=args.kill_after_outcomes,
            simulator=dataclasses.replace(KILL_LOOP_FAULTS, seed=seed),
        )
        # kept after the run: the service log is where a lost or late job is explained
        workdir = Path(tempfile.mkdtemp(prefix=f"kill-loop-{seed}-"))
        run = {"seed": seed, **asyncio.run(run_kill_loop(bootstrap, shape, workdir))}
        if not run["finished"]:
            print(Path(run["log"]).read_text(errors="replace")[-4000:], file=sys.stderr)
        print(f"seed {seed}: {run['duplicates']} duplicates, {run['lost']} lost", file=sys.stderr)
        runs.append(run)
    report = {
        "jobs": args.jobs,
        "kill_at_s": list(kill_at),
        "kill_after_outcomes": args.kill_after_outcomes,
        "runs": runs,
        **summary(runs),
    }
    name = "kill_loop_after_outcomes" if args.kill_after_outcomes else "kill_loop_by_time"
    emit_report(report, args.save, name=name)
    return 0 if report["lost"] == 0 and report["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
