"""The plain install is the service alone: the simulator's web stack is the `simulator` extra.

`pyproject.toml` is read as pip reads it; the service's modules are imported in a fresh
interpreter in which starlette and uvicorn cannot be imported, as in a plain install.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from typing import Any

from consumer.testing.paths import REPO_ROOT
from consumer.testing.simulator_entry import MISSING_EXTRA

SIMULATOR_STACK = {"starlette", "uvicorn"}

#: makes the simulator's web stack unimportable, as it is without the extra
BLOCK_SIMULATOR_STACK = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in SIMULATOR_STACK)


def _name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalized (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _project() -> dict[str, Any]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def test_the_plain_install_leaves_the_simulator_stack_out() -> None:
    project = _project()
    dependencies = {_name(r) for r in project["dependencies"]}
    assert "aiohttp" in dependencies
    assert not dependencies & SIMULATOR_STACK


def test_the_simulator_extra_brings_the_stack_and_dev_brings_the_simulator() -> None:
    extras: dict[str, list[str]] = _project()["optional-dependencies"]
    assert {_name(r) for r in extras["simulator"]} == SIMULATOR_STACK
    assert "promptbus[simulator]" in extras["dev"]


def test_the_service_starts_its_endpoints_without_the_simulator_stack() -> None:
    probe = BLOCK_SIMULATOR_STACK + (
        "import asyncio\n"
        "import consumer.app, consumer.cli\n"
        "consumer.cli.build_parser()\n"
        "from consumer.runtime.metrics import MetricsServer, build_app\n"
        "from consumer.runtime.stats import ServiceStats\n"
        "async def main():\n"
        "    app = build_app(ServiceStats(instance='a'), lambda: True)\n"
        "    server = MetricsServer(app, 0, host='127.0.0.1')\n"
        "    await server.start()\n"
        "    await server.stop()\n"
        "asyncio.run(main())\n"
        "print('ok')\n"
    )
    out = _python(probe)
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr[-2000:]


def _python(probe: str) -> subprocess.CompletedProcess[str]:
    """`probe` run by a fresh interpreter from the repository's root."""
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


def _simulate(block: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _python(block + f"import consumer.cli\nsys.exit(consumer.cli.main({['simulate', *args]!r}))\n")


def test_simulate_without_the_extra_names_it_in_one_line() -> None:
    for args in ((), ("--port", "0"), ("--help",)):
        out = _simulate(BLOCK_SIMULATOR_STACK, *args)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.splitlines() == [MISSING_EXTRA], (args, out.stderr)
        assert out.stdout == ""
    assert "pip install 'promptbus[simulator]'" in MISSING_EXTRA


def test_simulate_raises_an_import_error_that_is_not_the_extra() -> None:
    block = "import sys\nsys.modules['consumer.testing.simulator.cache'] = None\n"
    out = _simulate(block, "--port", "0")
    assert out.returncode == 1
    assert "ModuleNotFoundError" in out.stderr and "consumer.testing.simulator.cache" in out.stderr
    assert MISSING_EXTRA not in out.stderr


def test_the_plain_install_exports_otlp_without_the_simulator_stack() -> None:
    """`OTEL_TRACES_EXPORTER=otlp` works on the service's own install: the OTLP/HTTP exporter is
    one of its dependencies, and it needs no web server stack."""
    assert "opentelemetry-exporter-otlp-proto-http" in {_name(r) for r in _project()["dependencies"]}
    probe = BLOCK_SIMULATOR_STACK + (
        "import os\n"
        "os.environ.update(OTEL_TRACES_EXPORTER='otlp', OTEL_METRICS_EXPORTER='otlp')\n"
        "from consumer.telemetry.sdk import exporters_from_env\n"
        "print(*(type(e).__name__ for e in exporters_from_env('traces') + exporters_from_env('metrics')))\n"
    )
    out = _python(probe)
    made = (out.returncode, out.stdout.strip())
    assert made == (0, "OTLPSpanExporter OTLPMetricExporter"), out.stderr[-2000:]
