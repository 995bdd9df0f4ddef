"""Helpers for service tests beyond the in-process harness (`consumer.testing.harness`): jobs,
raw records, and the service as a real `promptbus run` subprocess (`ServiceProcess`, for
SIGKILL and two-instance tests). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]


def job(i: int, *, batch: bool, tier: str = "small", text: str | None = None, **extra: Any) -> dict[str, Any]:
    """A classification job whose input is after a data-marker line (the simulator reads it there)."""
    return {
        "id": f"job-{i}",
        "tier": tier,
        "prompt": "Classify the sentiment of the text.\nTEXT:\n${text}",
        "variables": {"text": text if text is not None else f"text number {i}"},
        "batch": batch,
        **extra,
    }


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


class ServiceProcess:
    """A real `promptbus run` process (python -m consumer.cli) with its own env and tier file."""

    def __init__(
        self, env: Mapping[str, str], tier_file: dict[str, Any], workdir: Path, name: str = "svc"
    ) -> None:
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.config_path = workdir / f"{name}-tiers.yaml"
        self.config_path.write_text(yaml.safe_dump(tier_file))
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumer.cli", "run", "--config", str(self.config_path)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def kill(self) -> None:
        """SIGKILL: no drain, no commit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM: graceful drain; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def ensure_stopped(self) -> None:
        if self.alive():
            with contextlib.suppress(Exception):
                self.kill()
