"""Fixtures of the provider tests: every recorder and client a test made is closed at its end,
and the secret that must never leak (the recording server: `tests/providers/recording.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from tests.providers.recording import SECRET, close_all


@pytest.fixture(autouse=True)
async def _close_recorders() -> AsyncIterator[None]:
    yield
    await close_all()


@pytest.fixture
def secret() -> SecretStr:
    return SecretStr(SECRET)
