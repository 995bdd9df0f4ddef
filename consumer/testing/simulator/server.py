"""Serving the simulator: in the running loop (`SimulatorServer`), in a thread (`run_simulator`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import uvicorn

from consumer.testing.simulator.app import SimulatorApp
from consumer.testing.simulator.config import SimulatorConfig


@dataclass(frozen=True)
class SimulatorTls:
    """Serving HTTPS: the server's PEM certificate and key; `client_ca_file`: require a
    client certificate signed by that CA (mTLS), None: ask for none."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def uvicorn_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file}
        if self.client_ca_file:
            options |= {"ssl_ca_certs": self.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


def uvicorn_config(
    sim: SimulatorApp, host: str, port: int, tls: SimulatorTls | None = None
) -> uvicorn.Config:
    """How the simulator is served, embedded or from the CLI: quiet, no lifespan, a short
    graceful shutdown, and no per-request work no client reads (proxy headers, a Date and a
    Server header): on a 2-core machine what the simulator spends, the service under test
    cannot. `tls`: serve HTTPS."""
    return uvicorn.Config(
        sim.app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        **(tls.uvicorn_options() if tls is not None else {}),
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its SIGINT/SIGTERM capture: embedded in a test or a benchmark, the host
    process keeps its own signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Leave signal handling to the host process."""
        yield


class SimulatorServer:
    """The simulator on 127.0.0.1 inside the running event loop.

    `base_url = await server.start()` (port 0 picks a free port), `await server.stop()`.
    The OpenAI base URL is `base_url + "/v1"`; the Anthropic one is `base_url`. `tls`: serve
    HTTPS (the base URL is https://HOST:PORT).
    """

    def __init__(
        self,
        config: SimulatorConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: SimulatorTls | None = None,
    ) -> None:
        self.config = config or SimulatorConfig()
        self.host = host
        self.port = port
        self.tls = tls
        self.sim = SimulatorApp(self.config)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.base_url: str | None = None

    async def start(self) -> str:
        """Serve in the background; returns the base URL once listening."""
        server = _EmbeddedServer(uvicorn_config(self.sim, self.host, self.port, self.tls))
        self._server = server
        self.sim.server = server
        self.sim._stop = asyncio.Event()  # bound to this loop
        self._task = asyncio.create_task(server.serve())
        for _ in range(500):  # bounded: at most ~5 s
            if server.started:
                break
            if self._task.done():
                self._task.result()
                raise RuntimeError("simulator exited before it started")
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("simulator did not start in time")
        port = server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"{'https' if self.tls else 'http'}://{self.host}:{port}"
        return self.base_url

    async def stop(self) -> None:
        """Stop serving: wake hanging requests, close connections, wait a bounded time."""
        if self._server is None or self._task is None:
            return
        self.sim._stop.set()
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
        except TimeoutError:
            self._server.force_exit = True
            await asyncio.wait_for(self._task, timeout=5)
        self._server = None
        self._task = None

    def configure(self, **changes: Any) -> SimulatorConfig:
        """Change knobs while serving (field names of SimulatorConfig); returns the new config."""
        self.config = replace(self.sim.config, **changes)
        self.sim.configure(self.config)
        return self.config

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


@contextlib.contextmanager
def run_simulator(
    config: SimulatorConfig | None = None, *, port: int = 0, tls: SimulatorTls | None = None
) -> Iterator[str]:
    """`with run_simulator(cfg) as base_url:` — the simulator in a background thread (its own loop)."""
    ready = threading.Event()
    stop = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        server = SimulatorServer(config, port=port, tls=tls)
        try:
            box["url"] = await server.start()
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            return
        ready.set()
        # the caller's thread signals a threading.Event; poll it without blocking this loop
        await asyncio.to_thread(stop.wait)
        await server.stop()

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="promptbus-simulator", daemon=True)
    thread.start()
    if not ready.wait(timeout=30):
        raise RuntimeError("simulator did not start in time")
    if "error" in box:
        raise RuntimeError(f"simulator failed to start: {box['error']}")
    try:
        yield box["url"]
    finally:
        stop.set()
        thread.join(timeout=15)
