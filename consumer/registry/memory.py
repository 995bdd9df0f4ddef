"""`MemoryRegistry`: the `SchemaRegistry` fake, schemas in a dict (ids from 1, per subject its
versions); `down` makes every call fail as an unreachable registry does."""

from __future__ import annotations

from consumer.core.errors import RegistryUnavailable
from consumer.registry.client import RegisteredSchema, SchemaNotFound, SchemaType

__all__ = ["MemoryRegistry"]


class MemoryRegistry:
    """An in-memory registry: every schema is compatible; `calls` counts the calls made."""

    def __init__(self) -> None:
        self._by_id: dict[int, RegisteredSchema] = {}
        self._subjects: dict[str, list[int]] = {}
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise RegistryUnavailable("the registry (memory) is down")

    async def schema(self, schema_id: int) -> RegisteredSchema:
        self._check()
        found = self._by_id.get(schema_id)
        if found is None:
            raise SchemaNotFound(f"the registry has no schema id {schema_id}")
        return found

    async def register(self, subject: str, schema_type: SchemaType, text: str) -> int:
        self._check()
        for schema_id, found in self._by_id.items():
            if found.text == text and found.schema_type == schema_type:
                versions = self._subjects.setdefault(subject, [])
                if schema_id not in versions:
                    versions.append(schema_id)
                return schema_id
        schema_id = len(self._by_id) + 1
        self._by_id[schema_id] = RegisteredSchema(schema_id, schema_type, text)
        self._subjects.setdefault(subject, []).append(schema_id)
        return schema_id

    async def latest(self, subject: str) -> RegisteredSchema:
        self._check()
        versions = self._subjects.get(subject)
        if not versions:
            raise SchemaNotFound(f"the registry has no subject {subject!r}")
        return self._by_id[versions[-1]]

    async def compatible(self, subject: str, schema_type: SchemaType, text: str) -> bool:
        self._check()
        return True

    async def aclose(self) -> None:
        return None
