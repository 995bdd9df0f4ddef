"""The shell's side of a run (what `promptbus map` uses): input files, outcome lines, and a
progress bar for a terminal or a log."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from consumer.client.outcomes import Outcome, Progress


def read_inputs(path: str, *, jsonl: bool) -> list[str | dict[str, str]]:
    """Inputs from a file (`-`: stdin). Plain: one input per line, every line (the newline
    removed). JSONL: one JSON value per non-blank line, a string or an object of variables.
    ValueError naming the line."""
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not jsonl:
        return list(lines)
    inputs: list[str | dict[str, str]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(value, str | dict):
            raise ValueError(f"{path}:{n}: expected a JSON string or object, got {type(value).__name__}")
        inputs.append(value)
    return inputs


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


class ProgressBar:
    """An `on_progress` callback that draws done/total, failed, rate and ETA on a stream.

    On a terminal, one line redrawn at most every `redraw_s`; elsewhere (a log, a pipe) a
    plain line every `every_s`. The call that ends the run (done == total, or the final one
    after a timeout) always prints; `close()` ends a terminal line.
    """

    WIDTH = 24

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        every_s: float = 5.0,
        redraw_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.every_s = every_s if not self.tty else redraw_s
        self.clock = clock
        self._last: float | None = None
        self._drawn = False
        self._unshown: Progress | None = None

    @staticmethod
    def line(p: Progress) -> str:
        """The progress text: `512/1000 done, 3 failed, 420/s, ETA 1s`."""
        return f"{p.done}/{p.total} done, {p.failed} failed, {p.rate_per_s:.0f}/s, ETA {_duration(p.eta_s)}"

    def __call__(self, p: Progress) -> None:
        now = self.clock()
        final = p.done >= p.total
        if not final and self._last is not None and now - self._last < self.every_s:
            self._unshown = p
            return
        self._last = now
        self._unshown = None
        if self.tty:
            filled = self.WIDTH * p.done // max(p.total, 1)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(f"\r[{bar}] {self.line(p)}\x1b[K")
            self._drawn = True
        else:
            self.stream.write(f"map: {self.line(p)}\n")
        self.stream.flush()

    def close(self) -> None:
        """Show the latest progress if it was held back, and end the terminal line."""
        if self._unshown is not None:
            p, self._unshown, self._last = self._unshown, None, None
            self(p)
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _iter_lines(outcomes: Sequence[Outcome]) -> Iterator[bytes]:
    for o in outcomes:
        yield orjson.dumps(o.to_dict()) + b"\n"


def write_outcomes(outcomes: Sequence[Outcome], out: Any) -> None:
    """One JSON line per outcome, in input order, to a binary stream."""
    for chunk in _iter_lines(outcomes):
        out.write(chunk)
