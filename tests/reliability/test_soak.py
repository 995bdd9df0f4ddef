"""A one-minute soak (`consumer.testing.soak`; the 30-minute one is `bench/soak.py`): steady
mixed traffic through the 3-node test cluster while the service is SIGKILLed, the broker node
leading most of the jobs topic's partitions is SIGKILLed and restarted, the provider is out, a
429 storm passes, poison records arrive and a second instance joins and leaves.

Nothing is lost, no good job is dead-lettered, every poison record is dead-lettered as an
invalid job, both instances exit 0 on SIGTERM, and every duplicate is one the SIGKILL explains
(an outcome acknowledged but not yet committed when the process died): the broker's death,
the outage, the storm and the second instance's join and leave redo nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from consumer.testing.cluster import LocalKafka, quick_session_s
from consumer.testing.soak import SoakShape, run_soak

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.slow]

#: faults short enough to fit a minute, long enough to open the circuit and fail over
ONE_MINUTE = SoakShape(minutes=1, broker_down_s=5, outage_s=5, storm_s=5, finish_wait_s=120)


async def test_a_minute_of_faults_loses_nothing(kafka_cluster: LocalKafka, tmp_path: Path) -> None:
    shape = dataclasses.replace(ONE_MINUTE, session_timeout_s=await quick_session_s(kafka_cluster.bootstrap))
    report = await run_soak(shape, tmp_path, cluster=kafka_cluster, progress=print)
    totals = report["totals"]
    for row in report["minutes"]:
        print(row)
    assert totals["finished"], f"not every job got an outcome in time: {totals}"
    assert totals["lost"] == 0, totals
    assert totals["dead_letters_good"] == {}, totals
    assert totals["dead_letters_poison"] == totals["poison"] > 0, totals
    assert all(set(row["dead_letters_poison"]) <= {"invalid_job"} for row in report["minutes"])
    assert totals["exit_codes"] == {"a": 0, "b": 0}, totals
    assert totals["killed_broker"] in (1, 2, 3), totals
    assert totals["duplicates_unexplained"] == {}, (totals, report.get("unexplained_examples"))
    assert totals["duplicates"] == totals["duplicates_by_the_kill"], totals
