"""A two-minute soak (`consumer.testing.soak`, also `bench/soak.py`): steady mixed traffic
through its own 3-node cluster while the service is SIGKILLed, a broker node is SIGKILLed and
restarted, the provider is out, a 429 storm passes, poison records arrive and a second
instance joins and leaves. Nothing is lost, no good job is dead-lettered, and every poison
record is dead-lettered as an invalid job."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.testing.soak import SoakShape, run_soak

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]


async def test_two_minutes_of_faults_lose_nothing(tmp_path: Path) -> None:
    report = await run_soak(SoakShape(minutes=2), tmp_path, progress=lambda line: None)
    totals = report["totals"]
    for row in report["minutes"]:
        print(row)
    assert totals["finished"], f"not every job got an outcome in time: {totals}"
    assert totals["lost"] == 0, totals
    assert totals["dead_letters_good"] == {}, totals
    assert totals["dead_letters_poison"] == totals["poison"], totals
    assert all(set(row["dead_letters_poison"]) <= {"invalid_job"} for row in report["minutes"])
