"""The base of every tier-file model: frozen once read, and a key it does not know is refused
(a typo in a tier file stops startup naming the key, rather than being ignored)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
