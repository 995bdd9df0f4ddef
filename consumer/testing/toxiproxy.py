"""A real network fault proxy for tests and benchmarks: Toxiproxy's server on a free loopback
port, driven through its REST API (a handful of calls, stdlib HTTP: no client library).

    with run_toxiproxy(tmp_path) as toxi:
        link = toxi.proxy("provider", upstream_port=sim_port)      # listens on a free port
        link.add_toxic("latency", "latency", latency=500)          # every answer 500 ms late
        link.remove_toxic("latency")
        with link.cut():                                           # connections refused
            ...

The server binary is Toxiproxy v2.5.0's, built once per machine from its Go module by
`deploy/toxiproxy/install.sh` (`make venv` runs it; `toxiproxy_binary` runs it too when the
binary is missing, so a fresh machine needs only the Go toolchain). Missing Go is an error,
never a skip: the network fault tests must run.

Toxics (https://github.com/Shopify/toxiproxy#toxics) act on one direction of a proxy's
connections: `downstream` is what the upstream server sends back (a provider's answer, a
broker's response), `upstream` what the client sends. The ones the fault tests use:
`latency` (latency ms, jitter ms), `timeout` (timeout ms; 0: the data is swallowed and the
connection stays open, a half-open link), `reset_peer` (timeout ms: a TCP RST), `bandwidth`
(rate KB/s). Disabling a proxy closes its connections and refuses new ones (a partition).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port
from consumer.testing.process import stop_process, wait_listening

__all__ = ["INSTALL_SCRIPT", "Link", "Toxiproxy", "run_toxiproxy", "toxiproxy_binary"]

#: builds the server once per machine and prints its path
INSTALL_SCRIPT = REPO_ROOT / "deploy" / "toxiproxy" / "install.sh"
#: the first build compiles Toxiproxy and its dependencies (about a minute on 2 cores)
INSTALL_TIMEOUT_S = 900.0
#: how long the server may take to answer its API after start
START_S = 15.0
#: every API call is local and quick; a bound keeps a wedged server from hanging a test
API_TIMEOUT_S = 10.0


def toxiproxy_binary() -> str:
    """The server binary: `TOXIPROXY_SERVER`, else `toxiproxy-server` on PATH, else the one
    `deploy/toxiproxy/install.sh` builds (running it when missing)."""
    given = os.environ.get("TOXIPROXY_SERVER")
    if given:
        return given
    found = shutil.which("toxiproxy-server")
    if found:
        return found
    proc = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{INSTALL_SCRIPT} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Toxiproxy:
    """A running Toxiproxy server: its API on `api_port`."""

    api_port: int
    log_file: Path

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST call; the decoded JSON answer (None for an empty one). An HTTP error
        raises RuntimeError with the server's message."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode(errors="replace")
            raise RuntimeError(f"toxiproxy {method} {path}: {exc.code} {reason}") from exc
        return json.loads(text) if text.strip() else None

    def proxy(self, name: str, *, upstream_port: int, listen_port: int | None = None) -> Link:
        """A new proxy `name` from 127.0.0.1:`listen_port` (a free one when None) to
        127.0.0.1:`upstream_port`, enabled."""
        port = listen_port if listen_port is not None else free_port()
        listen, upstream = f"127.0.0.1:{port}", f"127.0.0.1:{upstream_port}"
        self.call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        return Link(self, name, port, upstream_port)

    def links(self) -> list[str]:
        """The names of the proxies the server has."""
        return sorted(self.call("GET", "/proxies"))

    def reset(self) -> None:
        """Every proxy enabled again and every toxic removed."""
        self.call("POST", "/reset")


@dataclass(frozen=True)
class Link:
    """One proxy of a `Toxiproxy`: clients connect to `listen_port`, it forwards to
    `upstream_port`, through whatever toxics it has."""

    server: Toxiproxy
    name: str
    listen_port: int
    upstream_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def add_toxic(
        self, name: str, kind: str, *, stream: str = "downstream", toxicity: float = 1.0, **attributes: float
    ) -> None:
        """Add toxic `name` of type `kind` (latency, timeout, reset_peer, bandwidth, ...) on
        `stream`, hitting a `toxicity` share of the connections."""
        self.server.call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {"name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes},
        )

    def remove_toxic(self, name: str) -> None:
        self.server.call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[str]:
        return sorted(t["name"] for t in self.server.call("GET", f"/proxies/{self.name}/toxics"))

    def set_enabled(self, enabled: bool) -> None:
        """Disabled: its connections are closed and new ones refused (the port is closed)."""
        self.server.call("POST", f"/proxies/{self.name}", {"enabled": enabled})

    @contextlib.contextmanager
    def toxic(self, name: str, kind: str, **kwargs: Any) -> Iterator[None]:
        """`with link.toxic(...)`: the toxic for the block's duration."""
        self.add_toxic(name, kind, **kwargs)
        try:
            yield
        finally:
            self.remove_toxic(name)

    @contextlib.contextmanager
    def cut(self) -> Iterator[None]:
        """`with link.cut()`: the link down for the block's duration."""
        self.set_enabled(False)
        try:
            yield
        finally:
            self.set_enabled(True)


@contextlib.contextmanager
def run_toxiproxy(directory: Path) -> Iterator[Toxiproxy]:
    """`with run_toxiproxy(tmp_path) as toxi:` a Toxiproxy server with its API on a free
    loopback port, killed at exit (its proxies go with it)."""
    binary = toxiproxy_binary()
    port = free_port()
    log_file = directory / f"toxiproxy-{port}.log"
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_listening(proc, port, START_S, "toxiproxy", lambda: log_file.read_text()[-2000:])
        yield Toxiproxy(port, log_file)
    finally:
        stop_process(proc)
