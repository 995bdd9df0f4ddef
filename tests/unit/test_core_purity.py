"""consumer/core is pure: no event loop, Kafka, HTTP, web servers, telemetry, sockets or
processes, and nothing of the service outside the core (the core is what the rest builds on).

A static scan of every module's imports (`tests/import_scan.py`: `import`, `from ... import`,
`__import__` and `importlib.import_module` with a literal name), so a forbidden import fails
here even when it sits in a function or under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from consumer.testing.paths import REPO_ROOT
from tests.import_scan import imported_names as _imported_names
from tests.import_scan import module_name

CORE = REPO_ROOT / "consumer" / "core"
#: top-level packages the core may not import: I/O, event loops, servers, telemetry
FORBIDDEN = {
    "aiohttp",
    "aiokafka",
    "anyio",
    "asyncio",
    "httpx",
    "opentelemetry",
    "socket",
    "starlette",
    "subprocess",
    "trio",
    "uvicorn",
    "yarl",
}
#: the core's own package: `consumer.*` imports must stay inside it
CORE_PACKAGE = "consumer.core"
#: pydantic stays at the edge: only the models of records read from topics may use it (STYLE.md
#: habit 5): the messages (jobs.py) and the stats snapshot read back from the stats topic
PYDANTIC_ALLOWED = {"jobs.py", "snapshots.py"}


def _module_of(path: Path) -> str:
    return module_name(path, REPO_ROOT)


def _violations(names: set[str]) -> set[str]:
    """The imports a core module may not make."""
    bad = {n for n in names if n.split(".")[0] in FORBIDDEN}
    bad |= {
        n
        for n in names
        if n.startswith("consumer.") and not (n == CORE_PACKAGE or n.startswith(CORE_PACKAGE + "."))
    }
    return bad


MODULES = sorted(CORE.rglob("*.py"))


def test_core_modules_found() -> None:
    names = {p.name for p in MODULES}
    assert {"jobs.py", "templates.py", "window.py", "packing.py", "plan.py", "retry.py"} <= names
    assert {"limit.py", "offsets.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = _imported_names(tree, _module_of(path), is_package=path.name == "__init__.py")
    bad = _violations(names)
    assert not bad, f"{path.name} imports {sorted(bad)}"
    if path.name not in PYDANTIC_ALLOWED:
        assert not any(n.split(".")[0] == "pydantic" for n in names), (
            f"{path.name}: pydantic belongs in {', '.join(sorted(PYDANTIC_ALLOWED))} only"
        )


def test_checker_catches_forbidden_imports() -> None:
    src = (
        "import asyncio\nfrom httpx import AsyncClient\nimport os.path\n__import__('socket')\n"
        "import importlib\nimportlib.import_module('uvicorn')\nfrom yarl import URL\n"
        "def f():\n    import aiohttp.web\n"
    )
    bad = _violations(_imported_names(ast.parse(src), "consumer.core.x"))
    assert {n.split(".")[0] for n in bad} == {"asyncio", "httpx", "socket", "uvicorn", "yarl", "aiohttp"}


@pytest.mark.parametrize(
    ("src", "outside"),
    [
        ("from consumer.settings import TierConfig", True),
        ("from consumer import settings", True),
        ("import consumer.runtime.limiter", True),
        ("from .. import app", True),
        ("from ..providers.base import BatchJob", True),
        ("from consumer.core.errors import ConfigError", False),
        ("from . import errors\nfrom .retry import RetryPolicy", False),
        ("from consumer import core", False),
    ],
)
def test_checker_catches_outer_consumer_imports(src: str, outside: bool) -> None:
    assert bool(_violations(_imported_names(ast.parse(src), "consumer.core.x"))) is outside
