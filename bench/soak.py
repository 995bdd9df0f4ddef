"""The soak: steady mixed traffic through a 3-node cluster under a schedule of faults.

    .venv/bin/python bench/soak.py [MINUTES] [--save [NAME]]     (30 minutes by default)

Starts (unless it runs) its own 3-node local cluster (state in `.local/kafka-soak`, ports
29092.. and 29192..), the simulator and `promptbus run` processes, and runs
`consumer.testing.soak.run_soak`: a service SIGKILL, a SIGKILL and restart of the broker node
leading most of the jobs topic's partitions, a provider outage, a 429 storm, poison records, a
second instance joining and leaving. Prints one JSON object: a row per minute (outcomes, lost,
duplicates, dead letters by kind for good jobs and for poison, RSS and open fds per instance,
the faults of that minute) and totals (with each instance's exit code and the duplicates the
SIGKILL does not explain). Exits 1 when a job was lost, a good job was dead-lettered, a
duplicate is unexplained or an instance did not exit 0. Progress on stderr. The one-minute
version runs in `make test` (`tests/reliability/test_soak.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.soak import SoakShape, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("minutes", nargs="?", type=float, default=30.0, help="length of the run (default 30)")
    parser.add_argument("--minutes", dest="minutes_opt", type=float, help="the same, as an option")
    parser.add_argument("--rate", type=float, default=SoakShape.rate_per_s, help="jobs per second")
    add_save_option(parser)
    args = parser.parse_args(argv)
    minutes = args.minutes_opt if args.minutes_opt is not None else args.minutes
    if minutes <= 0:
        parser.error(f"minutes must be positive, got {minutes}")
    # the outcome reader's reconnect chatter while a broker node is down is not the report
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    report = asyncio.run(
        run_soak(
            SoakShape(minutes=minutes, rate_per_s=args.rate),
            workdir,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    )
    report["logs"] = str(workdir)
    emit_report(report, args.save, name=f"soak_{minutes:g}min")
    totals = report["totals"]
    clean = (
        totals["lost"] == 0
        and not totals["dead_letters_good"]
        and not totals["duplicates_unexplained"]
        and set(totals["exit_codes"].values()) <= {0}
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
