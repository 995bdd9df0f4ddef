"""The `promptbus` command. Subcommands are thin: they parse arguments and call into the app."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promptbus", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from consumer.testing import simulator

    sim = sub.add_parser("simulate", help="run the fake provider server (OpenAI + Anthropic wire formats)")
    simulator.add_arguments(sim)
    sim.set_defaults(func=simulator.run_from_args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
