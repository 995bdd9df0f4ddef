"""The `promptbus` command: check-config errors, and submit -> run -> results/stats through real processes."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import orjson
import pytest
import yaml

from consumer.testing.harness import produce_raw, service_env, tier_file_dict
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess, run_cli
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

#: `promptbus stats` calls while waiting for the instance's next snapshot
STATS_POLLS = 60


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
            {"tiers": {"a": {"provider": "openai", "model": "m", "quota": "key"}}},
            "tiers.a.quota",
            "unknown quota 'key'",
        ),
        (
            {
                "tiers": {"a": {"provider": "openai", "model": "m"}},
                "quotas": {"key": {"tokens_per_minute": 0}},
            },
            "quotas.key.tokens_per_minute",
            "greater than 0",
        ),
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
    proc = run_cli("check-config", "--config", str(path))
    assert proc.returncode == 2
    assert f"config error: {key}" in proc.stderr
    assert reason in proc.stderr


def test_check_config_accepts_the_example_and_run_refuses_a_missing_key(tmp_path: Path) -> None:
    ok = run_cli("check-config", "--config", str(REPO_ROOT / "examples" / "tiers.yaml"))
    assert ok.returncode == 0, ok.stderr
    assert "tier small: openai_compat" in ok.stdout
    path = tmp_path / "tiers.yaml"
    path.write_text(
        yaml.safe_dump(
            {"tiers": {"a": {"provider": "openai", "model": "m", "api_key_env": "PB_SURELY_UNSET_KEY"}}}
        )
    )
    proc = run_cli("run", "--config", str(path), env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert proc.returncode == 2
    assert "tiers.a.api_key_env" in proc.stderr and "PB_SURELY_UNSET_KEY" in proc.stderr


def test_check_config_notes_a_tier_without_embeddings_and_accepts_it(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    tiers = {
        "chat": {"provider": "anthropic", "model": "m"},
        "emb": {"provider": "openai_compat", "model": "e", "base_url": "http://127.0.0.1:8081/v1"},
    }
    path.write_text(yaml.safe_dump({"tiers": tiers}))
    proc = run_cli("check-config", "--config", str(path), env={"ANTHROPIC_API_KEY": "k"})
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: tier 'chat' (anthropic): anthropic has no embeddings endpoint; "
        "embed jobs are dead-lettered invalid_job"
    ]


#: tier files `run` refuses: check-config must refuse each the same way (one validation)
BAD_TIER_FILES = {
    "base_url not a URL": (
        {"tiers": {"t": {"provider": "openai_compat", "model": "m", "base_url": "not a url"}}},
        "tiers.t.base_url: must be an http(s) URL with a host, got 'not a url'",
    ),
    "base_url ftp": (
        {"tiers": {"t": {"provider": "openai_compat", "model": "m", "base_url": "ftp://x/v1"}}},
        "tiers.t.base_url: must be an http(s) URL with a host, got 'ftp://x/v1'",
    ),
    "API key unset": (
        {"tiers": {"t": {"provider": "openai", "model": "m", "api_key_env": "PB_SURELY_UNSET_KEY"}}},
        "tiers.t.api_key_env",
    ),
    "anthropic structured mode": (
        {
            "tiers": {
                "t": {
                    "provider": "anthropic",
                    "model": "m",
                    "api_key_env": "PB_DEMO_KEY",
                    "batching": {"structured": "json_object"},
                }
            }
        },
        "tiers.t.batching.structured: anthropic supports",
    ),
    "unknown key": ({"tiers": {"t": {"provider": "openai", "model": "m", "typo": 1}}}, "tiers.t.typo"),
}


@pytest.mark.parametrize("case", sorted(BAD_TIER_FILES))
def test_check_config_refuses_what_run_refuses_in_the_same_words(tmp_path: Path, case: str) -> None:
    tiers, expected = BAD_TIER_FILES[case]
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    # an unreachable broker: run must refuse the file before it contacts Kafka
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PB_DEMO_KEY": "x"}
    check = run_cli("check-config", "--config", str(path), env=env)
    run = run_cli("run", "--config", str(path), env=env, timeout_s=90)
    assert check.returncode == run.returncode == 2, (check.stderr, run.stderr)
    assert check.stderr.startswith(f"promptbus: config error: {expected}"), check.stderr
    assert run.stderr.strip().splitlines()[-1] == check.stderr.strip(), run.stderr
    assert "cannot reach Kafka" not in run.stderr and "Traceback" not in run.stderr
    assert check.stdout == ""


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("PROMPTBUS_PROCESSING_GUARANTEE", "maybe", "Input should be 'at_least_once' or 'exactly_once'"),
        ("PROMPTBUS_MAX_INFLIGHT", "0", "Input should be greater than or equal to 1"),
        ("PROMPTBUS_SESSION_TIMEOUT_S", "0", "Input should be greater than 0"),
        ("PROMPTBUS_KAFKA__SASL_MECHANISM", "MD5", "Input should be 'PLAIN', 'SCRAM-SHA-256' or"),
    ],
)
def test_a_bad_environment_setting_is_named_by_check_config_and_run(
    variable: str, value: str, reason: str
) -> None:
    example = str(REPO_ROOT / "examples" / "tiers.yaml")
    for command in ("check-config", "run"):
        proc = run_cli(
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
        proc = run_cli("run", "--config", str(REPO_ROOT / "examples" / "tiers.yaml"), env=env, timeout_s=90)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"config error: PROMPTBUS_METRICS_PORT: cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_commands_that_cannot_reach_kafka_say_so_in_one_line(tmp_path: Path) -> None:
    """An unreachable broker is the environment failing, not bad input: exit 1 (a supervisor
    starts the command again later), one line, no traceback."""
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PB_DEMO_KEY": "x"}
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a\nb\n")
    for command in (
        ["run", "--config", str(REPO_ROOT / "examples" / "tiers.yaml")],
        ["stats"],
        ["results"],
        ["submit", "--tier", "small", "--prompt", "hi"],
        ["map", "--tier", "small", "--inputs", str(inputs), "--timeout-s", "5"],
        ["replay", "--dlq"],
    ):
        proc = run_cli(*command, env=env, timeout_s=90)
        assert proc.returncode == 1, (command, proc.stderr[-2000:])
        # one wording whichever client found it (the connection check, or aiokafka's bootstrap)
        last = proc.stderr.strip().splitlines()[-1]
        unreachable = "promptbus: cannot reach Kafka: no bootstrap server answered (127.0.0.1:1"
        assert last.startswith(unreachable), last
        assert "Traceback" not in proc.stderr
        if command[0] != "run":  # run logs its start first
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Bad input per subcommand: the arguments, and what the one line on stderr must say."""
    missing = str(tmp / "missing.jsonl")
    empty = tmp / "empty.jsonl"
    empty.write_text("")
    not_json = tmp / "not-json.jsonl"
    not_json.write_text('{"id": "a", "tier": "small", "prompt": "hi"}\n{oops\n')
    bad_field = tmp / "bad-field.jsonl"
    bad_field.write_text('{"id": "a", "tier": "small", "prompt": 5}\n')
    bad_template = tmp / "bad-template.jsonl"
    bad_template.write_text('{"id": "a", "tier": "small", "prompt": "x ${a}", "variables": {"b": "1"}}\n')
    inputs = tmp / "inputs.txt"
    inputs.write_text("a\n")
    sources = tmp / "sources.yaml"
    sources.write_text(
        "tiers: {t: {provider: openai_compat, base_url: 'http://127.0.0.1:9/v1', model: m}}\n"
        "sources: {reviews: {topic: shop.reviews, tier: t, prompt: 'X:\\n${text}', into: {topic: out}}}\n"
    )
    cfg = ["--config", str(sources)]
    directory = str(tmp)  # a path that exists and cannot be read as a file
    lanes = tmp / "lanes.yaml"
    lanes.write_text(
        "tiers: {t: {provider: openai, model: m}}\n"
        "lanes: {interactive: {topic: jobs.fast}, standard: {topic: jobs.std}}\n"
    )
    return {
        "submit unknown lane": (
            ["submit", "--tier", "t", "--prompt", "x", "--lane", "nope", "--config", str(lanes)],
            "--lane: lane 'nope' is unknown (lanes: interactive, standard)",
        ),
        "submit lane without a tier file": (
            ["submit", "--tier", "t", "--prompt", "x", "--lane", "interactive"],
            "--config: no tier file given",
        ),
        "map unknown lane": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--lane", "nope", "--config", str(lanes)],
            "lane: lane 'nope' is unknown (lanes: interactive, standard)",
        ),
        "check-config missing file": (["check-config", "--config", missing], "--config: cannot read"),
        "check-config unreadable": (["check-config", "--config", directory], "Is a directory"),
        "check-config no file": (["check-config"], "--config: no tier file given"),
        "run missing file": (["run", "--config", missing], "--config: cannot read"),
        "submit missing file": (["submit", "--file", missing], "--file: cannot read"),
        "submit unreadable": (["submit", "--file", directory], "--file: cannot read"),
        "submit empty file": (["submit", "--file", str(empty)], "holds no jobs; nothing was submitted"),
        "submit bad JSON line": (["submit", "--file", str(not_json)], f"{not_json}:2: not JSON"),
        "submit bad field": (
            ["submit", "--file", str(bad_field)],
            f"{bad_field}:1: invalid_job: field 'prompt'",
        ),
        "submit bad template file": (
            ["submit", "--file", str(bad_template)],
            f"{bad_template}:1: template_error: missing variable 'a'; unknown variable 'b'",
        ),
        "submit missing variables": (
            ["submit", "--tier", "t", "--prompt", "x ${a} ${b}", "--batch"],
            "submit: template_error: missing variables 'a', 'b'; nothing was submitted",
        ),
        "submit bad --var": (
            ["submit", "--tier", "t", "--prompt", "x", "--var", "a"],
            "--var: expected name=value",
        ),
        "submit nothing": (["submit"], "give --file FILE, or --tier and --prompt"),
        "map missing inputs": (["map", "--tier", "t", "--inputs", missing], "--inputs: cannot read"),
        "map unreadable inputs": (
            ["map", "--tier", "t", "--inputs-jsonl", directory],
            "--inputs-jsonl: cannot read",
        ),
        "map bad JSON line": (["map", "--tier", "t", "--inputs-jsonl", str(not_json)], "not JSON"),
        "map empty inputs": (["map", "--tier", "t", "--inputs", str(empty)], "empty list, nothing to map"),
        "map bad --options": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--options", "{oops"],
            "--options: not JSON",
        ),
        "map --options not an object": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--options", "[1]"],
            "--options: must be a JSON object, got list",
        ),
        "map bad --mode": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--mode", "soon"],
            "unknown mode 'soon'",
        ),
        "map bad --timeout-s": (["map", "--timeout-s", "soon"], "argument --timeout-s: invalid float value"),
        "map --out unwritable": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--out", str(tmp / "no" / "out.jsonl")],
            "--out: cannot write",
        ),
        "map --collect without --total": (["map", "--collect", "r"], "--collect RUN_ID needs --total N"),
        "replay without --dlq": (["replay"], "give --dlq"),
        "replay bad --kind": (["replay", "--dlq", "--kind", "nope"], "--kind: unknown error kind 'nope'"),
        "replay bad --since": (["replay", "--dlq", "--since", "yesterday"], "--since: not an RFC 3339 time"),
        "stats unknown flag": (["stats", "--bogus"], "unrecognized arguments: --bogus"),
        "submit bad --tenant": (
            ["submit", "--tier", "t", "--prompt", "x", "--tenant", "two words"],
            "submit: invalid_job: field 'tenant'",
        ),
        "submit --file bad --tenant": (
            ["submit", "--file", str(bad_template), "--tenant", "x" * 65],
            "--tenant: must be 1-64 characters",
        ),
        "map bad --tenant": (
            ["map", "--tier", "t", "--inputs", str(inputs), "--tenant", "a/b"],
            "tenant: must be 1-64 characters",
        ),
        "results bad flag value": (
            ["results", "--follow=yes"],
            "argument --follow: ignored explicit argument",
        ),
        "backfill unknown source": (
            ["backfill", "nope", "--from", "2026-12-01T00:00:00Z", *cfg],
            "SOURCE: unknown source 'nope' (sources: reviews)",
        ),
        "backfill bad --from": (
            ["backfill", "reviews", "--from", "yesterday", *cfg],
            "--from: 'yesterday' is not an RFC 3339 time",
        ),
        "backfill --to before --from": (
            ["backfill", "reviews", "--from", "2026-12-02T00:00:00Z", "--to", "2026-12-01T00:00:00Z", *cfg],
            "--to: must be after --from",
        ),
        "simulate bad --port": (["simulate", "--port", "soon"], "argument --port: invalid int value"),
        "local-model unknown command": (["local-model", "start"], "invalid choice: 'start'"),
        "unknown command": (["frobnicate"], "invalid choice: 'frobnicate'"),
    }


