"""The producer-side client (`consumer.client`) and `promptbus map`.

Pure parts without a broker (input checks, in-order assembly and dedupe, run ids, the
progress bar, input files); then against a real broker, the real service (a `promptbus run`
process shared by the module, or one of a test's own) and the simulator over real HTTP,
whose answer to an input is `answer_for(input)`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumer.client import (
    AsyncClient,
    Client,
    MapError,
    MapTimeout,
    Outcome,
    Progress,
    ProgressBar,
    RunTracker,
    failure_counts,
    new_run_id,
    read_inputs,
    run_started_at,
)
from consumer.core.templates import render
from consumer.settings import Settings
from consumer.testing.harness import (
    InProcessService,
    read_outcomes,
    service_env,
    settings_from_env,
    slow_tier,
    tier_file_dict,
)
from consumer.testing.paths import REPO_ROOT
from consumer.testing.process import ServiceProcess, logs_of, run_cli
from consumer.testing.simulator import SimulatorConfig, answer_for, extract_input, run_simulator

TEMPLATE = "Classify the sentiment of the text.\nTEXT:\n${text}"
#: the simulator answers "sim:" + 12 hex digits; this format refuses the answers whose first
#: digit is "f", so about one input in 16 is dead-lettered `output_invalid`, always the same ones
PICKY = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "string", "pattern": "^sim:[0-9a-e]"}},
    }
}
#: bounds of the waits (none is a time the test asserts)
MAP_TIMEOUT_S = 120.0


def breaks_picky(text: str) -> bool:
    return answer_for(text)[4] == "f"


def texts(tag: str, n: int, start: int = 0) -> list[str]:
    return [f"{tag} text number {i}" for i in range(start, start + n)]


def assert_answers(outcomes: list[Outcome], inputs: list[str], run_id: str, *, picky: bool = False) -> None:
    """One outcome per input, in order, each the simulator's answer to its own input."""
    assert len(outcomes) == len(inputs)
    for i, (o, text) in enumerate(zip(outcomes, inputs, strict=True)):
        assert (o.index, o.id, o.pending) == (i, f"{run_id}-{i}", False), o
        if picky and breaks_picky(text):
            assert not o.ok and o.error is not None and o.error.kind == "output_invalid", (i, o)
        else:
            assert o.ok, (i, o.error)
            assert o.output == answer_for(text), i
            assert o.result is not None and o.result["id"] == o.id


def run_of(outcomes: list[Outcome]) -> str:
    return outcomes[0].id.rsplit("-", 1)[0]


def lines_of(stdout: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stdout.splitlines() if line.strip()]


