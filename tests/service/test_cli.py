"""The `promptbus` command: check-config errors, and submit -> run -> results/stats through real processes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml

from consumer.testing.harness import service_env, tier_file_dict
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.service.harness import ROOT, ServiceProcess, produce_raw

PROMPTBUS = [sys.executable, "-m", "consumer.cli"]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PROMPTBUS, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("tiers", "key", "reason"),
    [
        ({"tiers": {"a": {"provider": "nope", "model": "m"}}}, "tiers.a.provider", "openai"),
        (
            {"tiers": {"a": {"provider": "openai", "model": "m", "batching": {"max_items": 0}}}},
            "tiers.a.batching.max_items",
            "greater than or equal to 1",
        ),
        (
            {"tiers": {"a": {"provider": "openai", "model": "m", "limiter": {"initial": 99, "max": 8}}}},
            "tiers.a.limiter",
            "min <= initial <= max",
        ),
        (
            {"tiers": {"a": {"provider": "openai", "model": "m", "typo_key": 1}}},
            "tiers.a.typo_key",
            "not permitted",
        ),
        ({"tiers": {"a": {"provider": "openai_compat", "model": "m"}}}, "tiers.a", "base_url is required"),
        ({"tiers": {}}, "tiers", "at least 1"),
        (
            {
                "tiers": {
                    "a": {
                        "provider": "openai",
                        "model": "m",
                        "options": {"response_format": {"type": "json_object", "schema": {"type": 7}}},
                    }
                }
            },
            "tiers.a.options",
            "options.response_format: the schema is not a valid JSON Schema",
        ),
    ],
)
def test_check_config_names_the_bad_key(tmp_path: Path, tiers: dict, key: str, reason: str) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    proc = cli("check-config", "--config", str(path))
    assert proc.returncode == 2
    assert f"config error: {key}" in proc.stderr
    assert reason in proc.stderr


def test_check_config_accepts_the_example_and_run_refuses_a_missing_key(tmp_path: Path) -> None:
    ok = cli("check-config", "--config", str(ROOT / "examples" / "tiers.yaml"))
    assert ok.returncode == 0, ok.stderr
    assert "tier small: openai_compat" in ok.stdout
    path = tmp_path / "tiers.yaml"
    path.write_text(
        yaml.safe_dump(
            {"tiers": {"a": {"provider": "openai", "model": "m", "api_key_env": "PB_SURELY_UNSET_KEY"}}}
        )
    )
    proc = cli("run", "--config", str(path), env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert proc.returncode == 2
    assert "tiers.a.api_key_env" in proc.stderr and "PB_SURELY_UNSET_KEY" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("PROMPTBUS_PROCESSING_GUARANTEE", "maybe", "Input should be 'at_least_once' or 'exactly_once'"),
        ("PROMPTBUS_MAX_INFLIGHT", "0", "Input should be greater than or equal to 1"),
        ("PROMPTBUS_KAFKA__SASL_MECHANISM", "MD5", "Input should be 'PLAIN', 'SCRAM-SHA-256' or"),
    ],
)
def test_a_bad_environment_setting_is_named_by_check_config_and_run(
    variable: str, value: str, reason: str
) -> None:
    example = str(ROOT / "examples" / "tiers.yaml")
    for command in ("check-config", "run"):
        proc = cli(
            command, "--config", example, env={variable: value, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
        )
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.startswith(f"promptbus: config error: {variable}: {reason}"), proc.stderr
        assert "Traceback" not in proc.stderr and value not in proc.stderr.split(reason)[0]


@pytest.mark.integration
def test_run_with_its_metrics_port_taken_exits_2_naming_it(kafka_bootstrap: str) -> None:
    """A metrics address that cannot be listened on stops start-up at once with one config
    line; the process must not hang in its clean-up (the cli timeout would fail this)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = service_env(kafka_bootstrap, partitions=1, PROMPTBUS_METRICS_PORT=port)
        env["PROMPTBUS_METRICS_HOST"] = "127.0.0.1"
        proc = cli("run", "--config", str(ROOT / "examples" / "tiers.yaml"), env=env, timeout=90)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"config error: PROMPTBUS_METRICS_PORT: cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_commands_that_cannot_reach_kafka_say_so_in_one_line() -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PB_DEMO_KEY": "x"}
    for command in (["run", "--config", str(ROOT / "examples" / "tiers.yaml")], ["stats"], ["results"]):
        proc = cli(*command, env=env, timeout=90)
        assert proc.returncode == 1, (command, proc.stderr[-2000:])
        assert proc.stderr.strip().splitlines()[-1].startswith("promptbus: cannot reach Kafka:"), proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.integration
