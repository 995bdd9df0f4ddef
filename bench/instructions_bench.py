"""Instructions per job of the service's own path, counted by callgrind: a figure that does not
move with the machine's speed, where the timed benches' runs of one tree spread by 30-40%.

    .venv/bin/python bench/instructions_bench.py [--against REF] [--workloads batched,mixed,unbatched]
        [--jobs 1500,4500] [--save [NAME]]

Needs valgrind (`apt-get install valgrind`) and a C compiler (`cc`). No broker: each count
runs the service on the in-memory edges (`consumer.testing.harness.MemoryBus`, 4 partitions)
with the `FakeProvider` and the jobs, tier and fake answer of this tree's
bench/pipeline_bench.py (`batched`: every job `batch: true`; `mixed`: every other one;
`unbatched`: none), in a child process under
`valgrind --tool=callgrind --instr-atstart=no`. Instrumentation starts just before the service
does and stops once every outcome is out (callgrind's client requests, from a two-function C
helper built with `cc` into a temporary directory, with no CPU-specific flags). Instructions
per job = (count at N2 jobs - count at N1 jobs) / (N2 - N1), so start-up and shutdown cancel
out. Two runs of one tree agree within about 0.2%; what the fake provider and the in-memory
broker cost is counted too (alike for both trees).

`--against REF` counts the same for the tree at git REF (checked out in a temporary
`git worktree`, run with this tree's virtualenv and workload; REF needs the `consumer` modules
pipeline_bench.py imports) and prints `ratio` = this tree's count over REF's for each
workload: below 1 is cheaper. Prints one JSON object on stdout; progress goes to
stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# this script's sibling: both trees run this tree's workload. In a counted child process
# `consumer` is the tree under test's (its PYTHONPATH).
from pipeline_bench import TIER, WORKLOADS, _progress, fake_answer, make_jobs, tier_dict

from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.paths import REPO_ROOT

_HELPER_C = """
#include <valgrind/callgrind.h>
void promptbus_count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void promptbus_count_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""
_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


# ----------------------------------------------------------------------------------------------
# the child: one service run, counted from start to the last outcome


def child(jobs: int, batched_share: float, helper: str) -> None:
    """Run `jobs` jobs through the in-memory service, counting only while it runs."""
    import asyncio
    import ctypes
    import time

    import orjson

    import consumer
    from consumer.providers.fake import FakeProvider
    from consumer.runtime import eventloop
    from consumer.testing.harness import MemoryBus

    if not Path(consumer.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise SystemExit(f"imported {consumer.__file__}, not the tree under test ({Path.cwd()})")
    counter = ctypes.CDLL(helper)

    async def run() -> int:
        bus = MemoryBus(partitions=4)
        for job in make_jobs(jobs, batched_share=batched_share):
            bus.broker.append(bus.settings.jobs_topic, job["id"].encode(), orjson.dumps(job))
        fake = FakeProvider(fake_answer, name="openai_compat")
        service = bus.service(tier_dict("http://127.0.0.1:9/v1", batching=True), providers={TIER: fake})
        counter.promptbus_count_start()
        async with service:
            results = bus.broker.topic(bus.settings.results_topic)
            deadline = time.monotonic() + 1800
            # polled, not woken per appended record: a wake-up per result would be counted as
            # the service's instructions
            while sum(len(p) for p in results) < jobs and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            counter.promptbus_count_stop()
            return sum(len(p) for p in results)

    done = eventloop.run(run())
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} results came out")


# ----------------------------------------------------------------------------------------------
# the parent: builds the helper, runs the children, differences the counts


def build_helper(directory: Path) -> Path:
    """The client-request helper as a shared library (plain `cc -O2`: runs on any x86-64)."""
    source, library = directory / "count.c", directory / "libcount.so"
    source.write_text(_HELPER_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def count(tree: Path, jobs: int, batched_share: float, helper: Path, out_dir: Path) -> int:
    """Instructions callgrind counted while `jobs` jobs went through `tree`'s service."""
    out = out_dir / f"callgrind.{os.getpid()}.{jobs}.{batched_share}"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(jobs),
        str(batched_share),
        str(helper),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the counted run in {tree} failed:\n{done.stderr[-2000:]}")
    dumps = sorted(out_dir.glob(out.name + ".*"))  # the dump the stop request wrote
    if not dumps:
        raise SystemExit(f"callgrind wrote no dump for the run in {tree}")
    found = _TOTALS.search(dumps[-1].read_text())
    if found is None:
        raise SystemExit(f"no instruction total in {dumps[-1]}")
    return int(found.group(1))


def per_job(tree: Path, workload: str, jobs: tuple[int, int], helper: Path, out_dir: Path) -> int:
    low, high = (count(tree, n, WORKLOADS[workload], helper, out_dir) for n in jobs)
    return round((high - low) / (jobs[1] - jobs[0]))


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """The tree at git `ref`, checked out in a temporary worktree (removed afterwards)."""
    path = Path(tempfile.mkdtemp(prefix="instructions-bench-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref], cwd=REPO_ROOT, check=True, capture_output=True
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, capture_output=True
        )
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REF", help="also count the tree at this git ref")
    parser.add_argument("--workloads", default="batched", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("--jobs", default="1500,4500", help="N1,N2: the two run sizes differenced")
    add_save_option(parser)
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {', '.join(WORKLOADS)}")
    low, high = (int(n) for n in args.jobs.split(","))
    if not 0 < low < high:
        parser.error("--jobs needs N1,N2 with 0 < N1 < N2")
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install valgrind gcc)")
    report: dict[str, Any] = {"bench": "instructions_bench", "jobs": [low, high], "workloads": workloads}
    with tempfile.TemporaryDirectory(prefix="instructions-bench-") as scratch:
        helper = build_helper(Path(scratch))
        trees: dict[str, dict[str, int]] = {}
        with contextlib.ExitStack() as stack:
            sources = {"this tree": REPO_ROOT}
            if args.against:
                sources[args.against] = stack.enter_context(worktree(args.against))
            for name, tree in sources.items():
                trees[name] = {}
                for workload in workloads:
                    trees[name][workload] = per_job(tree, workload, (low, high), helper, Path(scratch))
                    _progress(f"{name} {workload}: {trees[name][workload]:,} instructions per job")
        report["instructions_per_job"] = trees
        if args.against:
            report["ratio"] = {w: round(trees["this tree"][w] / trees[args.against][w], 4) for w in workloads}
    emit_report(report, args.save, name="instructions_bench")


if __name__ == "__main__":
    main()