# ================================================================== no broker
NO_BROKER = "127.0.0.1:1"  # nothing listens: a check that passed would hang or fail to connect


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.map("small", []), "inputs: empty list"),
        (lambda c: c.map("small", ["a", 3], prompt=TEMPLATE), "input 1: expected a string or a dict"),
        (lambda c: c.map("small", "abc"), "inputs: must be a list"),
        (lambda c: c.map("small", ["a"], prompt="Say ${a} and ${b}", batch=True), "not batchable"),
        (lambda c: c.map("small", ["a"], prompt=TEMPLATE + "\n", batch=True), "not at its very end"),
        (lambda c: c.map("small", ["a"], mode="later"), "mode: unknown mode 'later'"),
        (lambda c: c.map("small", ["a", {"txt": "b"}], prompt=TEMPLATE), "input 1: missing variable 'text'"),
        (lambda c: c.map("small", [{"text": 5}], prompt=TEMPLATE), "input 0: variable 'text' is int"),
        (lambda c: c.map("small", ["a"], prompt="${a} ${b}"), "input 0: a string fills"),
        (lambda c: c.map("small", [{"text": "a"}]), "input 0: a dict of variables needs prompt="),
        (lambda c: c.map("small", ["a"], options={"max_tokens": "50"}), "options.max_tokens"),
        (lambda c: c.map("small", ["a"], run_id="r" * 256), "run_id: job ids RUN_ID-INDEX would be"),
        (lambda c: c.map_chat("small", [[{"role": "robot", "content": "x"}]]), "conversation 0, message 0"),
        (lambda c: c.map_chat("small", [[]]), "conversation 0: expected a non-empty list"),
        (lambda c: c.map_jobs([{"tier": "small", "prompt": "x ${a}"}]), "job 0: missing variable 'a'"),
        (
            lambda c: c.map_jobs(
                [{"tier": "s", "prompt": "p"}, {"tier": "s", "messages": [], "batch": True}]
            ),
            "job 1: field 'messages'",
        ),
        (
            lambda c: c.map_jobs(
                [{"tier": "s", "messages": [{"role": "user", "content": "x"}], "batch": True}]
            ),
            "job 0: batch=True: a chat job",
        ),
        (lambda c: c.map_jobs([{"tier": "s", "prompt": "p", "typo": 1}]), "job 0: field 'typo'"),
        (lambda c: c.collect("plain-run-id", 3), "carries no start time"),
        (lambda c: c.map_embed("small", []), "texts: empty list"),
        (lambda c: c.map_embed("small", ["a", 3]), "text 1: expected a string, got int"),
        (lambda c: c.map_embed("small", ["a"], options={"dimensions": 0}), "options.dimensions"),
        (lambda c: c.map_jobs([{"tier": "s", "kind": "embed"}]), "job 0: job: an embed job needs 'input'"),
        (lambda c: c.map("small", ["a"], tenant="two words"), "tenant: must be 1-64 characters"),
        (lambda c: c.map_jobs([{"tier": "s", "prompt": "p", "tenant": ""}]), "job 0: field 'tenant'"),
    ],
)
def test_bad_input_fails_before_anything_is_produced(call: Any, message: str) -> None:
    with Client(kafka_bootstrap_servers=NO_BROKER) as client, pytest.raises(ValueError) as info:
        call(client)
    assert message in str(info.value)


def test_a_job_over_the_services_limit_is_refused_up_front() -> None:
    with Client(kafka_bootstrap_servers=NO_BROKER, max_job_bytes=200) as client:
        with pytest.raises(ValueError, match=r"input 1: the job is \d+ bytes, over the 200"):
            client.map("small", ["short", "x" * 300], prompt=TEMPLATE)


def test_the_blocking_client_refuses_a_running_loop() -> None:
    async def inside() -> None:
        with Client(kafka_bootstrap_servers=NO_BROKER) as client:
            client.map("small", ["a"])

    with pytest.raises(RuntimeError, match="use AsyncClient"):
        asyncio.run(inside())


def _result(jid: str, output: str) -> bytes:
    return orjson.dumps({"id": jid, "status": "ok", "output": output})


def _dead(jid: str, kind: str) -> bytes:
    return orjson.dumps({"id": jid, "status": "failed", "error": {"kind": kind, "message": "why"}})


