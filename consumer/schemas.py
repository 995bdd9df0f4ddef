"""Generate `schemas/*.json` from the message and tier-file models.

    python -m consumer.schemas            # write schemas/ (relative to the repo root)
    python -m consumer.schemas --check    # exit 1 when schemas/ differs (drift)

Job and the tier file are described as they are read (validation); Result and DeadLetter
as they are written (serialization). `tests/unit/test_schemas.py` fails on drift. A tool of the
repository, outside `consumer.core`: it parses arguments and writes files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from consumer.core.jobs import DeadLetter, Job, Result
from consumer.settings import TierFile

__all__ = ["DEFAULT_DIR", "generate", "main"]

#: schemas/ at the repository root (consumer/schemas.py -> ../schemas).
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "schemas"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_MODELS: dict[str, tuple[type[BaseModel], str, str]] = {
    "job.schema.json": (Job, "validation", "A job read from the jobs topic (promptbus.jobs)."),
    "result.schema.json": (Result, "serialization", "A result written to the results topic."),
    "dead_letter.schema.json": (DeadLetter, "serialization", "A dead letter written to the DLQ topic."),
    "tier_file.schema.json": (TierFile, "validation", "The YAML tier file (--config / PROMPTBUS_CONFIG)."),
}


def generate() -> dict[str, str]:
    """File name -> JSON text (2-space indent, trailing newline) of every schema."""
    out: dict[str, str] = {}
    for name, (model, mode, description) in _MODELS.items():
        schema: dict[str, Any] = {"$schema": _DIALECT}
        schema.update(model.model_json_schema(mode=mode))  # type: ignore[arg-type]
        schema.setdefault("description", description)
        out[name] = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the schemas (or, with --check, compare them); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m consumer.schemas", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="directory (default: schemas/)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = args.out / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        fix = "python -m consumer.schemas"
        print(f"schemas out of date: {', '.join(stale)}; run: {fix}", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
