"""A real Prometheus server (the `prometheus` binary, on 127.0.0.1 with a temporary config
and data dir) scrapes a running `promptbus run` process serving jobs through the simulator,
with the alert rules loaded. Every expression of the Grafana dashboard and of the alert rules
goes through Prometheus's query API.

The rule for what must come back:
  - a dashboard expression must itself return series (it is what a panel draws);
  - an alert expression is a condition, empty while the service is healthy (as here): the
    query must succeed, and every metric selector in it (`promptbus_*{...}`, `up{...}`) must
    return series, so a misspelt metric or label fails; Prometheus must also report each
    rule's evaluation healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from consumer.testing.harness import job, produce, service_env, settings_from_env, tier_file_dict
from consumer.testing.paths import ALERT_RULES, REPO_ROOT
from consumer.testing.ports import free_port
from consumer.testing.process import ServiceProcess
from consumer.testing.simulator import SimulatorConfig, SimulatorServer

RULES = ALERT_RULES
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "promptbus.json"
#: a metric selector: a metric name with its optional label matchers
SELECTOR = re.compile(r"\b(promptbus_[a-z_]+|up)(\{[^}]*\})?")
FUNCTIONS = {"histogram_quantile", "rate", "sum", "max", "deriv", "vector"}


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]  # a row has no targets


def alert_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def selectors(expr: str) -> list[str]:
    return [m.group(0) for m in SELECTOR.finditer(expr) if m.group(1) not in FUNCTIONS]


def _query(client: httpx.Client, expr: str) -> list[Any]:
    response = client.get("/api/v1/query", params={"query": expr})
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    result: list[Any] = body["data"]["result"]
    return result


def _start_prometheus(workdir: Path, scrape_port: int, port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: run deploy/prometheus/install.sh (make venv does)"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "promptbus", "static_configs": [{"targets": [f"127.0.0.1:{scrape_port}"]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (workdir / "prometheus.log").open("ab")
    return subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def _keep_producing(settings: Any, stop: asyncio.Event) -> None:
    """Jobs keep arriving, so rates and latency quantiles have something to show."""
    i = 1000
    while not stop.is_set():
        await produce(settings, [job(n, batch=n % 2 == 0) for n in range(i, i + 4)])
        i += 4
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def _wait_for(client: httpx.Client, expr: str, deadline: float, what: str) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, AssertionError, ValueError):  # not up yet
            if _query(client, expr):
                return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} ({expr})")


def _check_expressions(client: httpx.Client) -> None:
    """The rule of the module docstring, for every dashboard and alert expression."""
    missing = [e for e in dashboard_expressions() if not _query(client, e)]
    assert not missing, f"dashboard expressions without series: {missing}"
    for expr in alert_expressions():
        _query(client, expr)  # evaluates without error
        empty = [s for s in selectors(expr) if not _query(client, s)]
        assert not empty, f"alert {expr!r}: selectors without series: {empty}"
    rules = client.get("/api/v1/rules").json()["data"]["groups"]
    unhealthy = [r for g in rules for r in g["rules"] if r.get("health") not in ("ok", "unknown")]
    assert not unhealthy, unhealthy
    assert len([r for g in rules for r in g["rules"]]) == len(alert_expressions())


async def test_prometheus_scrapes_promptbus_and_every_dashboard_and_alert_expression_works(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    metrics_port, prometheus_port = free_port(), free_port()
    env = service_env(
        kafka_bootstrap,
        partitions=2,
        PROMPTBUS_METRICS_PORT=metrics_port,
        PROMPTBUS_METRICS_HOST="127.0.0.1",
    )
    settings = settings_from_env(env)
    deadline = time.monotonic() + 50  # the whole test, bounded
    async with SimulatorServer(SimulatorConfig(latency_ms=20)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", pricing={"input_per_mtok": 1.0, "output_per_mtok": 2.0})
        # a budgeted tenant: the budget gauges the tenant alert and the dashboard read have series
        tiers["tenants"] = {"default": {"budget": {"usd_per_day": 1000.0, "tokens_per_day": 10**9}}}
        service = ServiceProcess(env, tiers, tmp_path)
        prometheus: subprocess.Popen[bytes] | None = None
        stop = asyncio.Event()
        producer: asyncio.Task[None] | None = None
        try:
            service.start()
            # a record that is not a job: a dead letter (invalid_job) for the dead-letter series
            await produce(settings, [b"not json", *[job(n, batch=False) for n in range(4)]])
            producer = asyncio.create_task(_keep_producing(settings, stop))
            prometheus = _start_prometheus(tmp_path, metrics_port, prometheus_port)
            with httpx.Client(base_url=f"http://127.0.0.1:{prometheus_port}", timeout=5) as client:
                await asyncio.to_thread(_wait_for, client, 'up{job="promptbus"} == 1', deadline, "a scrape")
                # the lag gauges come with the first refresh after the group join; a few more
                # scrapes give rates two points
                await asyncio.to_thread(
                    _wait_for, client, "promptbus_consumer_lag_records", deadline, "the lag gauges"
                )
                await asyncio.to_thread(
                    _wait_for,
                    client,
                    "count_over_time(promptbus_job_latency_seconds_count[1m]) >= 4",
                    deadline,
                    "four scrapes with job latencies",
                )
                await asyncio.to_thread(_check_expressions, client)
        finally:
            stop.set()
            if producer is not None:
                await asyncio.gather(producer, return_exceptions=True)
            if prometheus is not None:
                prometheus.terminate()
                try:
                    prometheus.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    prometheus.kill()
                    prometheus.wait(timeout=10)
            if service.alive():
                service.terminate(timeout_s=30)
            service.ensure_stopped()


def test_selectors_are_found_in_alert_expressions() -> None:
    """The selector rule above finds what it must (and no function names)."""
    found = selectors('sum(rate(promptbus_results_total[5m])) and on () up{job="promptbus"} == 0')
    assert found == ["promptbus_results_total", 'up{job="promptbus"}']
