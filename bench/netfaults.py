"""The network fault loop: a steady stream for N minutes under a random schedule of network
faults between promptbus, its broker and its provider, injected by a real Toxiproxy.

    .venv/bin/python bench/netfaults.py [--minutes 10] [--seed 54] [--rate 50] [--nodes 1]
        [--schedule 'provider_latency@5,brokers_down@12,...'] [--save [NAME]]

Starts its own Toxiproxy and a private proxied broker (1 node, or 3 with --nodes 3, which
adds `node_cut` to the faults drawn), the simulator (20 ms answers) behind its own proxy, and
runs the service in-process (`consumer.testing.netfaults.run_schedule`). The schedule is drawn
from the seed before the run and printed (stderr) as a `--schedule` argument that replays it:
each entry is FAULT@GAP, the fault applied GAP seconds after the previous one has recovered,
until the drawn faults fill --minutes. The stream (--rate jobs/s) runs for the whole
schedule and stops 10 s after the last fault; then every job sent must get its outcome.

Prints one JSON object: per fault its window's jobs, the jobs in flight when it began, lost,
duplicated, dead-lettered, inputs committed ahead of their outcome, and the time until results
flowed again after it ended; then the totals. `--save` writes it to bench/results/ (default
name: netfaults).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from consumer.testing.benchreport import add_save_option, emit_report
from consumer.testing.netcluster import ProxiedKafka, proxied_kafka
from consumer.testing.netfaults import FAULTS, Fault, NetRig, ScheduleReport, fault_tiers, run_schedule
from consumer.testing.simulator import SimulatorConfig, SimulatorServer
from consumer.testing.toxiproxy import Toxiproxy, run_toxiproxy

#: seconds between faults (after the previous one's recovery), drawn uniformly
GAP_S = (3.0, 15.0)
#: the stream goes on this long after the last fault
TAIL_S = 10.0
#: duplicates allowed under at_least_once, as a share of the jobs
DUPLICATE_SHARE = 0.02
#: a fault's recovery takes at most the session + 5 s; a schedule budgets this much for it
RECOVERY_BUDGET_S = 5.0


def draw_schedule(seed: int, minutes: float, names: list[str]) -> list[tuple[str, float]]:
    """(fault, gap) pairs drawn from `seed` until their durations and gaps fill `minutes`."""
    rng = random.Random(seed)
    out: list[tuple[str, float]] = []
    spent_s = 0.0
    while True:
        name = rng.choice(names)
        gap_s = round(rng.uniform(*GAP_S), 1)
        cost_s = gap_s + FAULTS[name].duration_s + RECOVERY_BUDGET_S
        if spent_s + cost_s > minutes * 60:
            return out
        out.append((name, gap_s))
        spent_s += cost_s


def parse_schedule(text: str) -> list[tuple[str, float]]:
    """`FAULT@GAP,...` as printed by a run."""
    out = []
    for item in text.split(","):
        name, _, gap = item.strip().partition("@")
        if name not in FAULTS:
            raise SystemExit(f"--schedule: unknown fault {name!r} (known: {', '.join(sorted(FAULTS))})")
        out.append((name, float(gap or 0)))
    return out


def report_of(
    run: ScheduleReport, schedule: list[tuple[str, float]], args: argparse.Namespace
) -> dict[str, Any]:
    """The printed report: the run's settings and replayable schedule, per fault, totals."""
    totals = run.totals.summary()
    return {
        "minutes": args.minutes,
        "seed": args.seed,
        "rate_per_s": args.rate,
        "nodes": args.nodes,
        "schedule": ",".join(f"{name}@{gap:g}" for name, gap in schedule),
        "faults": [
            {k: v for k, v in w.summary().items() if k not in ("finished", "snapshots")}
            | {"snapshots": w.snapshots}
            for w in run.faults
        ],
        "totals": totals,
        "duplicate_share": round(run.totals.duplicates / max(1, run.totals.jobs), 4),
        "within_bounds": run.totals.lost == 0
        and run.totals.dead == 0
        and run.totals.wrong == 0
        and not run.totals.ahead
        and run.totals.duplicates <= DUPLICATE_SHARE * run.totals.jobs
        and all(w.flowing_again for w in run.faults),
    }


@contextlib.contextmanager
def rig_servers(nodes: int) -> Iterator[tuple[Toxiproxy, ProxiedKafka]]:
    with tempfile.TemporaryDirectory() as tmp, run_toxiproxy(Path(tmp)) as toxi, proxied_kafka(
        "netfaults-bench", toxi, nodes=nodes
    ) as cluster:
        yield toxi, cluster


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    names = sorted(n for n in FAULTS if args.nodes == 3 or n != "node_cut")
    if args.schedule:
        schedule = parse_schedule(args.schedule)
    else:
        schedule = draw_schedule(args.seed, args.minutes, names)
    print(f"netfaults: seed {args.seed}; replay with --schedule '"
          + ",".join(f"{n}@{g:g}" for n, g in schedule) + "'", file=sys.stderr)
    jobs = int(args.rate * (args.minutes * 60 + 120))
    with rig_servers(args.nodes) as (toxi, cluster):
        async with SimulatorServer(SimulatorConfig(seed=args.seed, latency_ms=20)) as base_url:
            link = toxi.proxy("provider", upstream_port=int(base_url.rsplit(":", 1)[1]))
            rig = NetRig(link, cluster, node=2 if args.nodes == 3 else 1)
            faults: list[tuple[float, Fault]] = [(gap, FAULTS[name]) for name, gap in schedule]
            run = await run_schedule(
                rig, faults, fault_tiers(rig), jobs=jobs, rate_per_s=args.rate, stop_stream_after_s=TAIL_S,
                finish_wait_s=300, partitions=4, PROMPTBUS_TOPIC_REPLICATION=args.nodes,
            )
    return report_of(run, schedule, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs per second")
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    parser.add_argument("--schedule", default="", help="FAULT@GAP,... (a printed schedule, to replay it)")
    add_save_option(parser)
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    emit_report(report, args.save, name="netfaults")


if __name__ == "__main__":
    main()
