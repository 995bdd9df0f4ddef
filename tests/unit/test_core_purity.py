"""consumer/core is pure: no event loop, Kafka, HTTP, telemetry, sockets or processes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "consumer" / "core"
FORBIDDEN = {"asyncio", "aiokafka", "httpx", "opentelemetry", "socket", "subprocess", "anyio", "trio"}
#: pydantic stays at the edge: only the message models may use it (STYLE.md habit 5)
PYDANTIC_ALLOWED = {"jobs.py", "schema_gen.py"}


def _imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                roots.add(node.args[0].value.split(".")[0])
    return roots


MODULES = sorted(CORE.rglob("*.py"))


def test_core_modules_found() -> None:
    names = {p.name for p in MODULES}
    assert {"jobs.py", "templates.py", "window.py", "packing.py", "plan.py", "retry.py"} <= names
    assert {"limit.py", "offsets.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    roots = _imported_roots(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    assert not roots & FORBIDDEN, f"{path.name} imports {sorted(roots & FORBIDDEN)}"
    if path.name not in PYDANTIC_ALLOWED:
        assert "pydantic" not in roots, f"{path.name}: pydantic belongs in jobs.py only"


def test_checker_catches_forbidden_imports() -> None:
    src = "import asyncio\nfrom httpx import AsyncClient\nimport os.path\n__import__('socket')\n"
    assert _imported_roots(ast.parse(src)) == {"asyncio", "httpx", "os", "socket"}
