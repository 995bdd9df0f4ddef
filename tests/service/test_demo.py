"""`make demo` with the simulator: exit 0 only when every job but the bad one has a result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port

DEMO = REPO_ROOT / "examples" / "demo.py"

pytestmark = pytest.mark.integration


def _demo_env(kafka_bootstrap: str) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DEMO_PROVIDER": "simulator",
        "DEMO_SIM_PORT": str(free_port()),
        "DEMO_WAIT_S": "120",
        "PROMPTBUS_SHUTDOWN_TIMEOUT_S": "5",
    }


def test_the_demo_succeeds_with_28_results_and_the_one_bad_job(kafka_bootstrap: str) -> None:
    out = subprocess.run(
        [sys.executable, str(DEMO)], env=_demo_env(kafka_bootstrap), capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "28 results, 1 dead letters, 0 missing" in out.stdout
    assert "DEAD LETTER unknown_tier" in out.stdout
    assert out.stdout.count("64 floats, first [") == 3, "each demo text's vector, printed"
    assert "demo failed" not in out.stdout


def test_a_demo_whose_provider_dies_fails_saying_why_in_one_line(kafka_bootstrap: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(DEMO)], env=_demo_env(kafka_bootstrap), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    killed = False
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if not killed and line.startswith("simulator ready: pid "):
                os.kill(int(line.split()[-1]), signal.SIGKILL)  # the provider dies right after start
                killed = True
            assert time.monotonic() < deadline, "".join(lines[-40:])
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = "".join(lines)
    assert killed, text[-3000:]
    assert code != 0, text[-3000:]
    reasons = [ln for ln in lines if ln.startswith("demo failed: the provider simulator at")]
    assert len(reasons) == 1, text[-3000:]
    assert "exited (signal SIGKILL)" in reasons[0]
    # the outage is one reason, not one line per job
    assert text.count("ConnectionFailed") <= 1, text[-3000:]
