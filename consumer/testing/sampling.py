"""A sampling profile of this process for the benchmarks: py-spy attached while a block runs.

cProfile times every Python call and so slows small functions most: its per-job figures
overstate the service's many short calls. A sampling profiler reads the interpreter's stack
from outside at a fixed rate and leaves the process's speed alone. `SampledProfile` starts
`py-spy record --pid` on this process when its block begins (non-blocking: the process is
never paused) and stops it when the block ends; `top` then ranks the functions by their own
samples.

    with SampledProfile(Path("bench/out/spy-batched.txt")) as spy:
        await run_the_service()
    spy.top(15)  # [{"fn": "consumer/runtime/admission.py:Admission.admit", "share": 0.031}, ...]

py-spy installs from PyPI (the `dev` extra); attaching to a process needs ptrace rights over
it (root, or kernel.yama.ptrace_scope 0).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["SampledProfile", "py_spy"]

#: samples per second
SAMPLE_RATE_HZ = 1000
#: how long py-spy gets to attach before the block runs, and to write its file after
ATTACH_S = 0.5
STOP_TIMEOUT_S = 30.0
#: ` (path/to/file.py:123)` of a py-spy frame: the line is dropped, functions are ranked whole
_LINE = re.compile(r":\d+\)$")


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter's, or on PATH (None: not installed)."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


class SampledProfile:
    """py-spy samples of this process while the `with` block runs, written to `path` (its
    collapsed-stack text: one line per distinct stack, then its sample count)."""

    def __init__(self, path: Path, *, rate_hz: int = SAMPLE_RATE_HZ) -> None:
        self.path = path
        self.rate_hz = rate_hz
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SampledProfile:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy; it is in the dev extra)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        command = [exe, "record", "--pid", str(os.getpid()), "--rate", str(self.rate_hz)]
        command += ["--format", "raw", "--output", str(self.path), "--nonblocking"]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(ATTACH_S)
        if self._process.poll() is not None:
            error = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
            raise RuntimeError(f"py-spy could not attach to this process: {error.strip()[-300:]}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        process = self._process
        if process is None:
            return
        process.send_signal(signal.SIGINT)  # py-spy writes its file as it stops
        try:
            _, err = process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        if exc_type is None and not self.path.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace').strip()[-300:]}")

    def stacks(self, *, exclude: Collection[str] = ()) -> list[tuple[list[str], int]]:
        """Each sampled stack (outermost frame first, lines dropped) and its count, but those
        with a frame of a function named in `exclude` (the benchmark's own work)."""
        out: list[tuple[list[str], int]] = []
        for line in self.path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
            if exclude and any(frame.partition(" (")[0] in exclude for frame in frames):
                continue
            out.append((frames, int(count)))
        return out

    def top(self, count: int, *, exclude: Collection[str] = ()) -> list[dict[str, Any]]:
        """The `count` functions with the most own samples (the innermost frame of a sample:
        an event loop's `run` there is the loop's compiled code, its callbacks and I/O), each
        with its share of the samples kept (`stacks`)."""
        own: collections.Counter[str] = collections.Counter()
        total = 0
        for frames, n in self.stacks(exclude=exclude):
            own[frames[-1]] += n
            total += n
        return [
            {"fn": _short(frame), "share": round(n / total, 4)} for frame, n in own.most_common(count)
        ]


def _short(frame: str) -> str:
    """`function (path/to/file.py)` as `path/to/file.py:function`, the path from the package."""
    name, _, where = frame.partition(" (")
    return f"{where.rstrip(')')}:{name}" if where else name
