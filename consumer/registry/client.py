"""Schemas by id and subject: the `SchemaRegistry` Protocol, and `RegistryClient`, the real one
over confluent-kafka's `AsyncSchemaRegistryClient` (any Confluent-compatible registry:
Confluent's, Apicurio's /apis/ccompat/v7, Redpanda's).

Its errors are translated here into promptbus's: a schema the registry does not have is a
`SchemaNotFound` (the record that names it is undecodable), anything else that fails (a refused
connection, a timeout, a 5xx) is `RegistryUnavailable`: the records that need it wait.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from consumer.core.errors import PromptbusError, RegistryUnavailable

__all__ = ["RegisteredSchema", "RegistryClient", "SchemaNotFound", "SchemaRegistry", "SchemaType"]

log = logging.getLogger(__name__)

SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema as the registry holds it: its id, type and text (for Protobuf, .proto text)."""

    schema_id: int
    schema_type: SchemaType
    text: str


class SchemaNotFound(PromptbusError):
    """The registry has no such schema id or subject."""


class SchemaRegistry(Protocol):
    """What sources ask of a registry."""

    async def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema with this id (SchemaNotFound, RegistryUnavailable)."""
        ...

    async def register(self, subject: str, schema_type: SchemaType, text: str) -> int:
        """Register `text` under `subject` (its id when it is there already); RegistryUnavailable,
        or PromptbusError when the registry refuses it (incompatible)."""
        ...

    async def latest(self, subject: str) -> RegisteredSchema:
        """The subject's latest version (SchemaNotFound, RegistryUnavailable)."""
        ...

    async def compatible(self, subject: str, schema_type: SchemaType, text: str) -> bool:
        """Whether `text` may be registered under `subject` (True when the subject is new)."""
        ...

    async def aclose(self) -> None: ...


class RegistryClient:
    """A Confluent-compatible registry at `url` (basic auth when a user is given). Schemas by id
    never change, so the client caches them (confluent-kafka's own cache)."""

    def __init__(
        self, url: str, *, username: str | None = None, password: str | None = None, timeout_s: float = 10.0
    ) -> None:
        from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

        conf: dict[str, object] = {"url": url, "timeout": timeout_s, "max.retries": 1}
        if username is not None:
            conf["basic.auth.user.info"] = f"{username}:{password or ''}"
        self.url = url
        self._client = AsyncSchemaRegistryClient(conf)

    @classmethod
    def from_settings(cls, settings: Any) -> RegistryClient:
        """The registry `consumer.settings.SchemaRegistry` names (its `url` must be set)."""
        password = settings.password
        return cls(
            settings.url,
            username=settings.username,
            password=password.get_secret_value() if password is not None else None,
            timeout_s=settings.timeout_s,
        )

    def __repr__(self) -> str:
        return f"RegistryClient({self.url!r})"  # never the credentials

    async def schema(self, schema_id: int) -> RegisteredSchema:
        found = await self._call(self._client.get_schema(schema_id), f"schema id {schema_id}")
        return RegisteredSchema(schema_id, _type(found.schema_type), found.schema_str)

    async def register(self, subject: str, schema_type: SchemaType, text: str) -> int:
        from confluent_kafka.schema_registry import Schema

        schema = Schema(text, schema_type=schema_type)
        return int(await self._call(self._client.register_schema(subject, schema), f"subject {subject!r}"))

    async def latest(self, subject: str) -> RegisteredSchema:
        found = await self._call(self._client.get_latest_version(subject), f"subject {subject!r}")
        return RegisteredSchema(found.schema_id, _type(found.schema.schema_type), found.schema.schema_str)

    async def compatible(self, subject: str, schema_type: SchemaType, text: str) -> bool:
        from confluent_kafka.schema_registry import Schema

        try:
            await self.latest(subject)
        except SchemaNotFound:
            return True
        schema = Schema(text, schema_type=schema_type)
        verdict = await self._call(self._client.test_compatibility(subject, schema), f"subject {subject!r}")
        return bool(verdict)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, pending: Awaitable[Any], what: str) -> Any:
        """Await a registry call with its errors as ours."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return await pending
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            if status == 404:
                raise SchemaNotFound(f"the registry has no {what}") from None
            if status is not None and 400 <= status < 500 and status not in (408, 429):
                reason = f"{exc.error_message} (HTTP {status})"
                raise PromptbusError(f"the registry refused {what}: {reason}") from None
            raise RegistryUnavailable(f"the registry at {self.url} failed on {what}: HTTP {status}") from None
        except Exception as exc:  # connection refused, timeouts: httpx's errors
            raise RegistryUnavailable(
                f"the registry at {self.url} is unreachable ({type(exc).__name__}) for {what}"
            ) from None


def _type(schema_type: str | None) -> SchemaType:
    """The registry's name of a schema type (a schema without one is Avro)."""
    name = (schema_type or "AVRO").upper()
    if name not in ("AVRO", "PROTOBUF", "JSON"):
        raise PromptbusError(f"unknown schema type {schema_type!r}")
    return name  # type: ignore[return-value]
