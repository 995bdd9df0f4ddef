"""promptbus against a SASL_SSL broker (SCRAM-SHA-512, its own CA): `run`, `submit`,
`results` and `stats` as real processes, and a wrong password as one clear line.

The broker is private to this module (`deploy/kafka-local/kafka start --security sasl_ssl`
in its own state dir on free ports); the client settings are the env lines `start` printed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from consumer.testing.cluster import LocalKafka
from consumer.testing.harness import service_env, tier_file_dict
from consumer.testing.process import ServiceProcess, run_cli
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.integration.private_broker import private_broker

pytestmark = pytest.mark.integration

JOBS = 50


@pytest.fixture(scope="module")
def sasl_kafka() -> Iterator[LocalKafka]:
    """A 1-node SASL_SSL broker for this module, stopped and deleted at its end."""
    with private_broker("sasl", security="sasl_ssl") as kafka:
        yield kafka


def sasl_env(kafka: LocalKafka, **extra: str) -> dict[str, str]:
    """Unique topics and group, plus the client settings the broker's `start` printed."""
    env = service_env(kafka.bootstrap, partitions=2)
    env.update(kafka.client_env)
    env.update(extra)
    return env


def test_start_prints_the_client_settings(sasl_kafka: LocalKafka) -> None:
    settings = sasl_kafka.client_env
    assert settings["KAFKA_BOOTSTRAP_SERVERS"] == sasl_kafka.bootstrap
    assert settings["PROMPTBUS_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    assert settings["PROMPTBUS_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert settings["PROMPTBUS_KAFKA__SASL_USERNAME"] == "promptbus"
    assert len(settings["PROMPTBUS_KAFKA__SASL_PASSWORD"]) >= 16
    assert Path(settings["PROMPTBUS_KAFKA__SSL_CAFILE"]).is_file()


def test_the_service_end_to_end_over_sasl_ssl(sasl_kafka: LocalKafka, tmp_path: Path) -> None:
    env = sasl_env(sasl_kafka)
    password = env["PROMPTBUS_KAFKA__SASL_PASSWORD"]
    texts = {f"sasl-{i}": f"sasl text {i}" for i in range(JOBS)}
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_bytes(
        b"\n".join(
            orjson.dumps(
                {
                    "id": jid,
                    "tier": "small",
                    "prompt": "Label it.\nTEXT:\n${t}",
                    "variables": {"t": text},
                    "batch": i % 2 == 0,
                }
            )
            for i, (jid, text) in enumerate(texts.items())
        )
    )
    with run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        service = ServiceProcess(env, tier_file_dict(base_url + "/v1"), tmp_path)
        service.start()
        code = None
        try:
            sub = run_cli("submit", "--file", str(jobs_file), env=env)
            assert sub.returncode == 0, sub.stderr
            assert f"submitted {JOBS} jobs" in sub.stderr
            results: dict[str, dict] = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and len(results) < JOBS:
                out = run_cli("results", env=env)
                assert out.returncode == 0, out.stderr
                results = {r["id"]: r for r in map(orjson.loads, out.stdout.splitlines())}
                if len(results) < JOBS:
                    time.sleep(1)
            assert set(results) == set(texts), service.log_tail()
            for jid, text in texts.items():
                assert results[jid]["status"] == "ok" and results[jid]["output"] == answer_for(text)
            merged: dict = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and merged.get("results") != JOBS:
                stats = run_cli("stats", "--json", env=env)
                assert stats.returncode == 0, stats.stderr
                merged = orjson.loads(stats.stdout)
                if merged.get("results") != JOBS:
                    time.sleep(1)
            assert merged["items_in"] == JOBS and merged["results"] == JOBS, merged
        finally:
            if service.alive():
                code = service.terminate(timeout_s=60)
            service.ensure_stopped()
    assert code == 0, service.log_tail()
    log = service.log_path.read_text(errors="replace")
    assert password not in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--config", "{config}"],
        ["submit", "--tier", "small", "--prompt", "hi", "--id", "never-sent"],
    ],
    ids=["run", "submit"],
)
def test_a_wrong_password_is_one_line_naming_the_user(
    sasl_kafka: LocalKafka, tmp_path: Path, command: list[str]
) -> None:
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump(tier_file_dict("http://127.0.0.1:1/v1")))
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = sasl_env(sasl_kafka, PROMPTBUS_KAFKA__SASL_PASSWORD=wrong)
    right = sasl_kafka.client_env["PROMPTBUS_KAFKA__SASL_PASSWORD"]
    proc = run_cli(*(arg.format(config=config) for arg in command), env=env)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "PROMPTBUS_KAFKA__SASL_USERNAME" in lines[0] and "'promptbus'" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    for secret in (wrong, right):
        assert secret not in proc.stdout + proc.stderr
