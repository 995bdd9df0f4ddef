"""What the fuzz targets share: the run budget, bytes -> text, near-valid inputs.

Every target module holds

- `check_*` functions: call one parser and assert that only its declared verdicts and
  errors come out (anything else raised is a crash the test reports);
- `fuzz_one(data: bytes)`: the target as a coverage-guided fuzzer calls it (atheris, see
  `tests/fuzz/run.py`): the bytes are turned into the parser's input, then checked;
- `SEEDS`: realistic inputs (as `fuzz_one` reads them), the start of a fuzzer's corpus and of
  the hypothesis mutation strategy;
- hypothesis tests: the seeds mutated, structure-aware inputs, raw bytes through `fuzz_one`,
  and `@example`s of every crash found so far.

Budget: `make test` runs each fuzz test for `BOUNDED_EXAMPLES` examples (a few seconds).
`PROMPTBUS_FUZZ_SECONDS=N` runs each fuzz test for N seconds instead (`run_budget`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: seconds each fuzz test runs for; 0: the bounded mode of `make test`
FUZZ_SECONDS = float(os.environ.get("PROMPTBUS_FUZZ_SECONDS") or 0)
#: examples per fuzz test in the bounded mode: enough to catch a regression, cheap enough for CI
BOUNDED_EXAMPLES = int(os.environ.get("PROMPTBUS_FUZZ_EXAMPLES") or 200)
#: examples per round in the long mode: rounds repeat until the budget is spent
_ROUND_EXAMPLES = 2000

fuzz_settings = settings(
    max_examples=_ROUND_EXAMPLES if FUZZ_SECONDS > 0 else BOUNDED_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def run_budget(test: Callable[[], None]) -> None:
    """Run a hypothesis test once (bounded mode), or again and again for FUZZ_SECONDS.

    Each call of a `@given` test draws fresh examples, so the rounds explore further; a
    failure stops the loop with hypothesis's shrunk falsifying example.
    """
    end = time.monotonic() + FUZZ_SECONDS
    test()
    while time.monotonic() < end:
        test()


def text_of(data: bytes, *, errors: str = "replace") -> str:
    """Bytes as the str a parser gets. `errors="replace"`: valid Unicode, as orjson decodes
    a body; `"surrogateescape"`: each invalid byte a lone surrogate, as aiohttp decodes headers."""
    return data.decode("utf-8", errors)


#: pieces a parser may find awkward: JSON syntax, escapes (of a lone surrogate, of NUL),
#: numbers past float and int64 range, fences, digits of other scripts, U+FFFD
_AWKWARD = [
    *'{}[]":,\\`\n\r\t 0123456789-+.eE_/=\x00\ufffd\u0663\u00b5',
    "\\ud800",
    "\\udfff",
    "\\u0000",
    '\\"',
    "1e400",
    "-0",
    "NaN",
    "Infinity",
    "9" * 30,
    "null",
    "true",
    "```",
    "```json\n",
]
#: lone surrogates: what aiohttp makes of bytes that are not UTF-8 (never in an orjson-decoded body)
_SURROGATES = ["\ud800", "\udcff", "\udfff"]


def awkward(*, surrogates: bool = False, max_pieces: int = 40) -> st.SearchStrategy[str]:
    """Text built of awkward pieces and any other characters (lone surrogates only if asked)."""
    pieces = _AWKWARD + _SURROGATES if surrogates else _AWKWARD
    return st.lists(st.one_of(st.sampled_from(pieces), st.characters()), max_size=max_pieces).map("".join)


awkward_text = awkward()


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[str], *, surrogates: bool = False) -> str:
    """A seed with a few random edits: cut, insert, delete, replace, duplicate a slice."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(0, 4))):
        n = len(text)
        op = draw(st.sampled_from(("cut", "insert", "delete", "replace", "duplicate")))
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 16)))
        if op == "cut":
            text = text[:i]
        elif op == "insert":
            text = text[:i] + draw(awkward(surrogates=surrogates, max_pieces=8)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "replace":
            text = text[:i] + draw(awkward(surrogates=surrogates, max_pieces=8)) + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


def json_values(keys: st.SearchStrategy[str], *, strings: st.SearchStrategy[str] = awkward_text) -> Any:
    """JSON-shaped values (as Python objects) whose object keys come from `keys`."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        strings,
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
        max_leaves=12,
    )


def nested(depth: int, *, open_: str = "[", close: str = "]") -> str:
    """A bracket nesting `depth` deep (past the recursion limit, past orjson's 1,024 levels)."""
    return open_ * depth + close * depth
