"""The simulator's prompt cache, as each provider reports its use (see the package docstring)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from consumer.providers.anthropic import min_cacheable_tokens
from consumer.testing.simulator.model import estimate_tokens

#: how long a cached prefix lives after its last use (Anthropic's default, ephemeral 5 minutes)
CACHE_TTL_S = 300.0
#: OpenAI caches prompts of at least this many tokens, in steps of OPENAI_CACHE_STEP_TOKENS
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128
#: the shortest prompt that can share OPENAI_CACHE_MIN_TOKENS with another (4 characters a token)
OPENAI_CACHE_MIN_CHARS = OPENAI_CACHE_MIN_TOKENS * 4
#: recent prompts remembered per OpenAI prompt_cache_key
OPENAI_CACHE_PROMPTS = 64


def _anthropic_blocks(content: Any) -> list[tuple[str, bool]]:
    """(text, ends a cached prefix) of each text block of a system or message content."""
    if isinstance(content, str):
        return [(content, False)]
    if not isinstance(content, list):
        return []
    return [
        (str(part.get("text", "")), isinstance(part.get("cache_control"), Mapping))
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    ]


def _common_prefix_chars(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # the longest equal prefix, by halving (slices compare in C)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptCache:
    """The simulator's prompt cache: what a request reads from it and writes to it (tokens)."""

    def __init__(self) -> None:
        self._anthropic: dict[str, float] = {}
        self._openai: dict[str | None, list[tuple[str, str]]] = {}

    def anthropic(self, body: Mapping[str, Any], now_s: float) -> tuple[int, int]:
        """(cache_read_input_tokens, cache_creation_input_tokens) of a Messages body."""
        texts: list[str] = []
        cached_chars: int | None = None
        blocks = _anthropic_blocks(body.get("system")) + [
            block
            for m in body.get("messages") or []
            if isinstance(m, Mapping)
            for block in _anthropic_blocks(m.get("content"))
        ]
        for text, marked in blocks:
            texts.append(text)
            if marked:
                cached_chars = sum(len(t) for t in texts)
        if cached_chars is None:
            return 0, 0
        prefix = "".join(texts)[:cached_chars]
        tokens = estimate_tokens(prefix)
        if tokens < min_cacheable_tokens(str(body.get("model") or "")):
            return 0, 0
        tools = orjson.dumps(body.get("tools") or [], option=orjson.OPT_SORT_KEYS).decode()
        digest = hashlib.sha256(f"{body.get('model')}\0{tools}\0{prefix}".encode()).hexdigest()
        last = self._anthropic.get(digest)
        self._anthropic[digest] = now_s
        if last is not None and now_s - last <= CACHE_TTL_S:
            return tokens, 0
        return 0, tokens

    def openai(self, body: Mapping[str, Any], prompt_text: str) -> int:
        """`cached_tokens` of a chat completion body whose messages' text is `prompt_text`."""
        if len(prompt_text) < OPENAI_CACHE_MIN_CHARS:
            # it shares fewer than the cacheable minimum with any prompt, and any later prompt
            # shares fewer with it: neither compared nor remembered
            return 0
        head = orjson.dumps(
            [body.get("model"), body.get("tools"), body.get("response_format")], option=orjson.OPT_SORT_KEYS
        ).decode()
        key = body.get("prompt_cache_key")
        recent = self._openai.setdefault(key if isinstance(key, str) else None, [])
        best = 0
        for seen_head, seen_text in recent:
            if seen_head == head:
                best = max(best, _common_prefix_chars(seen_text, prompt_text))
        recent.append((head, prompt_text))
        del recent[:-OPENAI_CACHE_PROMPTS]
        tokens = best // 4  # whole tokens of the shared characters
        if tokens < OPENAI_CACHE_MIN_TOKENS:
            return 0
        stepped = tokens // OPENAI_CACHE_STEP_TOKENS * OPENAI_CACHE_STEP_TOKENS
        return min(stepped, estimate_tokens(prompt_text))

    def usage(self, kind: str, body: Mapping[str, Any], all_text: str, now_s: float) -> tuple[int, int]:
        """(tokens read from the cache, tokens written to it) of one request of either API."""
        if kind == "anthropic":
            return self.anthropic(body, now_s)
        return self.openai(body, all_text), 0
