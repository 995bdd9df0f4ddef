"""The mistakes a newcomer makes, each done as a user does it (the `promptbus` command as a
process) and answered by one true line: a job without a lane on a tier file with lanes, a
budget smaller than one request, an undecodable record's key, broken or misspelt tier files,
a job too large for the service, a group or tenant that does not exist, a misspelt setting."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from consumer.testing.harness import produce_raw, service_env, tier_file_dict
from consumer.testing.process import ServiceProcess, run_cli
from consumer.testing.simulator import SimulatorConfig, run_simulator


def _errors(proc_stderr: str) -> list[str]:
    return [line for line in proc_stderr.strip().splitlines() if line]


def test_broken_yaml_is_one_line_with_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text("tiers:\n  small:\n    provider: openai\n   model: x\n")
    proc = run_cli("check-config", "--config", str(path))
    assert proc.returncode == 2
    assert _errors(proc.stderr) == [
        f"promptbus: config error: {path}:4:4: not valid YAML: expected <block end>, but found "
        "'<block mapping start>' (while parsing a block mapping)"
    ]


def test_every_wrong_type_of_a_tier_file_is_said_at_once_a_line_each(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(
        "tiers:\n  small:\n    provider: openai\n    model: 5\n    timeout_s: soon\n"
        "    batching: {max_items: zero}\n"
    )
    proc = run_cli("check-config", "--config", str(path))
    assert proc.returncode == 2
    lines = _errors(proc.stderr)
    assert [line.split(": ")[2] for line in lines] == [
        "tiers.small.model",
        "tiers.small.timeout_s",
        "tiers.small.batching.max_items",
    ], lines
    assert all(
        line.startswith("promptbus: config error: ") and line.endswith(f"(in {path})") for line in lines
    )


def test_a_stray_key_is_named_with_the_key_it_is_near(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text("tier:\n  small: {provider: openai, model: m}\n")
    proc = run_cli("check-config", "--config", str(path))
    assert proc.returncode == 2
    assert _errors(proc.stderr) == [
        f"promptbus: config error: tier: unknown key, not permitted here; did you mean 'tiers'? (in {path})",
        f"promptbus: config error: tiers: Field required (in {path})",
    ]


def test_an_unset_key_variable_names_the_file_like_every_other_error(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text("tiers:\n  small: {provider: openai, model: m, api_key_env: PB_NEWCOMER_UNSET}\n")
    proc = run_cli("check-config", "--config", str(path), env={"PB_NEWCOMER_UNSET": ""})
    assert proc.returncode == 2
    assert _errors(proc.stderr) == [
        "promptbus: config error: tiers.small.api_key_env: environment variable PB_NEWCOMER_UNSET is "
        f"not set (in {path})"
    ]


def test_the_label_says_which_kind_of_input_was_wrong(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "tier": "small", "prompt": "x", "bogus": 1}\n')
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    job_file = run_cli("submit", "--file", str(jobs), env=env)
    assert job_file.returncode == 2
    assert _errors(job_file.stderr)[0].startswith(f"promptbus: job input error: {jobs}:1: invalid_job:")
    argument = run_cli("submit", "--tier", "small", env=env)
    assert argument.returncode == 2
    assert _errors(argument.stderr) == [
        "promptbus: usage error: submit: give --file FILE, or --tier and --prompt"
    ]


def test_an_unreachable_broker_is_said_in_one_wording_by_submit_and_map(tmp_path: Path) -> None:
    inputs = tmp_path / "in.txt"
    inputs.write_text("a\n")
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9999"}
    for command in (
        ["submit", "--tier", "small", "--prompt", "hi"],
        ["map", "--tier", "small", "--inputs", str(inputs), "--timeout-s", "5"],
    ):
        proc = run_cli(*command, env=env, timeout_s=90)
        assert proc.returncode == 1, proc.stderr
        (line,) = _errors(proc.stderr)
        assert line.startswith(
            "promptbus: cannot reach Kafka: no bootstrap server answered (127.0.0.1:9999"
        ), line
        assert "AddressFamily" not in line and "KafkaConnectionError" not in line


def test_a_misspelt_setting_is_warned_of_with_the_nearest_name(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text("tiers:\n  small: {provider: openai, model: m}\n")
    proc = run_cli("check-config", "--config", str(path), env={"PROMPTBUS_GROUPID": "mine"})
    assert proc.returncode == 0, proc.stderr
    assert (
        "warning: PROMPTBUS_GROUPID is not a promptbus setting and is ignored; did you mean "
        "PROMPTBUS_GROUP_ID?"
    ) in proc.stderr.splitlines()


@pytest.mark.integration
def test_stats_of_a_group_never_seen_and_of_a_tenant_name_that_is_none(kafka_bootstrap: str) -> None:
    env = service_env(kafka_bootstrap)
    group = run_cli("stats", "--group", "pb-no-such-group", env=env)
    assert group.returncode == 1 and group.stdout == ""
    assert _errors(group.stderr)[0].startswith(
        "promptbus stats: no instance of group 'pb-no-such-group' was seen and it committed no offsets"
    )
    tenant = run_cli("stats", "--tenant", "bad name!", env=env)
    assert tenant.returncode == 2
    assert _errors(tenant.stderr) == [
        "promptbus: usage error: --tenant: 'bad name!' is not a tenant name: it must be 1-64 characters "
        "of A-Z a-z 0-9 . _ - (got 9 characters)"
    ]


async def _dead_letter_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict]]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=3000)
        return [(r.key, orjson.loads(r.value)) for rs in batches.values() for r in rs]
    finally:
        await consumer.stop()


@pytest.mark.integration
def test_a_tier_file_with_lanes_a_tiny_budget_and_an_undecodable_record(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A job without a lane reaches the lowest-priority lane, `run` and `check-config` name the
    jobs topic no lane reads, `stats` counts only the topics the group reads; a budget smaller
    than one request is refused as that; a record that is not JSON keeps its key."""
    env = service_env(kafka_bootstrap, partitions=2)
    fast, bulk = env["PROMPTBUS_JOBS_TOPIC"] + ".fast", env["PROMPTBUS_JOBS_TOPIC"] + ".bulk"
    inputs = tmp_path / "in.txt"
    inputs.write_text("one\ntwo\nthree\n")
    with run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", batching=False)
        tiers["lanes"] = {"interactive": {"topic": fast}, "bulk": {"topic": bulk}}
        tiers["tenants"] = {"reports": {"budget": {"tokens_per_day": 300}, "on_exhausted": "dead_letter"}}
        service = ServiceProcess(env, tiers, tmp_path)
        check = run_cli("check-config", "--config", str(service.config_path), env=env)
        assert check.returncode == 0, check.stderr
        assert (
            f"note: PROMPTBUS_JOBS_TOPIC '{env['PROMPTBUS_JOBS_TOPIC']}' is read by no lane (lanes: "
            "interactive, bulk): jobs published there wait unread; promptbus's client and CLI send a "
            f"job without a lane to lane 'bulk' ({bulk})"
        ) in check.stdout.splitlines()
        assert (
            "note: tenant 'reports': 300 tokens/day is less than one request on tier 'small' is "
            "estimated at, 1024 output tokens (the tier names no max_tokens) plus its prompt: its jobs "
            "there are refused and nothing is spent (docs/tenants.md#budgets)"
        ) in check.stdout.splitlines()
        service.start()
        try:
            with_config = {**env, "PROMPTBUS_CONFIG": str(service.config_path)}
            mapped = run_cli(
                "map", "--tier", "small", "--inputs", str(inputs), "--timeout-s", "60", env=with_config
            )
            assert mapped.returncode == 0, (mapped.stderr, service.log_tail())
            assert len(mapped.stdout.splitlines()) == 3
            sent = run_cli(
                "submit",
                "--tier",
                "small",
                "--prompt",
                "a report",
                "--id",
                "rep-1",
                "--tenant",
                "reports",
                env=with_config,
            )
            assert sent.returncode == 0, sent.stderr
            assert f"no --lane: sent to the lowest-priority lane's topic {bulk}" in sent.stderr
            asyncio.run(produce_raw(kafka_bootstrap, bulk, [(b"raw-1", b"{not json")]))
            # a newcomer's job without a tier file: on the jobs topic, which no lane reads
            unread = run_cli("submit", "--tier", "small", "--prompt", "lost?", env=env)
            assert unread.returncode == 0, unread.stderr

            deadline = time.monotonic() + 60
            dead: dict[str, tuple[bytes | None, dict]] = {}
            while time.monotonic() < deadline and len(dead) < 2:
                records = asyncio.run(_dead_letter_records(kafka_bootstrap, env["PROMPTBUS_DLQ_TOPIC"]))
                dead = {d["error"]["kind"]: (key, d) for key, d in records}
            budget_key, budget = dead["budget_exhausted"]
            assert budget_key == b"rep-1" and budget["key"] == "rep-1"
            message = budget["error"]["message"]
            assert message.startswith("tenant 'reports': a request's estimate, ") and (
                "tokens, is more than the daily budget left (300 of 300 tokens free on" in message
            ), message
            raw_key, raw = dead["invalid_job"]
            assert raw_key == b"raw-1" and raw["key"] == "raw-1" and raw["id"] is None

            stats = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "lag: 0 records over 4 partitions" not in stats:
                time.sleep(0.5)
                stats = run_cli("stats", env=env).stdout
            # the two lanes' four partitions, not the unread jobs topic's record
            assert "lag: 0 records over 4 partitions" in stats.splitlines(), stats
        finally:
            service.terminate()
        log = service.log_path.read_text()
        assert f"PROMPTBUS_JOBS_TOPIC '{env['PROMPTBUS_JOBS_TOPIC']}' is read by no lane" in log
        assert f"topic {env['PROMPTBUS_JOBS_TOPIC']}: " not in log, "the unread jobs topic is not made"
