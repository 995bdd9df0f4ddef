"""A real HTTP proxy for tests: a `tinyproxy` process (Debian's package, installed by
`deploy/tinyproxy/install.sh` from `make venv`) on a free loopback port, with or without
basic auth. Missing tinyproxy is an error, never a skip: the proxy tests must run."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from consumer.testing.ports import free_port
from consumer.testing.process import stop_process, wait_listening

__all__ = ["TinyProxy", "run_tinyproxy"]

#: how long tinyproxy may take to listen
START_S = 10.0


@dataclass(frozen=True)
class TinyProxy:
    """A running proxy: its URL without credentials, and the log it writes (one line per
    request it served or refused)."""

    host: str
    port: int
    log_file: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@{self.host}:{self.port}"

    def requests_to(self, port: int) -> list[str]:
        """The request lines the proxy was sent for a target on `port` (`CONNECT
        127.0.0.1:PORT HTTP/1.1`, `POST http://127.0.0.1:PORT/v1/... HTTP/1.1`), from its log."""
        marks = (f"127.0.0.1:{port} ", f"127.0.0.1:{port}/")
        return [
            line.split("): ", 1)[1]
            for line in self.log_text().splitlines()
            if "Request (file descriptor" in line and "): " in line and any(m in line for m in marks)
        ]

    def tunnels_to(self, port: int) -> int:
        """CONNECT tunnels asked for to `port` so far."""
        return sum(1 for line in self.requests_to(port) if line.startswith("CONNECT "))

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")


@contextlib.contextmanager
def run_tinyproxy(directory: Path, *, basic_auth: tuple[str, str] | None = None) -> Iterator[TinyProxy]:
    """`with run_tinyproxy(tmp_path) as proxy:` a tinyproxy on 127.0.0.1, stopped at exit."""
    binary = shutil.which("tinyproxy") or shutil.which("tinyproxy", path="/usr/bin:/usr/sbin")
    if binary is None:
        raise RuntimeError("tinyproxy is not installed: run `make venv` (deploy/tinyproxy/install.sh)")
    port = free_port()
    log_file = directory / f"tinyproxy-{port}.log"
    lines = [
        f"Port {port}",
        "Listen 127.0.0.1",
        "Timeout 60",
        "MaxClients 200",
        "Allow 127.0.0.1",
        f'LogFile "{log_file}"',
        "LogLevel Connect",
        "DisableViaHeader Yes",
    ]
    # no ConnectPort line: CONNECT to any port (the simulator's is not 443)
    if basic_auth is not None:
        lines.append(f"BasicAuth {basic_auth[0]} {basic_auth[1]}")
    conf = directory / f"tinyproxy-{port}.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(
        [binary, "-d", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    def said() -> str:
        return (proc.stderr.read().decode(errors="replace") if proc.stderr else "").strip()

    try:
        wait_listening(proc, port, START_S, "tinyproxy", said)
        yield TinyProxy("127.0.0.1", port, log_file)
    finally:
        stop_process(proc)
