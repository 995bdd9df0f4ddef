"""The README's `make demo` output is what the demo prints: its lines in their order, with
what varies per run masked (timings, pids, ports, token counts, answers, vectors, which jobs
shared a pack) and the counts the demo fixes kept (jobs, results, dead letters per lane and
tenant). A README line `...` stands for any number of lines, `...` inside a line for any text;
every other README line is the next line the demo printed (blank lines aside).

The demo runs as `make demo` runs it, with the real local model (servers on free ports) and
the session's broker.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from consumer.testing.paths import REPO_ROOT
from consumer.testing.ports import free_port
from tests.local_model.installed import require_server_installed

pytestmark = pytest.mark.integration

#: counts the demo fixes whatever the model and the timings: kept, not masked
_KEPT = re.compile(
    r"(?<=results=)\d+|(?<=results: )\d+|(?<=dead_letters=)\d+|(?<=unknown_tier=)\d+"
    r"|(?<=in flight: )\d+|(?<=items in: )\d+|(?<=instances: )\d+"
    r"|\d+(?= (?:results|dead letters|missing|live|seen|jobs|texts)\b)"
)
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def mask(line: str) -> str:
    """A demo line's shape: what varies per run replaced by a placeholder."""
    line = re.sub(r"promptbus-demo-\w+", "TMP", line)
    line = re.sub(r"\bdemo-[0-9a-f]{6}:", "GROUP:", line)
    line = re.sub(r"\((?:single request|batch of \d+), attempts", "(VIA, attempts", line)
    line = _QUOTED.sub("Q", line)
    line = _KEPT.sub(lambda m: "#" + "".join(chr(ord("a") + int(c)) for c in m.group()), line)
    line = re.sub(r"-?\d+(?:\.\d+)?", "N", line)
    return " ".join(line.split())


def readme_demo_block() -> list[str]:
    """The lines of the README's demo output block."""
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "== promptbus stats" in b]
    return block.splitlines()


def mismatch(readme: list[str], printed: list[str]) -> str | None:
    """None when `printed` has `readme`'s shape; else which README line does not match."""
    lines = [line for line in readme if line.strip()]
    shapes = [mask(line) for line in printed if line.strip()]
    reach = {0}  # j in reach: the README lines so far match the first j printed lines
    for line in lines:
        pattern = mask(line)
        if pattern == "...":
            reach = set(range(min(reach), len(shapes) + 1))
            continue
        rx = re.compile(".*".join(re.escape(part) for part in pattern.split("...")))
        matched = {j + 1 for j in reach if j < len(shapes) and rx.fullmatch(shapes[j])}
        if not matched:
            near = "\n".join(shapes[min(reach) : min(reach) + 8])
            return f"README line {line!r} (shape {pattern!r}) is not what the demo printed next:\n{near}"
        reach = matched
    if len(shapes) not in reach:
        rest = "\n".join(shapes[max(reach) :][:8])
        return f"the demo printed lines after the README's last one:\n{rest}"
    return None


def test_the_mask_keeps_the_counts_and_drops_what_varies() -> None:
    assert mask("lane default: results=31 dead_letters=0 latency_mean=9.392s") != mask(
        "lane default: results=31 dead_letters=1 latency_mean=6.198s"
    )
    assert mask("lag: 0 records over 12 partitions, oldest uncommitted 11.2 s") != mask(
        "lag: 0 records over 12 partitions"
    )
    assert mask("  demo-04  'negative'     (batch of 2, attempts 1)") == mask(
        "  demo-16  'positive'                (single request, attempts 1)"
    )
    assert mismatch(["a 1", "...", "c"], ["a 2", "b", "", "c"]) is None
    assert mismatch(["a 1", "c"], ["a 2", "b", "c"]) is not None, "a line the README lacks"
    assert mismatch(["a 1", "b", "c"], ["a 2", "c"]) is not None, "a line the demo no longer prints"
    assert mismatch(["x: ..."], ["x: anything"]) is None


def test_the_readme_demo_output_is_what_the_demo_prints(kafka_bootstrap: str, tmp_path: Path) -> None:
    require_server_installed()
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "DEMO_PROVIDER": "local",
        "DEMO_MODEL_PORT": str(free_port()),
        "DEMO_EMBED_PORT": str(free_port()),
        "PROMPTBUS_LOCAL_STATE_DIR": str(tmp_path / "local-model"),
        "DEMO_WAIT_S": "240",
    }
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "demo.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    problem = mismatch(readme_demo_block(), done.stdout.splitlines())
    assert problem is None, problem + "\n\nthe demo printed:\n" + done.stdout[-6000:]
