"""The one error of the local model's management."""

from __future__ import annotations

from consumer.core.errors import PromptbusError


class LocalModelError(PromptbusError):
    """The local model could not be fetched, verified, started, stopped or reached."""
