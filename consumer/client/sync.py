"""`Client`: `AsyncClient`'s methods, each run to completion in the calling thread."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from consumer.client.aio import AsyncClient
from consumer.settings import Settings

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _blocking(
    method: Callable[Concatenate[AsyncClient, _P], Awaitable[_R]],
) -> Callable[Concatenate[Client, _P], _R]:
    """The blocking twin of an `AsyncClient` method: the same parameters and result."""

    @functools.wraps(method)
    def run(self: Client, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = self._call(method(self._client, *args, **kwargs))
        return result

    return run


class Client:
    """The blocking client: `AsyncClient`'s methods, each run to completion in this thread.

    `with Client() as client: client.map(...)`. It runs its own event loop, so it cannot be
    used inside a running one (use `AsyncClient` there).
    """

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        self._client = AsyncClient(settings, **overrides)
        self._runner: asyncio.Runner | None = None

    @property
    def settings(self) -> Settings:
        """The settings in use."""
        return self._client.settings

    def _call(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Client blocks; inside a running event loop use AsyncClient")
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coro)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the client and its event loop."""
        if self._runner is not None:
            self._runner.run(self._client.close())
            self._runner.close()
            self._runner = None

    map = _blocking(AsyncClient.map)
    map_chat = _blocking(AsyncClient.map_chat)
    map_embed = _blocking(AsyncClient.map_embed)
    map_jobs = _blocking(AsyncClient.map_jobs)
    collect = _blocking(AsyncClient.collect)
