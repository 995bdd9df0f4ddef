"""`promptbus simulate`: the fake provider server, from consumer.testing.simulator.

Its module pulls in a web stack (starlette, uvicorn): it is imported only when `simulate` is
parsed or asked for help.
"""

from __future__ import annotations

from typing import Any

from consumer.cli.parser import module_command


def add_simulate_command(sub: Any) -> None:
    """`simulate`: options and body come from the simulator's module, loaded on first use."""
    sub.add_parser(
        "simulate",
        help="run the fake provider server (OpenAI + Anthropic wire formats)",
        load=module_command("consumer.testing.simulator_entry"),
    )
