"""Is the server there: free and taken ports, the model listing, and a real completion
(the readiness probe)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from consumer.localmodel.config import DEFAULT_HOST, EMBED_MODEL_ALIAS, MODEL_ALIAS


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port on `host` that nothing listens on right now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def served_models(base_url: str, timeout_s: float = 2.0) -> tuple[str, ...] | None:
    """Model ids from `GET {base_url}/models`, or None when the server does not answer."""
    try:
        with _NO_PROXY.open(f"{base_url}/models", timeout=timeout_s) as resp:
            if resp.status != 200:
                return None
            payload = json.loads(resp.read())
    except (OSError, ValueError):  # refused, timed out, an HTTP error status (HTTPError), not JSON
        return None
    try:
        return tuple(str(m.get("id")) for m in payload.get("data", []))
    except (ValueError, AttributeError):
        return None


#: health checks go straight to the local server, whatever proxy the environment names
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: the readiness probe: one real completion, as short as the server allows
_PROBE_BODY = {
    "model": MODEL_ALIAS,
    "messages": [{"role": "user", "content": "Say OK."}],
    "max_tokens": 2,
    "temperature": 0,
}


def _probe(url: str, body: dict[str, Any], what: str, timeout_s: float) -> tuple[Any, str | None]:
    """POST `body` to `url`: (the JSON answer, None), or (None, why it failed), `what` naming
    the probe ("a test completion")."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with _NO_PROXY.open(request, timeout=timeout_s) as resp:
            return json.loads(resp.read()), None
    except urllib.error.HTTPError as exc:
        return None, f"{what} got HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset (the server died), timed out, not JSON
        return None, f"{what} failed: {exc}"


def embeds(base_url: str, timeout_s: float = 60.0) -> str | None:
    """None when `POST {base_url}/embeddings` answers two inputs with two equal-length vectors
    of numbers (the readiness probe of an embedding server), else why not."""
    body = {"model": EMBED_MODEL_ALIAS, "input": ["OK", "ready"]}
    payload, problem = _probe(f"{base_url}/embeddings", body, "a test embedding", timeout_s)
    if problem is not None:
        return problem
    try:
        vectors = [item["embedding"] for item in payload["data"]]
    except (KeyError, IndexError, TypeError):
        return "a test embedding answered without vectors"
    pooled = all(isinstance(x, float) for v in vectors for x in v)
    if len(vectors) != 2 or not pooled or len(vectors[0]) != len(vectors[1]) or not vectors[0]:
        return "a test embedding did not answer one vector of numbers per input"
    return None


def completes(base_url: str, timeout_s: float = 60.0) -> str | None:
    """None when `POST {base_url}/chat/completions` answers a short prompt with text, else why not."""
    payload, problem = _probe(f"{base_url}/chat/completions", _PROBE_BODY, "a test completion", timeout_s)
    if problem is not None:
        return problem
    try:
        text = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return "a test completion answered without a message"
    return None if isinstance(text, str) else "a test completion answered without text"