def test_every_command_turns_bad_input_into_one_line_and_exit_2(tmp_path: Path) -> None:
    # an unreachable broker: bad input must be refused before Kafka is asked anything
    env = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "PB_DEMO_KEY": "x"}
    for case, (args, says) in _bad_inputs(tmp_path).items():
        proc = run_cli(*args, env=env, timeout_s=90)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (case, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (case, proc.stderr[-2000:])
        assert len(lines) == 1 and says in lines[0], (case, proc.stderr)
        assert lines[0].startswith("promptbus"), (case, lines[0])


@pytest.mark.integration
@pytest.mark.parametrize("prompt_mib", [5, 11], ids=["over-max-job-bytes", "over-a-record"])
def test_submit_refuses_a_file_with_a_job_the_service_would_dead_letter_for_its_size(
    kafka_bootstrap: str, tmp_path: Path, prompt_mib: int
) -> None:
    env = service_env(kafka_bootstrap, partitions=1)
    lines = [
        orjson.dumps({"id": "before", "tier": "small", "prompt": "hi"}),
        orjson.dumps({"id": "huge", "tier": "small", "prompt": "x" * (prompt_mib * 1024 * 1024)}),
        orjson.dumps({"id": "after", "tier": "small", "prompt": "hi"}),
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_bytes(b"\n".join(lines))
    proc = run_cli("submit", "--file", str(path), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    limit = "over PROMPTBUS_MAX_JOB_BYTES (1048576)"
    assert f"job input error: {path}:2: job is {len(lines[1])} bytes, {limit}" in proc.stderr
    assert "nothing was submitted" in proc.stderr

    async def topics() -> set[str]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
        await consumer.start()
        try:
            return set(await consumer.topics())
        finally:
            await consumer.stop()

    # the whole file is checked before Kafka is asked anything: not even the topic was made
    assert env["PROMPTBUS_JOBS_TOPIC"] not in asyncio.run(topics())


def test_bad_yaml_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tiers: [unclosed")
    assert "not valid YAML" in run_cli("check-config", "--config", str(path)).stderr
    assert "cannot read" in run_cli("check-config", "--config", str(tmp_path / "none.yaml")).stderr


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
            sub = run_cli("submit", "--file", str(jobs_file), env=env)
            assert sub.returncode == 0, sub.stderr
            assert "submitted 12 jobs" in sub.stderr
            one = run_cli(
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
                out = run_cli("results", env=env)
                assert "skipped record b'not-a-job': not UTF-8" in out.stderr
                results = {r["id"]: r for r in map(orjson.loads, out.stdout.splitlines())}
                time.sleep(0.5)
            assert set(results) == {f"cli-{i}" for i in range(12)} | {"cli-single"}, service.log_tail()
            for i, t in enumerate(texts):
                assert results[f"cli-{i}"]["output"] == answer_for(t)
            assert results["cli-single"]["output"] == answer_for("single")
            # a record another tool wrote to the stats topic is skipped, with a word on stderr
            foreign = [(b"not-an-instance", b"{oops")]
            asyncio.run(produce_raw(kafka_bootstrap, env["PROMPTBUS_STATS_TOPIC"], foreign))
            merged: dict = {}
            for _ in range(STATS_POLLS):  # bounded: until a snapshot published after the results
                stats = run_cli("stats", "--json", env=env)
                assert stats.returncode == 0, stats.stderr
                merged = orjson.loads(stats.stdout)
                if merged["results"] == 13:
                    break
                time.sleep(0.5)
            assert "skipped record b'not-an-instance', not a stats snapshot" in stats.stderr
            assert merged["items_in"] == 13 and merged["results"] == 13, merged
            assert merged["tiers"]["small"]["requests_saved"] > 0
            text = run_cli("stats", env=env).stdout
            assert "items in: 13" in text and "saved=" in text
            # the group asked about only: another group's stats are not this one's
            group = env["PROMPTBUS_GROUP_ID"]
            assert merged["group"] == group and text.startswith(f"group {group}:\n")
            other = run_cli("stats", "--json", "--group", f"{group}-other", env=env)
            assert other.returncode == 1 and other.stdout == "", other.stdout
            assert f"promptbus stats: no instance of group '{group}-other' was seen" in other.stderr
            every = orjson.loads(run_cli("stats", "--json", "--all-groups", env=env).stdout)["groups"]
            assert [g["items_in"] for g in every if g["group"] == group] == [13]
        finally:
            code = service.terminate(timeout_s=60) if service.alive() else None
            service.ensure_stopped()
    assert code == 0, service.log_tail()


def test_check_config_lists_the_tenants_and_notes_a_tier_without_pricing(tmp_path: Path) -> None:
    path = tmp_path / "tiers.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": {"a": {"provider": "openai_compat", "base_url": "http://127.0.0.1:1/v1",
                                "model": "m"}},
                "tenants": {"reports": {"budget": {"usd_per_day": 20}, "on_exhausted": "dead_letter"}},
            }
        )
    )
    ok = run_cli("check-config", "--config", str(path))
    assert ok.returncode == 0, ok.stderr
    assert "tenant reports: weight 1 budget $20/day, then dead_letter" in ok.stdout
    assert "note: tier 'a' has no pricing: its requests count as $0" in ok.stdout
    tiers = {"tiers": {"a": {"provider": "openai", "model": "m"}}, "tenants": {"t": {"weight": 0}}}
    path.write_text(yaml.safe_dump(tiers))
    bad = run_cli("check-config", "--config", str(path))
    assert bad.returncode == 2
    assert "config error: tenants.t.weight: Input should be greater than 0" in bad.stderr


@pytest.mark.integration
def test_submit_names_tenants_and_stats_prints_a_line_per_tenant(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=2)
    jobs_file = tmp_path / "jobs.jsonl"
    lines = [{"id": f"file-{i}", "tier": "small", "prompt": "Label it.\nTEXT:\n${t}", "variables": {"t": "x"}}
             for i in range(3)]
    lines[0]["tenant"] = "alpha"  # its own field wins over the header
    jobs_file.write_bytes(b"\n".join(orjson.dumps(line) for line in lines))
    with run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        tiers = tier_file_dict(base_url + "/v1")
        tiers["tenants"] = {"alpha": {}, "beta": {"weight": 2}}
        service = ServiceProcess(env, tiers, tmp_path)
        service.start()
        try:
            one = run_cli(
                "submit", "--tier", "small", "--prompt", "hello", "--id", "one", "--tenant", "alpha", env=env
            )
            assert one.returncode == 0, one.stderr
            assert run_cli("submit", "--file", str(jobs_file), "--tenant", "beta", env=env).returncode == 0
            deadline = time.monotonic() + 60
            results: dict[str, dict] = {}
            while time.monotonic() < deadline and len(results) < 4:
                lines = run_cli("results", env=env).stdout.splitlines()
                results = {r["id"]: r for r in map(orjson.loads, lines)}
                time.sleep(0.5)
            assert {i: r["tenant"] for i, r in results.items()} == {
                "one": "alpha", "file-0": "alpha", "file-1": "beta", "file-2": "beta",
            }, service.log_tail()
            stats_text = ""
            while time.monotonic() < deadline and "tenant beta: results=2" not in stats_text:
                time.sleep(0.5)  # until a stats interval has counted them
                stats_text = run_cli("stats", env=env).stdout
            assert "tenant alpha: results=2" in stats_text and "budget: unlimited" in stats_text
            only = run_cli("stats", "--tenant", "beta", env=env)
            assert only.returncode == 0 and only.stdout.strip().startswith("tenant beta: results=2")
            assert len(only.stdout.strip().splitlines()) == 1
            alpha = run_cli("stats", "--json", "--tenant", "alpha", env=env)
            assert orjson.loads(alpha.stdout)["results"] == 2
            nobody = run_cli("stats", "--tenant", "nobody", env=env)
            assert nobody.returncode == 1 and "counted as 'other'" in nobody.stderr
        finally:
            code = service.terminate(timeout_s=60) if service.alive() else None
            service.ensure_stopped()
    assert code == 0, service.log_tail()


@pytest.mark.integration
def test_stats_and_results_before_any_topic_exists(kafka_bootstrap: str) -> None:
    """A cluster no instance has published to yet: nothing to show, said plainly, exit 0."""
    env = service_env(kafka_bootstrap, partitions=1)  # fresh topic names, none created
    stats = run_cli("stats", env=env)
    assert stats.returncode == 0 and "Traceback" not in stats.stderr, stats.stderr[-2000:]
    assert stats.stdout.splitlines()[:2] == [
        f"group {env['PROMPTBUS_GROUP_ID']}:",
        "instances: 0 live, 0 seen",
    ]
    every = run_cli("stats", "--all-groups", env=env)
    assert every.stdout.strip() == "no promptbus instance has published stats on this cluster", every.stderr
    results = run_cli("results", env=env)
    assert (results.returncode, results.stdout, results.stderr) == (0, "", "")


@pytest.mark.integration
def test_submit_and_the_client_publish_to_the_lanes_topic(kafka_bootstrap: str, tmp_path: Path) -> None:
    import asyncio

    from consumer.client import AsyncClient
    from consumer.kafka.clients import read_topic
    from consumer.testing.harness import service_env, settings_from_env

    env = service_env(kafka_bootstrap, partitions=1)
    settings = settings_from_env(env)
    fast = f"{settings.jobs_topic}.fast"
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(
        "tiers: {t: {provider: openai, model: m}}\n"
        f"lanes: {{interactive: {{topic: {fast}}}, standard: {{topic: {settings.jobs_topic}}}}}\n"
    )
    proc = run_cli(
        "submit", "--tier", "t", "--prompt", "hi", "--lane", "interactive", "--config", str(tiers), env=env
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    client = AsyncClient(settings, config=str(tiers))
    assert client.lane_settings("interactive").jobs_topic == fast
    assert client.lane_settings(None).jobs_topic == settings.jobs_topic
    with pytest.raises(ValueError, match="lane 'bulk' is unknown"):
        client.lane_settings("bulk")

    async def read(topic: str) -> list[bytes | None]:
        return [k async for k, _ in read_topic(settings, topic, from_beginning=True, follow=False)]

    assert asyncio.run(read(fast)) == [job_id.encode()], "the job is on the lane's topic"
    assert asyncio.run(read(settings.jobs_topic)) == [], "and not on the jobs topic"
