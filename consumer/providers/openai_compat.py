"""OpenAI-compatible local servers (vLLM, llama.cpp server, Ollama's `/v1`, TGI).

The same code as `OpenAIProvider`; the differences are defaults: the key is optional and the
natural structured mode is llama.cpp's `json_object` + schema (vLLM users set `json_schema`).
These servers have no Batch API (see `factory.build_batch_provider`).
"""

from __future__ import annotations

from typing import ClassVar

from consumer.providers.openai import OpenAIProvider
from consumer.providers.structured import StructuredMode


class OpenAICompatProvider(OpenAIProvider):
    """Chat completions on any OpenAI-compatible base URL (up to and including `/v1`)."""

    #: local servers cache prefixes on their own (vLLM, llama.cpp) and may refuse unknown fields
    sends_cache_key = False

    default_name: ClassVar[str] = "openai_compat"
    default_structured_mode: ClassVar[StructuredMode] = "json_object"
