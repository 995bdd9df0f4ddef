"""`promptbus simulate`, as the CLI loads it: the simulator is imported only when the command
is parsed, and without the `simulator` extra the command says which extra to install.

The service's own install leaves the simulator's web stack out (it is a test tool), so a
missing starlette or uvicorn is an install to do, told in one line with exit status 2; any
other import error is a bug and is raised as it is.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

#: the top-level modules of the `simulator` extra that the simulator imports
EXTRA_MODULES = frozenset({"starlette", "uvicorn"})

MISSING_EXTRA = "promptbus simulate needs the simulator extra: pip install 'promptbus[simulator]'"


def _simulator_cli() -> ModuleType:
    """The simulator's CLI module; exits 2 with one line on stderr when the extra is missing."""
    try:
        from consumer.testing.simulator import cli
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in EXTRA_MODULES:
            raise
        print(MISSING_EXTRA, file=sys.stderr)
        raise SystemExit(2) from None
    return cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `promptbus simulate` (the simulator's own)."""
    _simulator_cli().add_arguments(parser)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the simulator in the foreground until Ctrl-C / SIGTERM."""
    result: int = _simulator_cli().run_from_args(args)
    return result
