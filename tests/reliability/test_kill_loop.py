"""The kill loop (`consumer.testing.faultrun.run_kill_loop`, also `bench/kill_loop.py`): 1,500
jobs, provider faults (429s, 500s, malformed batched answers, hangs past the timeout), three
SIGKILLs of a real `promptbus run`, each restarted a second later.

Nothing is lost or answered wrong, and duplicates stay at most 2% of the jobs: an acked
outcome is committed (or named in the commit's metadata) within a few milliseconds, so a kill
redoes only what was acked within the last commit round trip. The share is a count of
records, not a time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from consumer.testing.faultrun import KillLoopShape, run_kill_loop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_DUPLICATE_SHARE = 0.02


async def test_three_kills_under_provider_faults_lose_nothing_and_duplicate_little(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    report = await run_kill_loop(kafka_bootstrap, KillLoopShape(), tmp_path)
    print(report)
    log = (await asyncio.to_thread(Path(report["log"]).read_text, errors="replace"))[-3000:]
    assert report["finished"], f"not every job got an outcome in time\n{log}"
    assert report["kills"] == 3
    assert report["lost"] == 0, f"{report['lost']} jobs lost\n{log}"
    assert report["wrong"] == 0, "an outcome carries another job's answer"
    assert report["dead_letters"] == 0, "a good job was dead-lettered"
    assert report["duplicates"] <= MAX_DUPLICATE_SHARE * report["jobs"], report
