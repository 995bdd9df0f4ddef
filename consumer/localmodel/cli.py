"""`promptbus local-model serve|stop|status|fetch` (also `python -m consumer.localmodel`)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from consumer.localmodel.config import (
    DEFAULT_EMBED_N_CTX,
    DEFAULT_HOST,
    DEFAULT_N_CTX,
    DEFAULT_PORT,
    DEFAULT_WAIT_S,
    DESCRIPTION,
    EMBED_MODEL_ALIAS,
    POLL_INTERVAL_S,
    default_batch_threads,
    default_threads,
)
from consumer.localmodel.errors import LocalModelError
from consumer.localmodel.fetch import ensure_model
from consumer.localmodel.records import exit_path, log_tail, read_exit
from consumer.localmodel.server import ServerHandle, StopRequested, serve, status, stop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `serve`, `stop`, `status` and `fetch` under the `local-model` subparser."""
    sub = parser.add_subparsers(dest="local_model_command", required=True)
    srv = sub.add_parser("serve", help="fetch the model if needed, start the server, wait until it answers")
    srv.add_argument("--host", default=DEFAULT_HOST, help="listen address (default %(default)s)")
    srv.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port (default %(default)s)")
    srv.add_argument(
        "--n-ctx",
        type=int,
        default=None,
        help=f"context size in tokens (default {DEFAULT_N_CTX}; with --embeddings {DEFAULT_EMBED_N_CTX})",
    )
    srv.add_argument(
        "--embeddings",
        action="store_true",
        help=f"serve /v1/embeddings (model {EMBED_MODEL_ALIAS}: the same model, mean pooled)",
    )
    srv.add_argument(
        "--n-threads",
        type=int,
        default=None,
        help=f"threads generating tokens (default: half the cores, {default_threads()})",
    )
    srv.add_argument(
        "--n-threads-batch",
        type=int,
        default=None,
        help=f"threads reading the prompt (default: all cores, {default_batch_threads()})",
    )
    srv.add_argument(
        "--wait-s",
        type=float,
        default=DEFAULT_WAIT_S,
        help="seconds to wait for the server to answer (default %(default)s)",
    )
    srv.add_argument(
        "--foreground", action="store_true", help="stay attached; stop the server on SIGINT/SIGTERM"
    )
    for name, text in (("stop", "stop the server"), ("status", "is the server running and answering")):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--port", type=int, default=DEFAULT_PORT, help="the server's port (default %(default)s)"
        )
    sub.add_parser("fetch", help="download and verify the model file only; print its path")


def run_from_args(args: argparse.Namespace) -> int:
    """Run a `local-model` subcommand; returns the exit code (errors print one clear line)."""
    try:
        command = args.local_model_command
        if command == "fetch":
            print(ensure_model())
            return 0
        if command == "serve":
            return _serve_command(args)
        if command == "stop":
            before = status(args.port)
            stopped = stop(args.port)
            if stopped:
                print(f"stopped the local model server on port {args.port}")
            elif before.crashed and before.exit is not None:
                print(f"not running: the server on port {args.port} had crashed ({before.exit.how})")
            else:
                print("not running")
            return 0
        if command == "status":
            st = status(args.port)
            report: dict[str, object] = {
                "running": st.running,
                "answering": st.answering,
                "crashed": st.crashed,
                "models": list(st.models),
                **(asdict(st.info) if st.info else {}),
            }
            if st.exit is not None:
                report["exit"] = st.exit.how
                report["log_tail"] = st.log_tail
            print(json.dumps(report))
            if st.crashed and st.exit is not None:
                print(f"promptbus local-model: the server on port {args.port} crashed: {st.exit.how}",
                      file=sys.stderr)
            return 0 if st.running and st.answering else 1
    except LocalModelError as exc:
        print(f"promptbus local-model: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(f"unknown local-model command {args.local_model_command!r}")


def _serve_command(args: argparse.Namespace) -> int:
    current = status(args.port)
    if current.crashed:
        stop(args.port)  # forget the crashed server's files; this start replaces it
    if current.running and current.answering and current.info is not None:
        print(
            f"already running: pid {current.info.pid}, base_url {current.info.base_url}, "
            f"model {current.info.model}"
        )
        return 0
    terminated = False

    def _on_sigterm(signum: int, _frame: object) -> None:
        # only a flag: the waits below look at it (raising from a signal handler can land anywhere)
        nonlocal terminated
        terminated = True

    # installed before the start, so a SIGTERM while waiting for the server also stops it
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if args.foreground else None
    handle: ServerHandle | None = None
    try:
        started = time.monotonic()
        handle = serve(
            args.host,
            args.port,
            args.n_ctx or (DEFAULT_EMBED_N_CTX if args.embeddings else DEFAULT_N_CTX),
            args.n_threads,
            args.wait_s,
            n_threads_batch=args.n_threads_batch,
            should_stop=lambda: terminated,
            embeddings=args.embeddings,
        )
        info = handle.info
        print(
            f"local model server ready in {time.monotonic() - started:.1f} s: pid {info.pid}, "
            f"base_url {info.base_url}, model {info.model}, n_ctx {info.n_ctx}, "
            f"n_threads {info.n_threads} (batch {info.n_threads_batch}), "
            f"log {info.log_path}",
            flush=True,
        )
        if not args.foreground:
            return 0
        return _serve_in_foreground(handle, lambda: terminated)
    except StopRequested:
        return 0  # SIGTERM during the start: serve() already stopped the server
    except KeyboardInterrupt:
        if handle is not None:
            handle.stop()
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _serve_in_foreground(handle: ServerHandle, terminated: Callable[[], bool]) -> int:
    """Until the server exits (1: how, and its log's tail, on stderr) or `terminated()` (the
    SIGTERM flag; 0 once the server is stopped). SIGINT raises KeyboardInterrupt to the caller."""
    info = handle.info
    while not terminated():
        if handle.process.poll() is not None:
            ended = read_exit(exit_path(info.port, handle.pid_path.parent))
            how = ended.how if ended is not None else f"exit code {handle.process.returncode}"
            print(
                f"promptbus local-model: the server exited with {how}; log {info.log_path}:\n"
                f"{log_tail(Path(info.log_path))}",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_INTERVAL_S)
    handle.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m consumer.localmodel serve|stop|status|fetch` (the same as `promptbus local-model`)."""
    parser = argparse.ArgumentParser(prog="promptbus local-model", description=_description())
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_from_args(parser.parse_args(argv))


def _description() -> str:
    """What `promptbus local-model` runs (the first line of `consumer.localmodel`'s docstring)."""
    return DESCRIPTION