def test_submit_stops_at_a_line_no_record_can_carry(kafka_bootstrap: str, tmp_path: Path) -> None:
    from consumer.kafka.clients import read_topic
    from consumer.settings import load_settings

    env = service_env(kafka_bootstrap, partitions=1)
    lines = [
        orjson.dumps({"id": "before", "tier": "small", "prompt": "hi"}),
        orjson.dumps({"id": "huge", "tier": "small", "prompt": "x" * (11 * 1024 * 1024)}),
        orjson.dumps({"id": "after", "tier": "small", "prompt": "hi"}),
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b"\n".join(lines))
    proc = cli("submit", "--file", str(path), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"config error: {path}:2: job is {len(lines[1])} bytes, over the" in proc.stderr
    assert "the lines before it were submitted, none from it on" in proc.stderr

    async def submitted() -> list[bytes | None]:
        settings = load_settings(
            jobs_topic=env["PROMPTBUS_JOBS_TOPIC"], kafka_bootstrap_servers=kafka_bootstrap
        )
        return [
            key
            async for key, _ in read_topic(settings, settings.jobs_topic, from_beginning=True, follow=False)
        ]

    assert asyncio.run(submitted()) == [b"before"]


def test_bad_yaml_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tiers: [unclosed")
    assert "not valid YAML" in cli("check-config", "--config", str(path)).stderr
    assert "cannot read" in cli("check-config", "--config", str(tmp_path / "none.yaml")).stderr


@pytest.mark.integration
def test_submit_run_results_stats_through_the_cli(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(kafka_bootstrap, partitions=2)
    jobs_file = tmp_path / "jobs.jsonl"
    texts = [f"cli text {i}" for i in range(12)]
    jobs_file.write_bytes(
        b"\n".join(
            orjson.dumps(
                {
                    "id": f"cli-{i}",
                    "tier": "small",
                    "prompt": "Label it.\nTEXT:\n${t}",
                    "variables": {"t": t},
                    "batch": True,
                }
            )
            for i, t in enumerate(texts)
        )
    )
    with run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        service = ServiceProcess(env, tier_file_dict(base_url + "/v1"), tmp_path)
        service.start()
        try:
            sub = cli("submit", "--file", str(jobs_file), env=env)
            assert sub.returncode == 0, sub.stderr
            assert "submitted 12 jobs" in sub.stderr
            one = cli(
                "submit",
                "--tier",
                "small",
                "--prompt",
                "Label it.\nTEXT:\n${t}",
                "--var",
                "t=single",
                "--id",
                "cli-single",
                env=env,
            )
            assert one.returncode == 0, one.stderr
            assert one.stdout.strip() == "cli-single"
            # a record another tool wrote: skipped with a word on stderr, the rest still printed
            foreign_result = [(b"not-a-job", b"\xff\xfe not utf-8")]
            asyncio.run(produce_raw(kafka_bootstrap, env["PROMPTBUS_RESULTS_TOPIC"], foreign_result))
            deadline = time.monotonic() + 60
            results: dict[str, dict] = {}
            while time.monotonic() < deadline and len(results) < 13:
                out = cli("results", env=env)
                assert "skipped record b'not-a-job': not UTF-8" in out.stderr
                results = {r["id"]: r for r in map(orjson.loads, out.stdout.splitlines())}
                time.sleep(0.5)
            assert set(results) == {f"cli-{i}" for i in range(12)} | {"cli-single"}, service.log_tail()
            for i, t in enumerate(texts):
                assert results[f"cli-{i}"]["output"] == answer_for(t)
            assert results["cli-single"]["output"] == answer_for("single")
            time.sleep(1.5)  # one more stats interval
            # a record another tool wrote to the stats topic is skipped, with a word on stderr
            foreign = [(b"not-an-instance", b"{oops")]
            asyncio.run(produce_raw(kafka_bootstrap, env["PROMPTBUS_STATS_TOPIC"], foreign))
            stats = cli("stats", "--json", env=env)
            assert stats.returncode == 0, stats.stderr
            assert "skipped record b'not-an-instance', not a stats snapshot" in stats.stderr
            merged = orjson.loads(stats.stdout)
            assert merged["items_in"] == 13 and merged["results"] == 13
            assert merged["tiers"]["small"]["requests_saved"] > 0
            text = cli("stats", env=env).stdout
            assert "items in: 13" in text and "saved=" in text
        finally:
            code = service.terminate(timeout_s=60) if service.alive() else None
            service.ensure_stopped()
    assert code == 0, service.log_tail()