def test_tracker_assembles_in_order_counts_duplicates_once_and_ignores_other_runs() -> None:
    tracker = RunTracker("run1", 5)
    assert tracker.add_result(b"run1-3", _result("run1-3", "three"))
    assert tracker.add_dead_letter(b"run1-1", _dead("run1-1", "retries_exhausted"))
    # another run, a longer run id sharing the prefix, out-of-range and non-canonical indexes
    for key in (b"run2-0", b"run1x-0", b"run1-5", b"run1-01", b"run1-1-2", b"run1-"):
        assert not tracker.add_result(key, _result(key.decode(), "no"))
    # at_least_once redelivery: a second outcome of an index (even of the other kind) is dropped
    assert not tracker.add_result(b"run1-3", _result("run1-3", "three again"))
    assert not tracker.add_result(b"run1-1", _result("run1-1", "late"))
    # a dead letter without a key (the service could not read an id from the key) still counts
    assert tracker.add_dead_letter(None, _dead("run1-0", "invalid_job"))
    assert not tracker.add_result(b"run1-2", b"not json")
    assert not tracker.add_result(b"run1-2", None)  # a tombstone
    assert (tracker.done, tracker.failed, tracker.duplicates, tracker.complete) == (3, 2, 2, False)
    assert tracker.progress(2.0) == Progress(done=3, failed=2, total=5, elapsed_s=2.0)

    outcomes = tracker.outcomes()
    assert [o.index for o in outcomes] == [0, 1, 2, 3, 4]
    assert [o.id for o in outcomes] == [f"run1-{i}" for i in range(5)]
    assert [(o.ok, o.pending) for o in outcomes] == [
        (False, False),
        (False, False),
        (False, True),
        (True, False),
        (False, True),
    ]
    assert outcomes[3].output == "three" and outcomes[3].result == orjson.loads(_result("run1-3", "three"))
    assert outcomes[1].error is not None and outcomes[1].error.kind == "retries_exhausted"
    assert failure_counts(outcomes) == {"retries_exhausted": 1, "invalid_job": 1}

    assert tracker.add_result(b"run1-2", _result("run1-2", "two"))
    assert tracker.add_result(b"run1-4", _result("run1-4", "four"))
    assert tracker.complete and all(not o.pending for o in tracker.outcomes())


def test_map_error_and_map_timeout_carry_the_outcomes() -> None:
    tracker = RunTracker("r", 2)
    tracker.add_dead_letter(b"r-0", _dead("r-0", "output_invalid"))
    err = MapError("r", tracker.outcomes())
    assert len(err.outcomes) == 2 and "1 of 2 inputs failed (output_invalid=1)" in str(err)
    timeout = MapTimeout("r", tracker.outcomes(), timeout_s=5, started_at=1.5)
    assert isinstance(timeout, TimeoutError)
    assert (timeout.run_id, timeout.total, timeout.started_at) == ("r", 2, 1.5)
    assert "collect('r', 2)" in str(timeout)


def test_a_generated_run_id_carries_its_start_time() -> None:
    run_id = new_run_id(1796113410.123, "9f3a1c2e")
    assert run_id == "20261201T082330123Z-9f3a1c2e"
    assert run_started_at(run_id) == pytest.approx(1796113410.123, abs=1e-6)
    assert run_started_at("my-run") is None
    assert run_started_at("20261399T999999000Z-x") is None  # not a time


