"""The benchmarks' sampling profile (`consumer.testing.sampling`): py-spy attached to this
process finds the function that took the time, and leaves out what it is told to."""

from __future__ import annotations

import time
from pathlib import Path

from consumer.testing.sampling import SampledProfile


def spin_for(seconds: float) -> int:
    total, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        total += sum(range(200))
    return total


def bookkeeping(seconds: float) -> int:
    return spin_for(seconds)


def test_the_busiest_function_leads_the_profile(tmp_path: Path) -> None:
    spy = SampledProfile(tmp_path / "samples.txt")
    with spy:
        spin_for(0.6)
        bookkeeping(0.2)
    top = spy.top(5)
    assert top[0]["fn"].endswith("test_sampling.py:spin_for"), top
    assert top[0]["share"] > 0.5, top
    stacks = spy.stacks()
    assert sum(n for _, n in stacks) > 100, "sampled at hundreds per second"
    kept = spy.stacks(exclude=("bookkeeping",))
    assert sum(n for _, n in kept) < sum(n for _, n in stacks)
    assert not any(f.startswith("bookkeeping (") for frames, _ in kept for f in frames)
