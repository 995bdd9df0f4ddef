"""YAML as a reader reads it: plain scalars resolved by the YAML 1.2 core schema.

PyYAML resolves plain scalars by YAML 1.1, where `on`, `off`, `yes`, `no`, `y` and `n` are
booleans, `010` is octal, `1:30` is 90 and `2026-12-01` a date, while `1e3` stays a string.
A tier file written by hand would then not say what promptbus gets: `fallback: {on:
[outage]}` has the key `true`, and `prompt_cache: off` is `false`. Under the core schema only
`true`/`false` (any of three spellings) are booleans, `null`/`~`/empty is null, and numbers
are decimal, `0o` octal or `0x` hex integers and decimal floats (`.inf`, `.nan`); every other
plain scalar is the string written. Merge keys (`<<: *anchor`) are kept, as most YAML tools
read them.

`load_yaml` reads a document so; `dump_yaml` writes data so that `load_yaml` reads it back
equal (it quotes exactly the strings the core schema would read as something else, and keeps
the mappings' order, which is a lane's priority). Every tier file is read with `load_yaml`.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml import YAMLError
from yaml.constructor import ConstructorError

__all__ = ["YAMLError", "Yaml12Dumper", "Yaml12Loader", "dump_yaml", "load_yaml"]

_NULL = "tag:yaml.org,2002:null"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"

_DIGITS = list("0123456789")
#: (tag, pattern, possible first characters): the core schema's plain-scalar rules, in the
#: order they are tried (an integer before a float, so `10` is an integer)
_CORE_SCHEMA: tuple[tuple[str, str, list[str]], ...] = (
    (_NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", ["t", "T", "f", "F"]),
    (_INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", ["-", "+", *_DIGITS]),
    (
        _FLOAT,
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        ["-", "+", ".", *_DIGITS],
    ),
    (_MERGE, r"^(?:<<)$", ["<"]),
)


def _core_resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    table: dict[Any, list[tuple[str, re.Pattern[str]]]] = {}
    for tag, pattern, first in _CORE_SCHEMA:
        compiled = re.compile(pattern)
        for char in first:
            table.setdefault(char, []).append((tag, compiled))
    return table


def _int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    try:
        return int(text[2:] if base != 10 else text, base)
    except ValueError:
        raise ConstructorError(None, None, f"{text!r} is not an integer", node.start_mark) from None


def _float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    lower = text.lower()
    if lower in (".inf", "+.inf", "-.inf"):
        return -math.inf if lower.startswith("-") else math.inf
    if lower == ".nan":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ConstructorError(None, None, f"{text!r} is not a number", node.start_mark) from None


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's plain scalars (module docstring)."""

    yaml_implicit_resolvers = _core_resolvers()


Yaml12Loader.add_constructor(_INT, _int)
Yaml12Loader.add_constructor(_FLOAT, _float)


class Yaml12Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting a string exactly when `Yaml12Loader` would read it as
    something else."""

    yaml_implicit_resolvers = _core_resolvers()


def load_yaml(text: str) -> Any:
    """One YAML document, read by the core schema (raises yaml.YAMLError on bad YAML)."""
    return yaml.load(text, Loader=Yaml12Loader)


def dump_yaml(data: Any) -> str:
    """`data` as YAML that `load_yaml` reads back equal; mappings keep their order. Characters
    outside ASCII are written escaped: PyYAML writes a raw NEL (U+0085) where a reader sees a
    line break."""
    return yaml.dump(data, Dumper=Yaml12Dumper, sort_keys=False)
