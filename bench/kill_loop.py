"""The kill loop: duplicates left by SIGKILLs of a real `promptbus run` under provider faults.

    .venv/bin/python bench/kill_loop.py [--jobs 1500] [--kill-at 4,9,14] [--seed 7]

Needs a Kafka broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092). The run
(`consumer.testing.faultrun.run_kill_loop`): N jobs (every other one batchable) on a fresh
4-partition topic; one tier on the simulator (20-50 ms answers, 429s, 500s, malformed batched
answers, requests that hang past the 1.5 s timeout; batching max_items 16, window 50 ms,
max_wait 500 ms; AIMD initial 4 max 32; up to 8 attempts); the service SIGKILLed at the given
seconds from its first start (or, with --kill-after-outcomes N, each time it has written N
outcomes of its own) and restarted a second later each time. Prints one JSON object: jobs,
outcomes, duplicates, lost, wrong, the duplicates per cause (see faultrun's docstring) and per
kill the outcomes the killed process had written and the ids still open.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import orjson

from consumer.testing.faultrun import KILL_LOOP_FAULTS, KillLoopShape, run_kill_loop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=KillLoopShape.jobs)
    parser.add_argument("--kill-at", default="4,9,14", help="seconds from the first start, comma-separated")
    parser.add_argument("--seed", type=int, default=KILL_LOOP_FAULTS.seed)
    parser.add_argument(
        "--kill-after-outcomes",
        type=int,
        default=0,
        help="kill each process once it wrote this many outcomes of its own, as many kills as"
        " --kill-at names (default 0: at the --kill-at times)",
    )
    args = parser.parse_args(argv)
    try:
        kill_at = tuple(float(s) for s in args.kill_at.split(",") if s.strip())
    except ValueError:
        parser.error(f"--kill-at must be comma-separated seconds, got {args.kill_at!r}")
    shape = KillLoopShape(
        jobs=args.jobs,
        kills=len(kill_at),
        kill_at_s=kill_at,
        kill_after_outcomes=args.kill_after_outcomes,
        simulator=dataclasses.replace(KILL_LOOP_FAULTS, seed=args.seed),
    )
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    # kept after the run: the service log is where a lost or late job is explained
    workdir = Path(tempfile.mkdtemp(prefix="kill-loop-"))
    report = asyncio.run(run_kill_loop(bootstrap, shape, workdir))
    if not report["finished"]:
        print(Path(report["log"]).read_text(errors="replace")[-4000:], file=sys.stderr)
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0 if report["lost"] == 0 and report["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
