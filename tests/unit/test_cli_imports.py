"""Building the `promptbus` parser imports no web stack: `run` and `submit` start light.

The simulator (starlette, uvicorn) and the local model (llama_cpp) are imported only when their
own subcommand is parsed. Checked in a fresh interpreter, whose `sys.modules` holds only what the
import and `build_parser()` pulled in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from consumer.cli import build_parser

HEAVY = ("starlette", "uvicorn", "llama_cpp", "consumer.testing.simulator", "consumer.localmodel")

_PROBE = f"""
import sys
import consumer.cli
consumer.cli.build_parser()
print(",".join(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_build_parser_imports_no_web_stack() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_simulate_options_load_when_parsed() -> None:
    args = build_parser().parse_args(["simulate", "--port", "0", "--faults", "5xx=0.5"])
    assert args.port == 0 and args.faults == "5xx=0.5"
    assert args.func.__module__ == "consumer.testing.simulator_entry"


def test_local_model_options_load_when_parsed() -> None:
    args = build_parser().parse_args(["local-model", "stop", "--port", "8123"])
    assert args.local_model_command == "stop" and args.port == 8123
    assert args.func.__module__ == "consumer.localmodel.cli"


@pytest.mark.parametrize("command", ["simulate", "local-model"])
def test_deferred_help_lists_the_options(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert f"usage: promptbus {command}" in help_text
    assert ("--faults" if command == "simulate" else "serve") in help_text
