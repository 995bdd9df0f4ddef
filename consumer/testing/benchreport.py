"""How a benchmark hands back its report: one JSON object on stdout and, with `--save`, the
same text in `bench/results/NAME.json`, the file a table of bench/README.md names.

Every report gets a `run` entry saying how it was made: the command, when it started and
finished (UTC), the tree's commit as it started (read when a benchmark imports this module:
the code it runs is loaded then), the machine's CPUs and its load average when the report was
written. The machine a figure is measured on is often shared, and a figure read under load
should say so.

    parser = argparse.ArgumentParser(...)
    add_save_option(parser)
    ...
    emit_report(report, args.save, name="kill_loop")

`bench/results/` is the directory beside the running script (`sys.argv[0]`): the benchmarks
are run as `bench/NAME.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["add_save_option", "emit_report", "results_dir", "run_facts"]

#: `--save` given without a name: the benchmark's own name for this run
_OWN_NAME = ""


def add_save_option(parser: argparse.ArgumentParser) -> None:
    """`--save [NAME]`: also write the report to bench/results/NAME.json."""
    parser.add_argument(
        "--save",
        nargs="?",
        const=_OWN_NAME,
        default=None,
        metavar="NAME",
        help="also write the JSON report to bench/results/NAME.json (no NAME: the bench's own "
        "name for this run)",
    )


def results_dir() -> Path:
    """bench/results/, beside the running benchmark script."""
    return Path(sys.argv[0]).resolve().parent / "results"


def _commit() -> str | None:
    """The checkout's commit (`+dirty` when its code has uncommitted changes: reports in
    bench/results/ do not count), if git can tell."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", ":!/bench/results"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: when the benchmark started, and the tree it started from
_STARTED_AT = _utc_now()
_STARTED_COMMIT = _commit()


def run_facts() -> dict[str, Any]:
    """How this report was made: command, start and end (UTC), commit, CPUs, load average
    (1, 5, 15 min) at the end."""
    script = Path(sys.argv[0])
    return {
        "command": shlex.join([f"{script.parent.name}/{script.name}", *sys.argv[1:]]),
        "started_at": _STARTED_AT,
        "finished_at": _utc_now(),
        "commit": _STARTED_COMMIT,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def emit_report(report: dict[str, Any], save: str | None, *, name: str) -> Path | None:
    """Print `report` (with its `run` facts) as JSON on stdout; with `save` (the `--save`
    option's value) also write it to bench/results/, as `save`.json or, when `save` names
    nothing, as `name`.json. Returns the path written, if any."""
    text = json.dumps({**report, "run": run_facts()}, indent=2, default=str)
    print(text, flush=True)
    if save is None:
        return None
    path = results_dir() / f"{save or name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"report written to {path}", file=sys.stderr)
    return path
