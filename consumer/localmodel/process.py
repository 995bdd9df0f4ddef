"""The server's processes: the supervisor that records how the server ended, telling our
server from a reused pid, and ending the process group."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from consumer.localmodel.config import EMBED_SERVER_MODULE, SERVER_MODULE
from consumer.localmodel.records import write_json

log = logging.getLogger(__name__)


def supervise(record: str, argv: Sequence[str]) -> int:
    """Run `argv` as a child, record its pid and then how it ended in the JSON file `record`.

    This runs as the session leader of the server's process group, so `stop()`'s signal to
    the group reaches both; a SIGTERM or SIGINT here marks the end as asked for (not a crash)
    and waits for the child, which received the same signal. Exits with the child's status.
    """
    stopping = False

    def _asked_to_stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _asked_to_stop)
    signal.signal(signal.SIGINT, _asked_to_stop)
    child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
    write_json(Path(record), {"pid": child.pid})
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
            continue
    write_json(Path(record), {"pid": child.pid, "returncode": code, "stopped": stopping})
    return 128 - code if code < 0 else code


def is_our_server(pid: int) -> bool:
    """Guard against pid reuse: the process must be alive and be a llama_cpp.server (or the
    embedding server that runs it, `embedserver.py`)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        # no /proc (macOS): fall back to "is alive"
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return SERVER_MODULE.encode() in cmdline or EMBED_SERVER_MODULE.encode() in cmdline


def terminate(pid: int, timeout_s: float, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the server's process group, wait up to `timeout_s`, then SIGKILL it."""
    try:
        # the server and its supervisor run in a session of their own: one group for both
        group = os.getpgid(pid)
    except ProcessLookupError:
        group = pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if popen is not None:
                if popen.poll() is not None:
                    return
            elif not is_our_server(pid):
                return
            time.sleep(0.05)
        log.warning("local model server pid %d ignored %s", pid, sig.name)
