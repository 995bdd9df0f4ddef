"""The server's state files: the pid file (`ServerInfo`), the supervisor's exit record
(`ServerExit`) and the server's log, one of each per port."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

from consumer.localmodel.config import DEFAULT_PORT, state_dir


@dataclass(frozen=True)
class ServerExit:
    """How a server process ended, as its supervisor recorded it.

    returncode: the exit code, or minus the signal number when a signal ended it.
    stopped: the end was asked for (`stop()`), so it is not a crash.
    """

    returncode: int
    stopped: bool = False

    @property
    def how(self) -> str:
        """`exit code N`, or `signal NAME` (a shell would show 128 + its number)."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"signal {name} (exit {128 - self.returncode} in a shell)"
        return f"exit code {self.returncode}"


@dataclass(frozen=True)
class ServerInfo:
    """What the pid file records about a started server.

    pid: the server process (leader of its own process group).
    host / port: where it listens. base_url: `http://HOST:PORT/v1` for a tier's `base_url`.
    model: the id the server reports (`MODEL_ALIAS`). log_path: its stdout+stderr.
    n_ctx / n_threads / n_threads_batch: how it was started. started_at: Unix time of the start.
    """

    pid: int
    host: str
    port: int
    base_url: str
    model: str
    log_path: str
    n_ctx: int
    n_threads: int
    n_threads_batch: int
    started_at: float
    #: the supervisor that waits for the server and records its end (None: started without one)
    supervisor_pid: int | None = None


def pid_path(port: int, directory: Path | None = None) -> Path:
    """The pid file of the server on `port` (one file per port, so servers can coexist)."""
    return (directory if directory is not None else state_dir()) / f"server-{port}.pid"


def exit_path(port: int, directory: Path | None = None) -> Path:
    """Where the supervisor of the server on `port` records the server's pid, then its end."""
    return (directory if directory is not None else state_dir()) / f"server-{port}.exit"


def read_exit(path: Path) -> ServerExit | None:
    """The recorded end of a server, or None while it runs (or when nothing was recorded)."""
    try:
        raw = json.loads(path.read_text())
        if "returncode" not in raw:
            return None
        return ServerExit(int(raw["returncode"]), stopped=bool(raw.get("stopped", False)))
    except (OSError, ValueError, TypeError):
        return None


def write_json(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def read_info(port: int = DEFAULT_PORT, directory: Path | None = None) -> ServerInfo | None:
    """The recorded server on `port`, or None when there is no (readable) pid file."""
    try:
        raw = json.loads(pid_path(port, directory).read_text())
        return ServerInfo(**raw)
    except (OSError, ValueError, TypeError):
        return None


def forget(port: int, directory: Path | None) -> None:
    pid_path(port, directory).unlink(missing_ok=True)
    exit_path(port, directory).unlink(missing_ok=True)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
