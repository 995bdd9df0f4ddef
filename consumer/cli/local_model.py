"""`promptbus local-model serve|stop|status`: the local llama.cpp server, from consumer.localmodel.

Its module pulls in the local model's tooling: it is imported only when `local-model` is parsed
or asked for help.
"""

from __future__ import annotations

from typing import Any

from consumer.cli.parser import module_command


def add_local_model_command(sub: Any) -> None:
    """`local-model`: options and body come from consumer.localmodel, loaded on first use."""
    sub.add_parser(
        "local-model",
        help="the local llama.cpp server with SmolLM2 (serve, stop, status)",
        load=module_command("consumer.localmodel"),
    )
