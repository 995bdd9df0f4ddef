"""OpenAI embeddings (`POST {base_url}/embeddings`), online and as a Batch API line's body.

One wire format serves OpenAI and the OpenAI-compatible servers that embed (llama.cpp's server
with `--embeddings`, vLLM, Ollama's `/v1`): `input` is the array of texts, `data[i].index`
says which input a vector belongs to, `usage.prompt_tokens` counts the input tokens.
`build_embeddings_body` and `read_embeddings` are shared by the online adapter
(`OpenAIEmbeddings`, a base of `OpenAIProvider`) and the Batch API (`batch_openai.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from consumer.core.completion import Usage
from consumer.core.embed import EmbeddingRequest, Embeddings
from consumer.core.errors import MalformedResponse, RateLimitHint
from consumer.providers.httpapi import ProviderHttp

__all__ = [
    "EMBEDDINGS_ENDPOINT",
    "EMBEDDINGS_PATH",
    "EmbeddingProvider",
    "OpenAIEmbeddings",
    "build_embeddings_body",
    "is_embeddings_body",
    "read_embeddings",
]

EMBEDDINGS_PATH = "/embeddings"
#: the Batch API's `endpoint` (and each line's `url`) for embeddings
EMBEDDINGS_ENDPOINT = "/v1" + EMBEDDINGS_PATH


@runtime_checkable
class EmbeddingProvider(Protocol):
    """Embeds the inputs of one request; returns Embeddings or raises a ProviderError."""

    name: str

    async def embed(self, request: EmbeddingRequest) -> Embeddings: ...


def build_embeddings_body(request: EmbeddingRequest) -> dict[str, Any]:
    """The JSON body of one embeddings request (also the `body` of a Batch API line).

    Vectors are asked as floats whatever the options say: base64 would need decoding per
    provider, and a result carries the vector as a list of floats.
    """
    body: dict[str, Any] = {"model": request.model, "input": list(request.inputs)}
    body.update({k: v for k, v in request.options.items() if v is not None})
    body["encoding_format"] = "float"
    return body


def is_embeddings_body(payload: Any) -> bool:
    """True for an embeddings answer body (a Batch API line read without its request, e.g.
    after a restart, is told apart from a chat completion by it)."""
    return isinstance(payload, Mapping) and payload.get("object") == "list" and "data" in payload


def read_embeddings(
    payload: Any,
    request: EmbeddingRequest,
    *,
    provider: str,
    request_id: str | None = None,
    latency_ms: float = 0.0,
    rate_limit: RateLimitHint | None = None,
) -> Embeddings:
    """An embeddings answer body as the Embeddings of `request`, vectors in the inputs' order;
    MalformedResponse when it is not one (the plan splits an array request on it)."""
    try:
        data = payload["data"]
        by_index: dict[int, list[float]] = {}
        for position, item in enumerate(data):
            vector = item["embedding"]
            # JSON numbers as parsed: a vector is published as it came, never converted
            if not isinstance(vector, list) or (vector and not isinstance(vector[0], float | int)):
                raise TypeError("embedding is not a list of numbers")
            by_index[int(item.get("index", position))] = vector
        vectors = tuple(by_index[i] for i in range(len(by_index)))
        usage_raw = payload.get("usage") or {}
        tokens = usage_raw.get("prompt_tokens") if isinstance(usage_raw, Mapping) else None
        model = str(payload.get("model") or request.model)
        body_id = str(payload["id"]) if payload.get("id") else None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedResponse(
            f"{provider}: 2xx body is not an embeddings list ({type(exc).__name__})", provider=provider
        ) from None
    return Embeddings(
        vectors=vectors,
        usage=Usage(input_tokens=int(tokens or 0)),
        provider=provider,
        model=model,
        request_id=request_id or body_id,
        latency_ms=latency_ms,
        response_id=body_id,
        rate_limit=rate_limit,
    )


class OpenAIEmbeddings:
    """The embeddings call of an OpenAI-style HTTP adapter (mixed into `OpenAIProvider`)."""

    name: str
    http: ProviderHttp

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """One embeddings call; raises only consumer.core.errors classes."""
        body = build_embeddings_body(request)
        reply = await self.http.request("POST", EMBEDDINGS_PATH, json_body=body)
        return read_embeddings(
            reply.json,
            request,
            provider=self.name,
            request_id=reply.request_id,
            latency_ms=reply.latency_ms,
            rate_limit=reply.rate_limit,
        )
