"""Imports under consumer/ go one way (STYLE.md habit 3), checked on every module's AST.

    core, yaml12  <-  settings  <-  providers, kafka, registry, telemetry, schemas, localmodel
                  <-  runtime (providers, kafka, registry, telemetry)  <-  app  <-  cli
    client: core, settings and kafka only (the producer side never loads the service)
    testing: may import anything; nothing else imports it (tests/ and bench/ do), except
             the CLI's `simulate`, which loads the simulator by name when it is parsed

The rules are by top-level name (`consumer.client`, `consumer.kafka`, ...), so they hold
whether a name is one module or a package. Every import counts, also one inside a function
or under `if TYPE_CHECKING:`: two modules that import each other form a cycle, whichever
import is hidden. A failure names the module, the line and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path

import pytest

from consumer.testing.paths import REPO_ROOT
from tests.import_scan import Import, imports_of, module_name

CONSUMER = REPO_ROOT / "consumer"

CORE = "consumer.core"
SETTINGS = "consumer.settings"
WAITS = "consumer.waits"
YAML12 = "consumer.yaml12"
BASE = frozenset({CORE, SETTINGS, WAITS})
EDGES = BASE | {"consumer.kafka", "consumer.providers", "consumer.registry", "consumer.telemetry"}
RUNTIME = EDGES | {"consumer.runtime"}

#: top-level name -> the top-level names its modules may import (besides their own)
ALLOWED: Mapping[str, frozenset[str]] = {
    CORE: frozenset(),
    SETTINGS: frozenset({CORE, YAML12}),
    WAITS: frozenset(),
    YAML12: frozenset(),
    "consumer.kafka": BASE,
    "consumer.providers": BASE,
    "consumer.registry": BASE,
    "consumer.telemetry": BASE,
    "consumer.schemas": BASE,
    "consumer.docs_tables": BASE | {"consumer.schemas"},
    "consumer.localmodel": BASE,
    "consumer.client": BASE | {"consumer.kafka"},
    "consumer.runtime": EDGES,
    "consumer.app": RUNTIME,
    "consumer.cli": RUNTIME | {"consumer.app", "consumer.client", "consumer.schemas", "consumer.localmodel"},
    "consumer.testing": frozenset(),  # anything: see `ANYTHING`
}
#: may import any consumer module
ANYTHING = frozenset({"consumer.testing"})
#: (importer, imported): allowed inside a function only (loaded when a subcommand is parsed)
LAZY_ONLY = frozenset({("consumer.cli", "consumer.testing")})
#: the package itself (`consumer/__init__.py`, the version): anyone may import it
ROOT_PACKAGE = "consumer"


def top_level(module: str) -> str:
    """`consumer.core.window` -> `consumer.core`; `consumer` -> `consumer`."""
    return ".".join(module.split(".")[:2])


def _scan() -> dict[str, tuple[Path, list[Import]]]:
    modules = {}
    for path in sorted(CONSUMER.rglob("*.py")):
        name = module_name(path, REPO_ROOT)
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(path))
        modules[name] = (path, imports_of(tree, name, path.name == "__init__.py", source))
    return modules


MODULES = _scan()


def targets(imp: Import, known: Mapping[str, object]) -> set[str]:
    """The consumer modules an import loads: `from m import a` is `m.a` when that is a module,
    else `m` (the longest name of a known module)."""
    if not (imp.module == ROOT_PACKAGE or imp.module.startswith(ROOT_PACKAGE + ".")):
        return set()
    found = set()
    for candidate in [f"{imp.module}.{n}" for n in imp.names] or [imp.module]:
        if candidate not in known:
            candidate = imp.module
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate:
            found.add(candidate)
    return found


def graph(modules: Mapping[str, tuple[Path, list[Import]]]) -> dict[str, dict[str, Import]]:
    """module -> {imported consumer module: the first import of it}."""
    edges: dict[str, dict[str, Import]] = {}
    for name, (_, imports) in modules.items():
        out: dict[str, Import] = {}
        for imp in imports:
            for target in targets(imp, modules):
                if target != name:
                    out.setdefault(target, imp)
        edges[name] = out
    return edges


def cycles(edges: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """One cycle (a path back to its start) per group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_path_back(group[0], set(group), edges) for group in groups]


