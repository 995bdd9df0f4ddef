"""NamedTuples made on the hot path, without their Python-level constructor.

A NamedTuple's `__new__` is generated Python code: calling the class costs a Python frame.
The few made once per record or job (a record, its source, its ticket, its outcome record,
its window key) are made by `maker(cls)` instead, one C call (`tuple.__new__`) with the
fields in declaration order. Elsewhere, call the class: it names the fields.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T", bound=tuple[Any, ...])


def maker(cls: type[T]) -> Callable[[tuple[Any, ...]], T]:
    """`make((a, b, ...))` equals `cls(a, b, ...)` for the NamedTuple class `cls`; every field
    given, in declaration order (defaults are not applied)."""
    return cast(Callable[[tuple[Any, ...]], T], functools.partial(tuple.__new__, cls))
