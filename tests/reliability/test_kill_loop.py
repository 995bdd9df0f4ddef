"""The kill loop (`consumer.testing.faultrun.run_kill_loop`, also `bench/kill_loop.py`): 1,500
jobs, provider faults (429s, 500s, malformed batched answers, hangs past the timeout, dropped
connections), three SIGKILLs of a real `promptbus run`, each restarted a second later.

Each kill comes once the running process has written `KILL_AFTER_OUTCOMES` outcomes of its
own, so every kill hits a process at work with jobs still open (not one still waiting to join
the group). Nothing is lost or answered wrong, no good job is dead-lettered, the last process
exits 0 on SIGTERM, and every duplicate is one a kill explains: an outcome acknowledged but
neither committed nor named in the commit's metadata when its process died. Nothing the
group had committed (watermark or metadata) is done again, and the commits did name finished
offsets above the watermark. How many duplicates that leaves depends on the commit round trip
at the moment of the kill, so the share is measured by `bench/kill_loop.py`, not asserted.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from consumer.testing.faultrun import KILL_LOOP_FAULTS, KillLoopShape, run_kill_loop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 3
KILL_AFTER_OUTCOMES = 100
#: what a kill may leave to redo: outcomes acknowledged but neither committed nor named in the
#: commit's metadata at the kill (or left out of metadata at its size limit)
KILL_CAUSES = {"acked_uncommitted", "metadata_full"}


async def test_three_kills_under_provider_faults_lose_nothing_and_redo_only_the_uncommitted(
    kafka_bootstrap: str, tmp_path: Path, short_session_s: float
) -> None:
    shape = KillLoopShape(
        kills=KILLS,
        kill_after_outcomes=KILL_AFTER_OUTCOMES,
        session_timeout_s=short_session_s,
        # dropped connections too: those jobs are retried and finish late, above the watermark
        simulator=dataclasses.replace(KILL_LOOP_FAULTS, drop_rate=0.02),
    )
    report = await run_kill_loop(kafka_bootstrap, shape, tmp_path)
    print(report)
    log = (await asyncio.to_thread(Path(report["log"]).read_text, errors="replace"))[-3000:]
    assert report["finished"], f"not every job got an outcome in time\n{log}"
    assert report["kills"] == KILLS
    # every kill hit a process at work: it had written outcomes of its own, jobs were still open
    killed = report["outcomes_by_process"][:KILLS]
    assert all(n >= KILL_AFTER_OUTCOMES for n in killed), (report["outcomes_by_process"], log)
    assert all(n > 0 for n in report["open_at_kill"]), report["open_at_kill"]
    assert report["lost"] == 0, f"{report['lost']} jobs lost\n{log}"
    assert report["wrong"] == 0, "an outcome carries another job's answer"
    assert report["dead_letters"] == 0, "a good job was dead-lettered"
    assert report["exit_code"] == 0, f"the last process did not drain and exit 0 on SIGTERM\n{log}"
    assert set(report["causes"]) <= KILL_CAUSES, report["causes"]
    assert sum(report["causes"].values()) == report["duplicates"], report
    assert report["metadata_chars_max"] > 0, "no commit named a finished offset above its watermark"
