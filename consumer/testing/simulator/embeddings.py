"""Embeddings as the simulator answers them: online (`ChatRoutes.openai_embeddings`) and as
Batch API lines (`offline.py`).

Every vector is a function of its input text, the model and `dimensions` alone: a unit
vector seeded by their hash (`embedding_vector`), so a test can check that each vector
belongs to its own input whatever request carried it. The route checks what OpenAI checks
(an `input` string or array of strings, at most `MAX_INPUTS` of them, each at most
`MAX_INPUT_TOKENS` tokens: else a 400), answers floats or base64 as `encoding_format` asks,
and takes the online faults of its chat route that matter to an array request: the rate
limits (tokens counted), latency, 5xx errors.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from collections.abc import Mapping
from typing import Any

from consumer.testing.simulator.model import estimate_tokens
from consumer.testing.simulator.refusals import Refusal

__all__ = [
    "DEFAULT_DIMENSIONS",
    "EMBEDDINGS_URL",
    "MAX_INPUTS",
    "MAX_INPUT_TOKENS",
    "embedding_vector",
    "embeddings_body",
    "embeddings_refusal",
    "embeddings_tokens",
]

EMBEDDINGS_URL = "/v1/embeddings"
#: a vector's length when the request names no `dimensions`
DEFAULT_DIMENSIONS = 64
#: OpenAI's limits: inputs per request, tokens per input
MAX_INPUTS = 2048
MAX_INPUT_TOKENS = 8192


def embedding_vector(text: str, model: str, dimensions: int = DEFAULT_DIMENSIONS) -> list[float]:
    """The unit vector of `text`: seeded by the hash of model and text, so equal inputs get
    equal vectors and different ones (almost surely) different vectors."""
    seed = int.from_bytes(hashlib.sha256(f"{model}\0{text}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    values = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _inputs(body: Mapping[str, Any]) -> list[str] | None:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def embeddings_refusal(body: Any) -> Refusal | None:
    """Why an embeddings body is refused with a 400 (None: it is not), OpenAI's words."""
    if not isinstance(body, dict):
        return Refusal("the request body is not a JSON object")
    inputs = _inputs(body)
    if inputs is None:
        return Refusal("'input' must be a string or a non-empty array of strings", param="input")
    if len(inputs) > MAX_INPUTS:
        return Refusal(f"'input' must have at most {MAX_INPUTS} items", param="input")
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        return Refusal("'dimensions' must be a positive integer", param="dimensions")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        return Refusal("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    for text in inputs:
        tokens = estimate_tokens(text)
        if tokens > MAX_INPUT_TOKENS:
            return Refusal(
                f"This model's maximum context length is {MAX_INPUT_TOKENS} tokens, however you "
                f"requested {tokens} tokens in the input. Please reduce your input.",
                param="input",
            )
    return None


def embeddings_tokens(body: Mapping[str, Any]) -> int:
    """The input tokens of an embeddings body."""
    return sum(estimate_tokens(t) for t in _inputs(body) or [])


def embeddings_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to an accepted embeddings body (`embeddings_refusal` said None)."""
    inputs = _inputs(body) or []
    model = str(body.get("model") or "sim-embed")
    dimensions = int(body.get("dimensions", DEFAULT_DIMENSIONS))
    tokens = embeddings_tokens(body)
    vectors = [embedding_vector(t, model, dimensions) for t in inputs]
    encoded: list[Any] = vectors
    if body.get("encoding_format") == "base64":
        # OpenAI's base64: the little-endian float32 values (the official SDKs ask for it)
        encoded = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode("ascii") for v in vectors]
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
