"""A real `promptbus run` process, for tests and benchmarks that SIGKILL, restart or run
several instances."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from consumer.yaml12 import dump_yaml

__all__ = ["ServiceProcess"]


class ServiceProcess:
    """A real `promptbus run` process (python -m consumer.cli) with its own env and tier file."""

    #: the directory the process runs in (None: the caller's)
    cwd: Path | None = None

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
                [sys.executable, "-m", "consumer.cli", "run", "--config", str(self.config_path)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
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

    def ensure_stopped(self) -> None:
        """SIGKILL it if it still runs (a test's clean-up)."""
        with contextlib.suppress(Exception):
            self.kill()