def test_progress_bar_plain_lines_are_rate_limited_but_the_last_always_shows() -> None:
    now = [0.0]
    out = io.StringIO()
    bar = ProgressBar(out, tty=False, every_s=5, clock=lambda: now[0])
    for done in range(0, 10):
        now[0] = done * 1.0
        bar(Progress(done=done, failed=done // 4, total=10, elapsed_s=now[0] or 1.0))
    bar.close()  # the held-back progress (done 9) is shown
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("map: 0/10 done, 0 failed")
    assert lines[1].startswith("map: 5/10 done, 1 failed, 1/s, ETA 5s")
    assert lines[2].startswith("map: 9/10 done, 2 failed")
    assert len(lines) == 3
    bar(Progress(done=10, failed=2, total=10, elapsed_s=10.0))  # the end always prints
    assert out.getvalue().splitlines()[-1] == "map: 10/10 done, 2 failed, 1/s, ETA 0s"

    tty = io.StringIO()
    bar = ProgressBar(tty, tty=True, clock=lambda: 0.0)
    bar(Progress(done=6, failed=0, total=24, elapsed_s=2.0))
    bar.close()
    assert tty.getvalue() == "\r[######------------------] 6/24 done, 0 failed, 3/s, ETA 6s\x1b[K\n"


def test_input_files(tmp_path: Path) -> None:
    plain = tmp_path / "in.txt"
    plain.write_text("first\n\nthird ${x}\n", encoding="utf-8")
    assert read_inputs(str(plain), jsonl=False) == ["first", "", "third ${x}"]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('"a string"\n\n{"text": "b"}\n', encoding="utf-8")
    assert read_inputs(str(jsonl), jsonl=True) == ["a string", {"text": "b"}]
    jsonl.write_text('"ok"\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"in.jsonl:2: expected a JSON string or object, got list"):
        read_inputs(str(jsonl), jsonl=True)


# ================================================================== real broker, shared service
def two_tiers(clean_url: str, faulty_url: str) -> dict[str, Any]:
    """`small` on a well-behaved simulator; `faulty` on one answering 500 to a quarter of the
    requests, with two attempts per request (so some jobs end `retries_exhausted`)."""
    tiers = tier_file_dict(clean_url + "/v1", max_items=10)
    faulty = tier_file_dict(
        faulty_url + "/v1",
        max_items=10,
        retry={"max_attempts": 2, "backoff_initial_s": 0.02, "backoff_max_s": 0.1},
    )
    tiers["tiers"]["faulty"] = faulty["tiers"]["small"]
    return tiers


@pytest.fixture(scope="module")
def shared(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A `promptbus run` process with tiers `small` and `faulty`; yields its environment."""
    env = service_env(kafka_bootstrap, partitions=4)
    workdir = tmp_path_factory.mktemp("client")
    with (
        run_simulator(SimulatorConfig(latency_ms=2, jitter_ms=1, seed=1)) as clean,
        run_simulator(SimulatorConfig(latency_ms=2, jitter_ms=1, error_rate=0.25, seed=2)) as faulty,
    ):
        service = ServiceProcess(env, two_tiers(clean, faulty), workdir, name="shared")
        service.start()
        try:
            yield env
        finally:
            code = service.terminate(timeout_s=60) if service.alive() else None
            service.ensure_stopped()
            assert code in (0, None), f"exit {code}\n{logs_of([service])}"


@pytest.mark.integration
async def test_thousand_inputs_batched_and_not_with_failures(shared: dict[str, str]) -> None:
    settings = settings_from_env(shared)
    batched, single = texts("batched", 500), texts("single", 500, start=500)
    seen: list[Progress] = []
    async with AsyncClient(settings) as client:
        outcome_lists = await asyncio.gather(
            client.map(
                "faulty",
                batched,
                prompt=TEMPLATE,
                batch=True,
                options=PICKY,
                on_progress=seen.append,
                timeout_s=MAP_TIMEOUT_S,
            ),
            client.map("faulty", single, prompt=TEMPLATE, options=PICKY, timeout_s=MAP_TIMEOUT_S),
        )

    kinds: dict[str, int] = {}
    for outcomes, inputs in zip(outcome_lists, (batched, single), strict=True):
        run_id = run_of(outcomes)
        assert len(outcomes) == len(inputs)
        for i, (o, text) in enumerate(zip(outcomes, inputs, strict=True)):
            assert (o.index, o.id, o.pending) == (i, f"{run_id}-{i}", False)
            if o.ok:
                assert o.output == answer_for(text) and not breaks_picky(text), (i, o)
                assert o.error is None and o.result is not None and o.result["id"] == o.id
            else:
                assert o.error is not None and o.output is None and o.result is None
                # a request that kept failing fails its jobs whatever their answer would have been
                assert o.error.kind in ("output_invalid", "retries_exhausted"), o.error
                if o.error.kind == "output_invalid":
                    assert breaks_picky(text), (i, o.error)
                    assert "does not match the response_format schema" in o.error.message
                kinds[o.error.kind] = kinds.get(o.error.kind, 0) + 1
        # every answer the format refuses failed (an input cannot break it and succeed)
        assert all(not o.ok for o, t in zip(outcomes, inputs, strict=True) if breaks_picky(t))
    assert kinds.get("output_invalid", 0) > 0 and kinds.get("retries_exhausted", 0) > 0, kinds
    assert any(o.result and o.result["batch"] for o in outcome_lists[0]), "no batched request"
    assert all(o.result["batch"] is None for o in outcome_lists[1] if o.result)
    # progress: counts only grow, and the last call is the final count
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    failed = sum(1 for o in outcome_lists[0] if not o.ok)
    assert (seen[-1].done, seen[-1].failed, seen[-1].total) == (500, failed, 500)
    print(f"1,000 inputs: failures by kind {kinds}")


@pytest.mark.integration
async def test_raise_on_error_raises_map_error_with_every_outcome(shared: dict[str, str]) -> None:
    settings = settings_from_env(shared)
    inputs = texts("raise", 40)
    assert any(breaks_picky(t) for t in inputs) and not all(breaks_picky(t) for t in inputs)
    async with AsyncClient(settings) as client:
        with pytest.raises(MapError) as info:
            await client.map(
                "small", inputs, prompt=TEMPLATE, options=PICKY, raise_on_error=True, timeout_s=MAP_TIMEOUT_S
            )
        assert_answers(info.value.outcomes, inputs, info.value.run_id, picky=True)
        # all ok: no error raised
        fine = [t for t in inputs if not breaks_picky(t)]
        outcomes = await client.map("small", fine, prompt=TEMPLATE, options=PICKY, raise_on_error=True)
        assert_answers(outcomes, fine, run_of(outcomes))


@pytest.mark.integration
async def test_two_clients_at_once_each_get_exactly_their_own(shared: dict[str, str]) -> None:
    settings = settings_from_env(shared)
    a_inputs, b_inputs = texts("alpha", 150), texts("beta", 150)
    async with AsyncClient(settings) as a, AsyncClient(settings) as b:
        a_out, b_out = await asyncio.gather(
            a.map("small", a_inputs, prompt=TEMPLATE, batch=True, timeout_s=MAP_TIMEOUT_S),
            b.map("small", b_inputs, prompt=TEMPLATE, timeout_s=MAP_TIMEOUT_S),
        )
        assert run_of(a_out) != run_of(b_out)
        assert_answers(a_out, a_inputs, run_of(a_out))
        assert_answers(b_out, b_inputs, run_of(b_out))
        # the same run id again: the first run's outcomes are older than the second's start
        # offsets, so the second sees only its own
        first = await a.map("small", texts("gamma", 20), prompt=TEMPLATE, run_id="rerun")
        second = await a.map("small", texts("delta", 20), prompt=TEMPLATE, run_id="rerun")
    assert_answers(first, texts("gamma", 20), "rerun")
    assert_answers(second, texts("delta", 20), "rerun")


@pytest.mark.integration
async def test_async_and_blocking_clients_give_the_same_outcomes(shared: dict[str, str]) -> None:
    settings = settings_from_env(shared)
    inputs = texts("same", 60)
    chats = [
        [{"role": "system", "content": "One word."}, {"role": "user", "content": f"TEXT:\n{t}"}]
        for t in inputs
    ]

    def view(outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
        return [(o.index, o.ok, o.output, o.error.kind if o.error else None) for o in outcomes]

    def blocking() -> tuple[list[Outcome], list[Outcome]]:
        with Client(settings) as client:
            return (
                client.map("small", inputs, prompt=TEMPLATE, batch=True, options=PICKY),
                client.map_chat("small", chats, timeout_s=MAP_TIMEOUT_S),
            )

    sync_map, sync_chat = await asyncio.to_thread(blocking)
    async with AsyncClient(settings) as client:
        async_map = await client.map("small", inputs, prompt=TEMPLATE, batch=True, options=PICKY)
        async_chat = await client.map_chat("small", chats, timeout_s=MAP_TIMEOUT_S)
    assert view(sync_map) == view(async_map)
    assert view(sync_chat) == view(async_chat)
    assert_answers(async_map, inputs, run_of(async_map), picky=True)
    assert_answers(async_chat, inputs, run_of(async_chat))


@pytest.mark.integration
def test_cli_map_prints_outcomes_in_order_and_exits_by_outcome(
    shared: dict[str, str], tmp_path: Path
) -> None:
    inputs = texts("cli", 30)
    plain = tmp_path / "inputs.txt"
    plain.write_text("\n".join(inputs) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    ok = run_cli(
        "map",
        "--tier",
        "small",
        "--prompt",
        TEMPLATE,
        "--inputs",
        str(plain),
        "--batch",
        "--out",
        str(out),
        env=shared,
    )
    assert ok.returncode == 0, ok.stderr
    lines = lines_of(out.read_text())
    assert [line["index"] for line in lines] == list(range(30))
    assert [line["output"] for line in lines] == [answer_for(t) for t in inputs]
    assert "map: 30/30 done, 0 failed" in ok.stderr  # stderr is not a terminal: plain lines

    jsonl = tmp_path / "inputs.jsonl"
    jsonl.write_text("\n".join(orjson.dumps({"text": t}).decode() for t in inputs) + "\n", encoding="utf-8")
    some = run_cli(
        "map",
        "--tier",
        "small",
        "--prompt",
        TEMPLATE,
        "--inputs-jsonl",
        str(jsonl),
        "--options",
        orjson.dumps(PICKY).decode(),
        env=shared,
    )
    failed = sum(breaks_picky(t) for t in inputs)
    assert failed and some.returncode == 1, some.stderr
    assert f"{failed} of 30 failed: output_invalid={failed}" in some.stderr
    lines = lines_of(some.stdout)
    assert [line["ok"] for line in lines] == [not breaks_picky(t) for t in inputs]
    assert all(line["error"]["kind"] == "output_invalid" for line in lines if not line["ok"])

    bad = run_cli(
        "map", "--tier", "small", "--prompt", "${a} ${b}", "--inputs", str(plain), "--batch", env=shared
    )
    assert bad.returncode == 2 and "not batchable" in bad.stderr and not bad.stdout


@pytest.mark.integration
async def test_a_runs_tenant_is_every_jobs_that_names_none_in_the_client_and_the_cli(
    shared: dict[str, str], tmp_path: Path
) -> None:
    settings = settings_from_env(shared)
    inputs = texts("tenant", 6)
    jobs = [{"tier": "small", "prompt": TEMPLATE, "variables": {"text": t}} for t in inputs]
    jobs[0]["tenant"] = "its-own"
    async with AsyncClient(settings) as client:
        mapped = await client.map("small", inputs, prompt=TEMPLATE, tenant="reports", timeout_s=MAP_TIMEOUT_S)
        whole = await client.map_jobs(jobs, tenant="search", timeout_s=MAP_TIMEOUT_S)
        chats = await client.map_chat(
            "small", [[{"role": "user", "content": t}] for t in inputs[:2]], timeout_s=MAP_TIMEOUT_S
        )
    assert {o.result["tenant"] for o in mapped if o.result} == {"reports"} and all(o.ok for o in mapped)
    assert [o.result["tenant"] for o in whole if o.result] == ["its-own"] + ["search"] * 5
    assert {o.result["tenant"] for o in chats if o.result} == {"default"}
    plain = tmp_path / "inputs.txt"
    plain.write_text("\n".join(inputs) + "\n", encoding="utf-8")
    args = ("--tier", "small", "--prompt", TEMPLATE, "--inputs", str(plain), "--tenant", "cli-team")
    out = run_cli("map", *args, env=shared)
    assert out.returncode == 0, out.stderr
    assert {line["result"]["tenant"] for line in lines_of(out.stdout)} == {"cli-team"}
    bad = run_cli("map", "--tier", "small", "--inputs", str(plain), "--tenant", "no/slash", env=shared)
    assert bad.returncode == 2 and "tenant: must be 1-64 characters" in bad.stderr


@pytest.mark.integration
async def test_map_jobs_waits_for_the_demos_mixed_jobs(shared: dict[str, str]) -> None:
    """The demo's file as it is: template and chat jobs, batched or not, a tier that does not
    exist; the file's own ids are replaced by RUN_ID-INDEX."""
    lines = (REPO_ROOT / "examples" / "jobs.jsonl").read_text().splitlines()
    jobs = [orjson.loads(line) for line in lines if line]
    async with AsyncClient(settings_from_env(shared)) as client:
        outcomes = await client.map_jobs(jobs, run_id="demo-run", timeout_s=MAP_TIMEOUT_S)
    assert [o.id for o in outcomes] == [f"demo-run-{i}" for i in range(len(jobs))]
    for o, job in zip(outcomes, jobs, strict=True):
        if job["tier"] != "small":
            assert o.error is not None and o.error.kind == "unknown_tier", o
        elif "messages" in job:
            assert o.output == answer_for(job["messages"][-1]["content"])
        elif "response_format" in job.get("options", {}):
            assert o.output in ("positive", "negative"), o  # the job's schema allows only these
        else:
            # what the simulator reads from the rendered prompt
            assert o.output == answer_for(extract_input(render(job["prompt"], job["variables"]))), o
    batched = [o for o in outcomes if o.result and o.result["batch"]]
    assert batched and all(jobs[o.index]["batch"] for o in batched)


# ================================================================== timeouts and collect
@pytest.mark.integration
@pytest.mark.slow
async def test_timeout_then_collect_in_this_and_in_a_new_process(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(kafka_bootstrap, partitions=2)
    settings = settings_from_env(env)
    inputs = texts("later", 50)
    plain = tmp_path / "inputs.txt"
    plain.write_text("\n".join(inputs) + "\n", encoding="utf-8")
    with run_simulator(SimulatorConfig(seed=3)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=10)
        async with AsyncClient(settings) as client:
            async with InProcessService(settings, tiers):
                warm = await client.map("small", inputs[:5], prompt=TEMPLATE, timeout_s=MAP_TIMEOUT_S)
                assert_answers(warm, inputs[:5], run_of(warm))
            # the service is stopped: nothing answers
            with pytest.raises(MapTimeout) as info:
                await client.map("small", inputs, prompt=TEMPLATE, batch=True, timeout_s=5)
            timed_out = info.value
            assert isinstance(timed_out, TimeoutError) and timed_out.total == len(inputs)
            assert all(o.pending and not o.ok for o in timed_out.outcomes)
            assert [o.id for o in timed_out.outcomes] == [f"{timed_out.run_id}-{i}" for i in range(50)]
            # the same from the shell: exit 3, the outcomes so far, the command that resumes
            shell = await asyncio.to_thread(
                run_cli,
                "map",
                "--tier",
                "small",
                "--prompt",
                TEMPLATE,
                "--inputs",
                str(plain),
                "--timeout-s",
                "3",
                env=env,
            )
            assert shell.returncode == 3, shell.stderr
            assert [line["pending"] for line in lines_of(shell.stdout)] == [True] * 50
            resume = shell.stderr.strip().splitlines()[-1].split()
            assert resume[:3] == ["promptbus", "map", "--collect"] and resume[4:] == ["--total", "50"], resume

            async with InProcessService(settings, tiers):
                collected = await client.collect(timed_out.run_id, len(inputs), timeout_s=MAP_TIMEOUT_S)
                assert_answers(collected, inputs, timed_out.run_id)
                # a new process, which knows only the run id and the count
                again = await asyncio.to_thread(
                    run_cli,
                    "map",
                    "--collect",
                    resume[3],
                    "--total",
                    "50",
                    "--timeout-s",
                    str(MAP_TIMEOUT_S),
                    env=env,
                )
                assert again.returncode == 0, again.stderr
                lines = lines_of(again.stdout)
                assert [line["id"] for line in lines] == [f"{resume[3]}-{i}" for i in range(50)]
                assert [line["output"] for line in lines] == [answer_for(t) for t in inputs]
                # and a new client in this process finds the first run by the time in its id
                async with AsyncClient(settings) as fresh:
                    by_time = await fresh.collect(timed_out.run_id, len(inputs), timeout_s=MAP_TIMEOUT_S)
                assert by_time == collected


# ================================================================== SIGKILL during a map
@pytest.mark.integration
@pytest.mark.slow
async def test_service_killed_and_restarted_during_a_map(
    kafka_bootstrap: str, tmp_path: Path, short_session_s: float
) -> None:
    env = service_env(
        kafka_bootstrap, partitions=4, guarantee="at_least_once", PROMPTBUS_SESSION_TIMEOUT_S=short_session_s
    )
    settings: Settings = settings_from_env(env)
    inputs = texts("kill", 300)
    # whole jobs, every other one batched (map_jobs: each job says for itself)
    jobs = [
        {"tier": "small", "prompt": TEMPLATE, "variables": {"text": t}, "batch": i % 2 == 1}
        for i, t in enumerate(inputs)
    ]
    reached = asyncio.Event()

    def progress(p: Progress) -> None:
        if p.done >= 60:
            reached.set()

    with run_simulator(SimulatorConfig(latency_ms=20, jitter_ms=5, seed=4)) as base_url:
        service = ServiceProcess(env, slow_tier(base_url), tmp_path)
        service.start()
        try:
            async with AsyncClient(settings) as client:
                mapping = asyncio.create_task(
                    client.map_jobs(jobs, on_progress=progress, timeout_s=MAP_TIMEOUT_S)
                )
                await asyncio.wait_for(reached.wait(), timeout=60)
                assert not mapping.done(), "the map ended before the kill: tune the pacing"
                await asyncio.to_thread(service.kill)
                service.start()
                outcomes = await mapping
        finally:
            service.ensure_stopped()
    assert_answers(outcomes, inputs, run_of(outcomes))
    raw = await read_outcomes(settings)
    redelivered = sum(len(v) - 1 for v in raw.results.values())
    print(
        f"SIGKILL mid-map: {len(outcomes)} outcomes, one per index; {redelivered} duplicate records dropped"
    )


@pytest.mark.integration
async def test_map_embed_gives_each_text_its_vector(shared: dict[str, str]) -> None:
    from consumer.testing.simulator.embeddings import embedding_vector

    settings = settings_from_env(shared)
    inputs = texts("embed", 100)
    async with AsyncClient(settings) as client:
        outcomes = await client.map_embed("small", inputs, options={"dimensions": 6}, timeout_s=MAP_TIMEOUT_S)
    assert [o.index for o in outcomes] == list(range(len(inputs)))
    for o, text in zip(outcomes, inputs, strict=True):
        assert o.ok and o.output is None and o.result is not None, o
        assert o.result["embedding"] == embedding_vector(text, "sim-model", 6)
    assert any(o.result and o.result["batch"] for o in outcomes), "embed jobs shared array requests"


@pytest.mark.integration
def test_cli_map_embed_writes_vectors_in_input_order(shared: dict[str, str], tmp_path: Path) -> None:
    from consumer.testing.simulator.embeddings import embedding_vector

    inputs = tmp_path / "texts.txt"
    inputs.write_text("first text\nsecond text\nthird text\n")
    proc = run_cli("map", "--embed", "--tier", "small", "--inputs", str(inputs), env=shared)
    assert proc.returncode == 0, proc.stderr
    lines = lines_of(proc.stdout)
    assert [line["result"]["embedding"] for line in lines] == [
        embedding_vector(t, "sim-model") for t in ("first text", "second text", "third text")
    ]
    refused = run_cli("map", "--embed", "--batch", "--tier", "small", "--inputs", str(inputs), env=shared)
    assert refused.returncode != 0 and "--embed" in refused.stderr
