"""Helpers for service tests beyond the in-process harness (`consumer.testing.harness`): the
simulator as a process, and the service as a real `promptbus run` subprocess run from the
repository's root (`ServiceProcess`, for SIGKILL and two-instance tests). Every wait is bounded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from consumer.testing import process
from consumer.testing.harness import job

__all__ = ["ROOT", "ServiceProcess", "job", "start_simulator"]

ROOT = Path(__file__).resolve().parents[2]


def start_simulator(port: int, faults: str) -> subprocess.Popen[bytes]:
    """A `promptbus simulate` process on 127.0.0.1:`port` with `faults`, once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumer.cli", "simulate", "--port", str(port), "--faults", faults],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):  # bounded: until it listens
        try:
            httpx.get(f"http://127.0.0.1:{port}/_sim/stats", timeout=1)
            return proc
        except httpx.TransportError:
            assert proc.poll() is None, "the simulator exited"
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("the simulator did not listen")


class ServiceProcess(process.ServiceProcess):
    """A real `promptbus run` process, run from the repository's root."""

    cwd = ROOT
