"""`/metrics`, `/healthz` and `/readyz` on a real loopback port, served by `MetricsServer`."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from consumer.core.errors import ConfigError
from consumer.runtime.metrics import MetricsServer, build_app
from consumer.runtime.stats import ServiceStats
from consumer.testing.ports import free_port


async def test_the_endpoints_answer_as_scrapers_and_probes_expect() -> None:
    stats = ServiceStats(instance="a")
    stats.tier("small").provider_requests = 3
    ready = False
    port = free_port()
    server = MetricsServer(build_app(stats, lambda: ready), port, host="127.0.0.1")
    await server.start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.get("/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST
                families = {f.name: f for f in text_string_to_metric_families(await r.text())}
            samples = families["promptbus_tier_provider_requests"].samples
            assert [(s.labels, s.value) for s in samples] == [({"tier": "small"}, 3.0)]
            async with http.get("/healthz") as r:
                assert (r.status, r.headers["Content-Type"], await r.read()) == (
                    200, "application/json", b'{"status":"ok"}'
                )
            async with http.get("/readyz") as r:
                assert (r.status, await r.read()) == (503, b'{"ready":false}')
            ready = True
            async with http.get("/readyz") as r:
                assert (r.status, r.headers["Content-Type"], await r.read()) == (
                    200, "application/json", b'{"ready":true}'
                )
            async with http.head("/readyz") as r:
                assert r.status == 200
            async with http.post("/healthz") as r:
                assert r.status == 405
            async with http.get("/metrics/", allow_redirects=False) as r:
                assert (r.status, r.headers["Location"]) == (307, "/metrics")
    finally:
        await server.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/healthz"):
            pass


async def test_a_port_in_use_is_a_config_error_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(build_app(ServiceStats(instance="a"), lambda: True), port, host="127.0.0.1")
        with pytest.raises(ConfigError) as err:
            await server.start()
        await server.stop()  # nothing was started: a no-op
    assert f"PROMPTBUS_METRICS_PORT: cannot listen on 127.0.0.1:{port}" in str(err.value)
