"""Every benchmark under bench/ still starts: its imports resolve and its options parse
(`--help`), so a change elsewhere cannot leave a bench that fails only when someone runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from consumer.testing.paths import REPO_ROOT

#: the benchmarks with options (a helper module such as second_model.py takes none: run, it
#: does its work)
SCRIPTS = sorted(p for p in (REPO_ROOT / "bench").glob("*.py") if "argparse" in p.read_text(encoding="utf-8"))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10, [p.name for p in SCRIPTS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_benchmark_starts(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script.name} --help exited {done.returncode}:\n{done.stderr[-2000:]}"
    assert "usage:" in done.stdout, done.stdout[:500]
