"""`promptbus simulate`: the simulator in the foreground, its knobs as flags."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import uvicorn

from consumer.testing.simulator.app import SimulatorApp
from consumer.testing.simulator.config import FIELD_TYPES, KNOBS, SimulatorConfig, parse_faults
from consumer.testing.simulator.server import SimulatorTls, uvicorn_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `promptbus simulate`: --host, --port, --faults and one flag per knob."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    names = "\n".join(f"  {', '.join(k.names):<38} {k.help}" for k in KNOBS)
    parser.description = (
        "Run the fake provider server (OpenAI + Anthropic wire formats).\n"
        "OpenAI base URL: http://HOST:PORT/v1   Anthropic base URL: http://HOST:PORT\n"
        "Counters: GET /_sim/stats; reset: POST /_sim/reset;\n"
        "change knobs while running: POST /_sim/config with a JSON object {name: value}.\n\n"
        "--faults takes comma-separated name=value pairs, e.g.\n"
        "  --faults 5xx=0.05,429_rpm=600,malformed=0.1\n"
        "Rates are probabilities in [0, 1]. Names (aliases) and meaning:\n" + names + "\n\n"
        "Each knob also has its own flag (below); a flag wins over --faults.\n"
        "The deterministic model: an ordinary prompt is answered 'sim:' + sha256(input)[:12], the input\n"
        "being the text after the last line ending with ':'; a batched prompt's JSON-array line is\n"
        "answered with one JSON object {alias: answer}. See consumer/testing/simulator/."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    parser.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (and --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", metavar="PEM", help="require a client certificate signed by this CA (mTLS)"
    )
    parser.add_argument("--faults", default="", metavar="NAME=VALUE,...", help="fault knobs, see above")
    for knob in KNOBS:
        flag = "--" + knob.field.replace("_", "-")
        kind = str(FIELD_TYPES[knob.field])
        if kind == "bool":
            parser.add_argument(
                flag, dest=f"sim_{knob.field}", action="store_const", const=True, default=None, help=knob.help
            )
        else:
            conv: Any = int if kind == "int" else float if kind == "float" else str
            metavar = "N" if kind == "int" else "X" if kind == "float" else "VALUE"
            parser.add_argument(
                flag, dest=f"sim_{knob.field}", type=conv, default=None, metavar=metavar, help=knob.help
            )


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """--faults first, then the individual flags over it."""
    config = parse_faults(args.faults or "")
    changes = {
        k.field: getattr(args, f"sim_{k.field}")
        for k in KNOBS
        if getattr(args, f"sim_{k.field}", None) is not None
    }
    return replace(config, **changes)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the simulator in the foreground until Ctrl-C / SIGTERM."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"promptbus simulate: {exc}", flush=True)
        return 2
    tls = None
    if getattr(args, "tls_cert", None):
        if not args.tls_key:
            print("promptbus simulate: --tls-cert needs --tls-key", flush=True)
            return 2
        tls = SimulatorTls(args.tls_cert, args.tls_key, args.tls_client_ca)
    sim = SimulatorApp(config)
    server = uvicorn.Server(uvicorn_config(sim, args.host, args.port, tls))
    sim.server = server
    scheme = "https" if tls else "http"
    where = f"{scheme}://{args.host}:{args.port}"
    print(f"promptbus simulator on {where} (OpenAI base .../v1) {config}", flush=True)
    server.run()
    return 0
