""".proto text as message classes, and the same text with one more string field in a message.

Registries hold Protobuf schemas as .proto text (Apicurio answers its `format=serialized` with
raw bytes rather than the base64 a Confluent client expects), so the text is compiled here with
protoc itself (grpcio-tools' in-process protoc, with the well-known types it ships).
"""

from __future__ import annotations

import importlib.resources
import re
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from consumer.core.errors import PromptbusError

__all__ = ["ProtoSchema", "message_path", "with_string_field"]

_FILE = "schema.proto"


class ProtoSchema:
    """One .proto text compiled: its top-level messages by index (the wire format's message
    indexes name one; nested messages by the following indexes)."""

    def __init__(self, text: str) -> None:
        files = _compile(text)
        pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            pool.Add(file)
        self.file = pool.FindFileByName(_FILE)
        #: the top-level messages' names in their order in the text (the indexes count in it)
        self._top_level = [m.name for m in files.file[-1].message_type]
        self._classes: dict[tuple[int, ...], type[Message]] = {}

    def descriptor(self, indexes: tuple[int, ...]) -> Descriptor:
        """The message the indexes name ((): the first top-level one)."""
        path = indexes or (0,)
        try:
            desc = self.file.message_types_by_name[self._top_level[path[0]]]
            for index in path[1:]:
                desc = desc.nested_types[index]
        except IndexError:
            raise PromptbusError(f"the schema has no message at indexes {list(path)}") from None
        return desc

    def message_class(self, indexes: tuple[int, ...]) -> type[Message]:
        found = self._classes.get(indexes)
        if found is None:
            found = self._classes[indexes] = GetMessageClass(self.descriptor(indexes))
        return found

    def decode(self, indexes: tuple[int, ...], payload: bytes) -> dict[str, Any]:
        """The message's fields as JSON-like values (field names as in the .proto)."""
        message = self.message_class(indexes)()
        try:
            message.ParseFromString(payload)
        except DecodeError as exc:
            raise ValueError(f"not a {message.DESCRIPTOR.full_name}: {exc}") from None
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    def encode(self, indexes: tuple[int, ...], row: dict[str, Any]) -> bytes:
        """`row` (as `decode` gives it, plus fields this schema has) as the message's bytes."""
        message = self.message_class(indexes)()
        json_format.ParseDict(row, message)
        return message.SerializeToString()


def _compile(text: str) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    includes = importlib.resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="promptbus-proto-") as tmp:
        (Path(tmp) / _FILE).write_text(text, encoding="utf-8")
        out = Path(tmp) / "out.pb"
        code = protoc.main(
            ["protoc", f"-I{tmp}", f"-I{includes}", "--include_imports", f"--descriptor_set_out={out}", _FILE]
        )
        if code != 0 or not out.exists():
            raise PromptbusError("the Protobuf schema does not compile (protoc refused it)")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def message_path(desc: Descriptor) -> tuple[str, ...]:
    """The names from a message's top-level message down to it (`Review`, `Review.Line`)."""
    names = []
    current: Descriptor | None = desc
    while current is not None:
        names.append(current.name)
        current = current.containing_type
    return tuple(reversed(names))


def with_string_field(text: str, message: str | tuple[str, ...], field_name: str, number: int) -> str:
    """The .proto text with `string FIELD = NUMBER;` added to `message` (a top-level message's
    name, or the names down to a nested one: each looked for inside the one before), before
    its closing brace (comments and strings are skipped when braces are counted)."""
    path = (message,) if isinstance(message, str) else message
    start, end = 0, len(text)
    for name in path:
        opening = re.compile(r"\bmessage\s+" + re.escape(name) + r"\s*\{").search(text, start, end)
        if opening is None:
            raise PromptbusError(f"no message {'.'.join(path)} in the schema")
        start, end = opening.end(), _closing_brace(text, opening.end(), ".".join(path))
    return text[:end] + f"  string {field_name} = {number};\n" + text[end:]


def _closing_brace(text: str, i: int, message: str) -> int:
    """Where the block opened just before `i` closes."""
    depth = 1
    while i < len(text) and depth:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        ch = text[i]
        if ch in "\"'":
            end = i + 1
            while end < len(text) and text[end] != ch:
                end += 2 if text[end] == "\\" else 1
            i = end + 1
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        i += 1
    if depth:
        raise PromptbusError(f"message {message} is not closed in the schema")
    return i - 1
