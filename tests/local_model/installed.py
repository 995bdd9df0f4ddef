"""The local model tests need llama-cpp-python's server: without it they FAIL (never skip)."""

from __future__ import annotations

import pytest

from consumer import localmodel


def require_server_installed() -> None:
    """Fail (never skip) when the `promptbus[local]` extra is missing."""
    if not localmodel.server_installed():
        pytest.fail(
            "llama-cpp-python[server] is not installed, so the local model tests cannot run. "
            "Install it with deploy/local-model/build-llama-cpp.sh (fast build flags, cached wheel) "
            "or pip install -e '.[local]'; make test does this",
            pytrace=False,
        )
