"""Shared helpers for provider tests: a recording MockTransport and a secret that must never leak."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from pydantic import SecretStr

from consumer.core.completion import ChatMessage, CompletionRequest

#: a key shaped unlike anything the redaction regex knows, so a leak cannot be hidden by it
SECRET = "zq7TOPSECRETVALUE91x"


@dataclass
class Recorder:
    """A MockTransport handler that records requests and answers from a script."""

    respond: Callable[[httpx.Request], httpx.Response]
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.respond(request)

    def json(self, index: int = -1) -> Any:
        return orjson.loads(self.requests[index].content)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


def reply(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.Response(
        status, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


def recorder(status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> Recorder:
    return Recorder(lambda _req: reply(status, body, headers))


def raising(exc: Exception) -> Recorder:
    def respond(request: httpx.Request) -> httpx.Response:
        raise exc

    return Recorder(respond)


def make_request(text: str = "Classify:\nhello", **kw: Any) -> CompletionRequest:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", text))
    return CompletionRequest(messages=messages, model="m-1", **kw)


@pytest.fixture
def secret() -> SecretStr:
    return SecretStr(SECRET)
