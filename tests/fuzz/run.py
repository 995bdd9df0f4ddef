"""Coverage-guided fuzzing of one target with atheris (libFuzzer), for as long as asked.

    python -m tests.fuzz.run TARGET [CORPUS_DIR] [libFuzzer flags, e.g. -max_total_time=600]

TARGET is one of `TARGETS`. The target's seeds are written into CORPUS_DIR (a fresh
temporary directory when none is given), where libFuzzer also keeps the inputs that reach new
code. A crash (an exception the target's contract does not allow, or a failed check) stops
the run and is written to ./crash-<sha1>: add it to the target's tests as an `@example`
after fixing the parser. Without atheris, run the same targets with hypothesis for a time
budget instead: PROMPTBUS_FUZZ_SECONDS=600 python -m pytest tests/fuzz
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path

#: target name -> the test module holding its `fuzz_one` and `SEEDS`
TARGETS = {
    "answer": "tests.fuzz.test_fuzz_answer",
    "output": "tests.fuzz.test_fuzz_output",
    "job": "tests.fuzz.test_fuzz_job",
    "admission": "tests.fuzz.test_fuzz_admission",
    "metadata": "tests.fuzz.test_fuzz_metadata",
    "ratelimit": "tests.fuzz.test_fuzz_ratelimit",
}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(
            "usage: python -m tests.fuzz.run TARGET [CORPUS_DIR] [libFuzzer flags]; "
            f"TARGET: {', '.join(TARGETS)}"
        )
    try:
        import atheris
    except ImportError:
        sys.exit(
            "atheris is not installed (pip install atheris); hypothesis runs the same targets: "
            "PROMPTBUS_FUZZ_SECONDS=600 python -m pytest tests/fuzz"
        )
    name, rest = argv[1], argv[2:]
    # only promptbus's own code is instrumented: coverage of it is what guides the fuzzer
    with atheris.instrument_imports(include=["consumer"]):
        module = importlib.import_module(TARGETS[name])
    dirs = [arg for arg in rest if not arg.startswith("-")]
    if not dirs:
        dirs = [tempfile.mkdtemp(prefix=f"promptbus-fuzz-{name}-")]
        rest = [*rest, dirs[0]]
    corpus = Path(dirs[0])
    if not corpus.is_file():  # a file (a crash-<sha1>) is run once, to reproduce it
        corpus.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(module.SEEDS):
            (corpus / f"seed-{i:03d}").write_bytes(seed)
        print(f"fuzzing {name} ({TARGETS[name]}.fuzz_one), corpus {corpus}", file=sys.stderr)
    atheris.Setup([argv[0], *rest], module.fuzz_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
