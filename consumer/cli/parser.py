"""A subcommand parser whose options are added on first use, so a heavy command's module is
imported only when that command runs or is asked for help."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr, exit 2."""

    def error(self, message: str) -> Any:
        """Print `message` in one line naming the command, and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class CommandParser(OneLineParser):
    """A subcommand's parser whose options, with `load`, are added on first use.

    `load(parser)` runs once, before the parser first parses or formats its help, so a
    subcommand's module is imported only when that subcommand runs or is asked for help.
    """

    def __init__(
        self, *args: Any, load: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._load = load

    def _ensure_loaded(self) -> None:
        load, self._load = self._load, None
        if load is not None:
            load(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Load the options, then parse as ArgumentParser does."""
        self._ensure_loaded()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        """Load the options, then format the usage line."""
        self._ensure_loaded()
        return super().format_usage()

    def format_help(self) -> str:
        """Load the options, then format the help."""
        self._ensure_loaded()
        return super().format_help()


def module_command(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """A `CommandParser` loader: import `module`, add its `add_arguments(parser)` options and
    make its `run_from_args(args)` the subcommand's function."""

    def load(parser: argparse.ArgumentParser) -> None:
        owner = importlib.import_module(module)
        owner.add_arguments(parser)
        parser.set_defaults(func=owner.run_from_args)

    return load
