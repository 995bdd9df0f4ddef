"""A broker outage in `promptbus run`'s log: one WARNING when the broker goes, one INFO when it
is back, no ERROR line from aiokafka, and every job still answered.

The broker is private to this test (own state dir, free ports), so it can be SIGKILLed.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from consumer.testing.harness import (
    create_topics,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.integration.private_broker import private_broker

pytestmark = pytest.mark.integration

UNREACHABLE = re.compile(r" WARNING consumer\.kafka\.client_logs: Kafka broker\(s\) unreachable: ")
REACHABLE = re.compile(r" INFO consumer\.kafka\.client_logs: Kafka broker\(s\) reachable again after \d+ s")
AIOKAFKA_ERROR = re.compile(r" ERROR aiokafka")
#: the broker stays down this long (past the outage tracker's settle time) before its restart
OUTAGE_S = 3


def wait_for_line(service: ServiceProcess, pattern: re.Pattern[str], timeout_s: float) -> bool:
    """Poll the service log (bounded) until a line matches."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.log_path.exists() and pattern.search(service.log_path.read_text(errors="replace")):
            return True
        time.sleep(0.25)
    return False


def test_an_outage_logs_one_warning_and_one_info(tmp_path: Path) -> None:
    with private_broker("outage") as kafka, run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        env = service_env(kafka.bootstrap, partitions=2)
        settings = settings_from_env(env)
        asyncio.run(create_topics(settings))
        before = [job(i, batch=i % 2 == 0) for i in range(10)]
        after = [job(i, batch=i % 2 == 0) for i in range(10, 20)]
        service = ServiceProcess(env, tier_file_dict(base_url + "/v1"), tmp_path)
        service.start()
        try:
            asyncio.run(produce(settings, before))
            got = asyncio.run(wait_for_outcomes(settings, {j["id"] for j in before}, timeout_s=90))
            assert {j["id"] for j in before} <= got.ids(), service.log_tail()

            kafka.kill(1)
            assert wait_for_line(service, UNREACHABLE, timeout_s=30), service.log_tail()
            time.sleep(OUTAGE_S)
            kafka.restart(1)
            assert wait_for_line(service, REACHABLE, timeout_s=90), service.log_tail()

            asyncio.run(produce(settings, after))
            everything = {j["id"] for j in before + after}
            got = asyncio.run(wait_for_outcomes(settings, everything, timeout_s=120))
            assert everything <= got.ids(), service.log_tail()
            for j in before + after:
                assert got.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"])
        finally:
            code = service.terminate(timeout_s=60) if service.alive() else None
            service.ensure_stopped()
    assert code == 0, service.log_tail()
    lines = service.log_path.read_text(errors="replace").splitlines()
    assert [line for line in lines if AIOKAFKA_ERROR.search(line)] == []
    assert len([line for line in lines if UNREACHABLE.search(line)]) == 1, service.log_tail(80)
    assert len([line for line in lines if REACHABLE.search(line)]) == 1, service.log_tail(80)
