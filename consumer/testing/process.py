"""promptbus as real processes, for tests and benchmarks that SIGKILL, restart or run several
instances: `promptbus run` (`ServiceProcess`), one CLI command (`run_cli`), the simulator
(`start_simulator`), and what /proc says about a process. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from consumer.testing.paths import PROMPTBUS, REPO_ROOT
from consumer.yaml12 import dump_yaml

__all__ = [
    "ServiceProcess",
    "logs_of",
    "open_fds",
    "rss_bytes",
    "run_cli",
    "simulator_processes",
    "split_between",
    "start_simulator",
    "stop_gracefully",
]

#: how long a started simulator process may take to answer
SIMULATOR_START_S = 20.0
_PARTITION = re.compile(r"partition=(\d+)")
_ASSIGNED = "consumer.runtime.pipeline: assigned ["


class ServiceProcess:
    """A real `promptbus run` process with its own env and tier file, run from the checkout."""

    def __init__(
        self, env: Mapping[str, str], tier_file: Mapping[str, Any], workdir: Path, name: str = "svc"
    ) -> None:
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.config_path = workdir / f"{name}-tiers.yaml"
        self.config_path.write_text(dump_yaml(dict(tier_file)))
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*PROMPTBUS, "run", "--config", str(self.config_path)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL: no drain, no commit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM: graceful drain; the exit code (SIGKILL after timeout_s: -9)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def assignments(self) -> list[set[int]]:
        """Partitions of every `assigned [...]` line of the process's log, oldest first."""
        if not self.log_path.exists():
            return []
        return [
            {int(p) for p in _PARTITION.findall(line)}
            for line in self.log_path.read_text(errors="replace").splitlines()
            if _ASSIGNED in line
        ]

    def assignment(self) -> set[int] | None:
        """Partitions of the latest `assigned [...]` line (None before any)."""
        every = self.assignments()
        return every[-1] if every else None

    def ensure_stopped(self) -> None:
        """SIGKILL it if it still runs (a test's clean-up)."""
        with contextlib.suppress(Exception):
            self.kill()


async def stop_gracefully(service: ServiceProcess, timeout_s: float) -> int:
    """SIGTERM and wait (in a thread, so the caller's loop keeps running): the exit code."""
    return await asyncio.to_thread(service.terminate, timeout_s)


def split_between(services: Sequence[ServiceProcess], partitions: set[int]) -> bool:
    """Whether the services' latest assignments share out `partitions`: each holds some, none
    holds another's, together all of them."""
    held = [s.assignment() or set() for s in services]
    together: set[int] = set().union(*held)
    return all(held) and together == partitions and sum(map(len, held)) == len(together)


def logs_of(services: Iterable[ServiceProcess], n: int = 60) -> str:
    """The last `n` log lines of each service process, for assertion messages."""
    return "\n".join(f"----- {s.log_path.name}\n{s.log_tail(n)}" for s in services)


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """One `promptbus` command as a process, with `env` over this one's (bounded)."""
    return subprocess.run(
        [*PROMPTBUS, *args],
        env={**os.environ, **(env or {})},
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        check=False,
    )


def start_simulator(port: int, faults: str) -> subprocess.Popen[bytes]:
    """A `promptbus simulate` process on 127.0.0.1:`port` with `faults`, once it answers."""
    proc = subprocess.Popen(
        [*PROMPTBUS, "simulate", "--port", str(port), "--faults", faults],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + SIMULATOR_START_S
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/_sim/stats", timeout=1)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError(f"the simulator exited with code {proc.returncode}") from None
            time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=30)
    raise TimeoutError(f"the simulator did not listen on port {port} within {SIMULATOR_START_S} s")


@contextlib.contextmanager
def simulator_processes(ports: Iterable[int], faults: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`start_simulator` on each port; the list (a test may replace an entry with the process
    it started again) is killed at the end, whatever still runs."""
    procs = [start_simulator(port, faults) for port in ports]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL when it has not exited within `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def wait_listening(
    proc: subprocess.Popen[bytes], port: int, timeout_s: float, name: str, exit_detail: Any
) -> None:
    """Until `proc` accepts connections on 127.0.0.1:`port` (killed, RuntimeError, past
    `timeout_s`); RuntimeError with `exit_detail()` (what it said) when it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start ({proc.returncode}): {exit_detail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{name} did not listen on {port} within {timeout_s:g} s")


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc; 0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """Open file descriptors of a process (Linux /proc; 0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0
