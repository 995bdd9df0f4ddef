"""One real llama.cpp server with SmolLM2-135M-Instruct for the whole test session.

Nothing here is skipped: when llama-cpp-python's server is not installed the fixture
FAILS with the install hint (`make test` installs the `promptbus[local]` extra).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumer import localmodel
from tests.local_model.installed import require_server_installed


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The verified SmolLM2 .gguf (downloaded on first use, then cached)."""
    return localmodel.ensure_model()


@pytest.fixture(scope="session")
def local_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[localmodel.ServerHandle]:
    """The model server on a free port, started once; stopped at the end of the session."""
    require_server_installed()
    state = tmp_path_factory.mktemp("local-model")
    # a small context keeps start-up quick; the tests' prompts are far below it
    handle = localmodel.serve(port=0, n_ctx=4096, wait_s=120, model_path=model_path, directory=state)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture()
def client(local_server: localmodel.ServerHandle) -> Iterator[httpx.Client]:
    """An httpx client on the server's /v1 base URL."""
    with httpx.Client(base_url=local_server.base_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def embed_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[localmodel.ServerHandle]:
    """The embedding server (`serve --embeddings`) on a free port, for the whole session."""
    require_server_installed()
    state = tmp_path_factory.mktemp("local-embed")
    handle = localmodel.serve(port=0, wait_s=120, model_path=model_path, directory=state, embeddings=True)
    try:
        yield handle
    finally:
        handle.stop()
