"""Form bodies: url-encoded fields, or multipart/form-data when files go too (RFC 7578)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from urllib.parse import urlencode


def form_body(
    data: Mapping[str, str] | None, files: Mapping[str, tuple[str, bytes, str]] | None
) -> tuple[str, bytes]:
    """(content type, body) of a form: plain `data` fields, then `files` as
    `{field: (filename, content, content_type)}`; url-encoded when there are no files."""
    if not files:
        return "application/x-www-form-urlencoded", urlencode(dict(data or {})).encode("ascii")
    boundary = secrets.token_hex(16)
    parts: list[bytes] = []
    for name, value in (data or {}).items():
        parts.append(_part(boundary, f'form-data; name="{_quoted(name)}"', None, value.encode("utf-8")))
    for name, (filename, content, content_type) in files.items():
        disposition = f'form-data; name="{_quoted(name)}"; filename="{_quoted(filename)}"'
        parts.append(_part(boundary, disposition, content_type, content))
    parts.append(f"--{boundary}--\r\n".encode("ascii"))
    return f"multipart/form-data; boundary={boundary}", b"".join(parts)


def _part(boundary: str, disposition: str, content_type: str | None, content: bytes) -> bytes:
    head = f"--{boundary}\r\ncontent-disposition: {disposition}\r\n"
    if content_type:
        head += f"content-type: {content_type}\r\n"
    return head.encode("utf-8") + b"\r\n" + content + b"\r\n"


def _quoted(text: str) -> str:
    # RFC 7578 4.2: a name's quote and line breaks are percent-encoded
    return text.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