def _path_back(start: str, group: set[str], edges: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The shortest import path from `start` back to itself inside `group` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(edges.get(v, {})):
                if w not in group or w in came_from:
                    continue
                came_from[w] = v
                if w == start:
                    path = [start]
                    while path[-1] != start or len(path) == 1:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                following.append(w)
        frontier = following
    raise AssertionError(f"no way back to {start} in {sorted(group)}")


def violations(importer: str, imports: list[Import], known: Mapping[str, object]) -> list[str]:
    """What `importer` imports against `ALLOWED`, one line per import."""
    own = top_level(importer)
    if own == ROOT_PACKAGE or own in ANYTHING:
        return []
    if own not in ALLOWED:
        return [f"{importer}: {own} has no place in the layering table (tests/unit/test_layering.py)"]
    bad = []
    for imp in imports:
        for target in sorted(targets(imp, known)):
            other = top_level(target)
            if other in (own, ROOT_PACKAGE) or other in ALLOWED[own]:
                continue
            if (own, other) in LAZY_ONLY and imp.lazy:
                continue
            if (own, other) in LAZY_ONLY:
                rule = f"{own} may import {other} only inside a function"
            else:
                allowed = ", ".join(sorted(ALLOWED[own])) or "nothing outside itself"
                rule = f"{own} may not import {other} (it may import {allowed})"
            bad.append(f"{importer} (line {imp.line}) imports {target} ({imp.text!r}): {rule}")
    return bad


def test_every_top_level_name_is_placed() -> None:
    names = {top_level(m) for m in MODULES} - {ROOT_PACKAGE}
    assert {CORE, SETTINGS, "consumer.kafka", "consumer.runtime", "consumer.app", "consumer.cli"} <= names
    assert names <= set(ALLOWED), f"not in the layering table: {sorted(names - set(ALLOWED))}"


def test_no_import_cycle() -> None:
    edges = graph(MODULES)
    found = cycles(edges)
    lines = []
    for path in found:
        steps = [f"{a} (line {edges[a][b].line}: {edges[a][b].text!r}) -> {b}" for a, b in pairwise(path)]
        lines.append("import cycle:\n  " + "\n  ".join(steps))
    assert not found, "\n".join(lines)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_one_way(module: str) -> None:
    bad = violations(module, MODULES[module][1], MODULES)
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------- the checker itself
def _imports(src: str, importer: str) -> list[Import]:
    return imports_of(ast.parse(src), importer, source=src)


KNOWN = dict.fromkeys(
    [
        "consumer",
        "consumer.core",
        "consumer.core.window",
        "consumer.runtime",
        "consumer.runtime.pipeline",
        "consumer.testing",
        "consumer.testing.simulator",
        "consumer.kafka",
        "consumer.kafka.sink",
        "consumer.cli",
        "consumer.client",
        "consumer.client.map",
    ]
)


@pytest.mark.parametrize(
    ("importer", "src", "allowed"),
    [
        ("consumer.core.window", "from consumer.runtime import pipeline", False),
        ("consumer.core.window", "if TYPE_CHECKING:\n    from ..runtime.pipeline import Pipeline", False),
        ("consumer.core.window", "from consumer.core import window", True),
        ("consumer.kafka.sink", "def f():\n    import consumer.runtime.pipeline", False),
        ("consumer.runtime.pipeline", "from consumer.kafka.sink import OutcomeSink", True),
        ("consumer.client.map", "from consumer.runtime import pipeline", False),
        ("consumer.client.map", "from consumer.kafka import sink", True),
        ("consumer.runtime.pipeline", "from consumer.testing import simulator", False),
        ("consumer.cli", "from consumer.testing.simulator import run", False),
        ("consumer.cli", "def f():\n    from consumer.testing.simulator import run", True),
        ("consumer.cli", "def f():\n    load('consumer.testing.simulator')", True),
        ("consumer.cli", "load('consumer.testing.simulator')", False),
        ("consumer.testing.simulator", "from consumer.cli import main", True),
    ],
)
def test_checker_applies_the_table(importer: str, src: str, allowed: bool) -> None:
    bad = violations(importer, _imports(src, importer), KNOWN)
    assert not bad if allowed else bad, bad
    if bad:
        assert importer in bad[0] and "line" in bad[0]


def test_checker_finds_a_cycle_hidden_under_type_checking() -> None:
    sources = {
        "consumer.runtime.pipeline": "from consumer.kafka.sink import OutcomeSink",
        "consumer.kafka.sink": "if TYPE_CHECKING:\n    from consumer.runtime.pipeline import Pipeline",
        "consumer.core.window": "",
    }
    modules = {m: (Path(m), _imports(src, m)) for m, src in sources.items()}
    assert cycles(graph(modules)) == [
        ["consumer.kafka.sink", "consumer.runtime.pipeline", "consumer.kafka.sink"]
    ]
    del sources["consumer.kafka.sink"]
    modules = {m: (Path(m), _imports(src, m)) for m, src in sources.items()}
    assert cycles(graph(modules)) == []
