"""The service's provider connections end to end, on the in-memory edges and the real broker:
through a real tinyproxy (basic auth) to the simulator serving HTTPS with a private CA and a
required client certificate, keys rotated mid-run by file and by command with 0 failed jobs,
and a proxy that refuses holding the work as an outage (never a dead letter)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from consumer.testing.certs import CertPair, PrivateCA
from consumer.testing.harness import job, tier_file_dict, until
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, SimulatorTls, answer_for
from consumer.testing.tinyproxy import TinyProxy, run_tinyproxy

USER, PASSWORD = "pbuser", "pb-proxy-secret-51c0"
OLD, NEW = "sk-old-service-5d1f", "sk-new-service-a0c2"
JOBS = 300
#: requests the simulator answered before the key is rotated: well inside the run
ROTATE_AFTER = 60
LIMITER = {"algorithm": "fixed", "initial": 4, "min": 1, "max": 4}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[PrivateCA, CertPair, CertPair]:
    ca = PrivateCA(tmp_path_factory.mktemp("svc-pki"), "corp")
    return ca, ca.issue("sim", hosts=("127.0.0.1", "localhost")), ca.issue("svc-client", client=True)


@pytest.fixture(scope="module")
def auth_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyProxy]:
    with run_tinyproxy(tmp_path_factory.mktemp("svc-proxy"), basic_auth=(USER, PASSWORD)) as running:
        yield running


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def jobs() -> list[dict[str, Any]]:
    return [job(i, batch=(i % 3 == 0)) for i in range(JOBS)]


def mount_secret(directory: Path, value: str) -> Path:
    """A Kubernetes secret volume's layout; an update swaps `..data` atomically."""
    stamp = directory / f"..{time.monotonic_ns()}"
    stamp.mkdir()
    (stamp / "key").write_text(value + "\n")
    (directory / "..data_tmp").symlink_to(stamp.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    link = directory / "key"
    if not link.is_symlink():
        link.symlink_to("..data/key")
    return link


async def run_all(
    bus: Any, tiers: dict[str, Any], sim: SimulatorServer, rotate: Callable[[], None] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Every job through the service; `rotate` runs once ROTATE_AFTER requests were answered,
    and the simulator then accepts only NEW."""
    sent = jobs()
    async with bus.service(tiers) as service:
        await bus.produce(sent)
        if rotate is not None:
            assert await until(lambda: sim.sim.stats_.counters["requests"] >= ROTATE_AFTER, 60)
            rotate()
            sim.configure(api_key=NEW)
        outcomes = await bus.wait_for_outcomes({j["id"] for j in sent}, timeout_s=120)
        stats = service.stats_snapshot()["tiers"]["small"]
    assert dict(outcomes.dead) == {}, "0 failed jobs"
    assert set(outcomes.results) == {j["id"] for j in sent}
    for j in sent:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"]), j["id"]
    return outcomes, stats


async def test_a_run_through_the_real_proxy_to_the_tls_simulator_answers_every_job(
    make_bus: Callable[..., Any],
    pki: tuple[PrivateCA, CertPair, CertPair],
    auth_proxy: TinyProxy,
    tmp_path: Path,
) -> None:
    ca, server, client = pki
    key_file = mount_secret(tmp_path, OLD)
    sim = SimulatorServer(
        SimulatorConfig(api_key=OLD, latency_ms=2),
        tls=SimulatorTls(str(server.cert_file), str(server.key_file), client_ca_file=str(ca.ca_file)),
    )
    async with sim as base_url:
        tiers = tier_file_dict(
            base_url + "/v1",
            max_items=5,
            limiter=LIMITER,
            api_key_file=str(key_file),
            proxy=auth_proxy.url_with(USER, PASSWORD),
            tls={
                "ca_file": str(ca.ca_file),
                "client_cert_file": str(client.cert_file),
                "client_key_file": str(client.key_file),
            },
        )
        await run_all(make_bus(partitions=2), tiers, sim)
        port = int(base_url.rsplit(":", 1)[1])
    assert auth_proxy.tunnels_to(port) >= 1, "the run went through the proxy"


async def test_a_key_file_rotated_mid_run_fails_no_job(make_bus: Callable[..., Any], tmp_path: Path) -> None:
    key_file = mount_secret(tmp_path, OLD)
    sim = SimulatorServer(SimulatorConfig(api_key=OLD, latency_ms=2))
    async with sim as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=5, limiter=LIMITER, api_key_file=str(key_file))
        await run_all(make_bus(partitions=2), tiers, sim, lambda: mount_secret(tmp_path, NEW) and None)
        answered_after = sim.sim.stats_.counters["requests"]
    assert answered_after > ROTATE_AFTER


async def test_a_token_command_rotated_mid_run_fails_no_job(
    make_bus: Callable[..., Any], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(OLD)
    runs = tmp_path / "runs"
    script = (
        "import pathlib, sys; d = pathlib.Path(sys.argv[1]); r = d / 'runs';"
        " r.write_text(str(int(r.read_text()) + 1) if r.exists() else '1');"
        " print((d / 'token').read_text().strip())"
    )
    sim = SimulatorServer(SimulatorConfig(api_key=OLD, latency_ms=2))
    async with sim as base_url:
        tiers = tier_file_dict(
            base_url + "/v1",
            max_items=5,
            limiter=LIMITER,
            api_key_command=[sys.executable, "-c", script, str(tmp_path)],
        )
        await run_all(make_bus(partitions=2), tiers, sim, lambda: token.write_text(NEW) and None)
        refused = sim.sim.stats_.counters["status_401"]
    assert refused >= 1, "requests met the switch with the old token"
    assert int(runs.read_text()) <= 3  # the service's start, then once per 401 wave (a check may add one)


async def test_a_proxy_that_refuses_holds_the_work_and_dead_letters_nothing(
    make_bus: Callable[..., Any],
    pki: tuple[PrivateCA, CertPair, CertPair],
    auth_proxy: TinyProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ca, server, _client = pki
    bus = make_bus(partitions=1)
    sim = SimulatorServer(tls=SimulatorTls(str(server.cert_file), str(server.key_file)))
    async with sim as base_url:
        tiers = tier_file_dict(
            base_url + "/v1",
            batching=False,
            limiter=LIMITER,
            proxy=auth_proxy.url,  # no credentials: 407
            tls={"ca_file": str(ca.ca_file)},
            retry={
                "max_attempts": 2,
                "backoff_initial_s": 0.05,
                "backoff_max_s": 0.1,
                "circuit_failures": 2,
                "circuit_probe_s": 0.1,
                "circuit_probe_max_s": 0.2,
            },
        )
        sent = [job(i, batch=False) for i in range(5)]
        async with bus.service(tiers) as service:
            await bus.produce(sent)

            def tier() -> dict[str, Any]:
                return dict(service.stats_snapshot()["tiers"]["small"])

            assert await until(lambda: tier()["circuit_open"] == 1, 30), tier()
            probes = tier()["circuit_probes"]
            assert await until(lambda: tier()["circuit_probes"] >= probes + 3, 30), tier()
            await asyncio.sleep(0)
            outcomes = await bus.outcomes()
        assert sim.sim.stats_.counters["requests"] == 0, "nothing got past the proxy"
    assert outcomes.ids() == set(), "held: no result, no dead letter"
    refusals = [r.getMessage() for r in caplog.records if "407" in r.getMessage()]
    assert refusals, "the refusal is said"
    assert all(PASSWORD not in m for m in caplog.messages)
    assert all("tier small" in m for m in refusals), refusals
    assert orjson.dumps(tier())  # stats stay plain values
