"""A static scan of the imports of a Python module (its AST), for the tests that check who
may import what (`tests/unit/test_core_purity.py`, `tests/unit/test_layering.py`).

Counted: `import`, `from ... import` (relative ones made absolute), wherever they are (in a
function, under `if TYPE_CHECKING:`), `__import__` and `importlib.import_module` with a
literal name, and a literal `consumer.*` name handed to any call (a module loaded by name,
as the CLI loads its heavy subcommands).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement (or import by name) of a module."""

    #: the absolute module name (`from module import ...`, `import module`)
    module: str
    #: the names of `from module import names`; empty for `import module` and by-name loads
    names: tuple[str, ...]
    #: its line in the source
    line: int
    #: inside a function: runs only when the function is called
    lazy: bool
    #: the statement as written, for failure messages
    text: str


def module_name(path: Path, root: Path) -> str:
    """`<root>/consumer/core/x.py` -> `consumer.core.x` (a package's `__init__.py` -> the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute name of `from <level dots><module> import ...` in module `importer`."""
    if level == 0:
        return module or ""
    package = importer.split(".")
    if not is_package:
        package = package[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports_of(tree: ast.AST, importer: str = "", is_package: bool = False, source: str = "") -> list[Import]:
    """Every import of the module `importer` whose AST is `tree`."""
    found: list[Import] = []

    def text(node: ast.AST) -> str:
        segment = ast.get_source_segment(source, node) if source else None
        return segment if segment is not None else ast.unparse(node)

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(alias.name, (), node.lineno, lazy, text(node)))
        elif isinstance(node, ast.ImportFrom):
            module = resolve(node.module, node.level, importer, is_package)
            names = tuple(alias.name for alias in node.names if alias.name != "*")
            found.append(Import(module, names, node.lineno, lazy, text(node)))
        elif isinstance(node, ast.Call):
            for name in _names_loaded(node):
                found.append(Import(name, (), node.lineno, lazy, text(node)))
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return [i for i in found if i.module]


def imported_names(tree: ast.AST, importer: str = "", is_package: bool = False) -> set[str]:
    """Every module name the code imports, absolute; `from m import a` yields `m` and `m.a`
    (`a` may be a submodule: `from consumer import settings`)."""
    names: set[str] = set()
    for imp in imports_of(tree, importer, is_package):
        names.add(imp.module)
        names.update(f"{imp.module}.{name}" for name in imp.names)
    return names


def _names_loaded(call: ast.Call) -> list[str]:
    literals = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if _is_dynamic_import(call.func):
        first = call.args[0] if call.args else None
        return [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []
    return [
        s for s in literals if s.startswith("consumer.") and s.replace(".", "").replace("_", "").isalnum()
    ]


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"
