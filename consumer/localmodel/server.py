"""Starting, checking and stopping the server: `serve()` returns once a real completion was
answered, `status()` says whether it runs and answers (or how it crashed), `stop()` ends it."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from consumer.localmodel.config import (
    DEFAULT_HOST,
    DEFAULT_N_CTX,
    DEFAULT_PORT,
    DEFAULT_WAIT_S,
    EMBED_MODEL_ALIAS,
    EMBED_SERVER_MODULE,
    INSTALL_HINT,
    MODEL_ALIAS,
    POLL_INTERVAL_S,
    SERVER_MODULE,
    STOP_WAIT_S,
    default_batch_threads,
    default_threads,
    state_dir,
)
from consumer.localmodel.errors import LocalModelError
from consumer.localmodel.fetch import ensure_model
from consumer.localmodel.health import completes, embeds, free_port, port_in_use, served_models
from consumer.localmodel.process import is_our_server, terminate
from consumer.localmodel.records import (
    ServerExit,
    ServerInfo,
    exit_path,
    forget,
    log_tail,
    pid_path,
    read_exit,
    read_info,
    write_json,
)

log = logging.getLogger(__name__)


@dataclass
class ServerHandle:
    """A started server: `process` is its supervisor's Popen, `info` what the pid file holds."""

    process: subprocess.Popen[bytes]
    info: ServerInfo
    pid_path: Path

    @property
    def base_url(self) -> str:
        """`http://HOST:PORT/v1`."""
        return self.info.base_url

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `timeout_s`) and remove its pid file."""
        terminate(self.process.pid, timeout_s, popen=self.process)
        self.pid_path.unlink(missing_ok=True)


@dataclass(frozen=True)
class ServerStatus:
    """`status()` answer: running = the recorded process is alive; answering = /v1/models replied.

    crashed: the recorded server ended without being asked to (`exit` says how, `log_tail`
    holds the last lines of its log); it stays reported until `stop` or the next `serve`.
    """

    running: bool
    answering: bool
    info: ServerInfo | None
    models: tuple[str, ...] = ()
    crashed: bool = False
    exit: ServerExit | None = None
    log_tail: str = ""


def server_installed() -> bool:
    """True when `llama_cpp.server` can be imported (the `promptbus[local]` extra is installed)."""
    try:
        return importlib.util.find_spec("llama_cpp") is not None and (
            importlib.util.find_spec(SERVER_MODULE) is not None
        )
    except (ImportError, ValueError):
        return False


def server_command(
    model_path: Path,
    *,
    host: str,
    port: int,
    n_ctx: int,
    n_threads: int,
    n_threads_batch: int,
    python: str | None = None,
    embeddings: bool = False,
) -> list[str]:
    """The argv that starts llama-cpp-python's OpenAI-compatible server for the model.

    interrupt_requests is off so a new request never cuts a streaming one short.
    `embeddings`: serve `/v1/embeddings` instead (`embedserver.py`), with physical batches of
    the whole context, so one input of up to `n_ctx` tokens is pooled in one pass.
    """
    extra: list[str] = []
    if embeddings:
        extra = ["--embedding", "True", "--n_batch", str(n_ctx), "--n_ubatch", str(n_ctx)]
    return [
        python or sys.executable,
        "-m",
        EMBED_SERVER_MODULE if embeddings else SERVER_MODULE,
        "--model",
        str(model_path),
        "--model_alias",
        EMBED_MODEL_ALIAS if embeddings else MODEL_ALIAS,
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads_batch),
        "--interrupt_requests",
        "False",
        *extra,
    ]


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    n_ctx: int = DEFAULT_N_CTX,
    n_threads: int | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    n_threads_batch: int | None = None,
    model_path: Path | None = None,
    directory: Path | None = None,
    should_stop: Callable[[], bool] | None = None,
    embeddings: bool = False,
) -> ServerHandle:
    """Start the model server in the background; return once it has answered a real completion
    (`embeddings`: the embedding server, once it has answered a real embeddings request).

    `should_stop` is polled while waiting; when it turns true the server is stopped and
    `StopRequested` is raised (the CLI's SIGTERM while starting).

    `port=0` picks a free port (read it back from `handle.info.port`). Fetches the model
    first (`ensure_model()`) unless `model_path` is given. The server runs
    in its own session (it outlives the calling command; `stop()` ends it), logs to
    `DIR/server-PORT.log` and is recorded in `DIR/server-PORT.pid` (DIR = `.local/local-model`).
    Raises LocalModelError with a clear reason: extra not installed, port taken, the server
    exited (how: exit code or signal, with the tail of its log) or did not answer a completion
    within `wait_s` seconds (then it is killed).
    """
    if not server_installed():
        raise LocalModelError(f"llama-cpp-python's server is not installed: {INSTALL_HINT}")
    if port == 0:
        port = free_port(host)
    threads = n_threads if n_threads is not None else default_threads()
    batch_threads = n_threads_batch if n_threads_batch is not None else default_batch_threads()
    if port_in_use(host, port):
        raise LocalModelError(
            f"{host}:{port} is already in use; stop what runs there "
            f"(`promptbus local-model stop --port {port}`) or pick another --port"
        )
    model = model_path if model_path is not None else ensure_model()
    state = directory if directory is not None else state_dir()
    state.mkdir(parents=True, exist_ok=True)
    cmd = server_command(
        model, host=host, port=port, n_ctx=n_ctx, n_threads=threads, n_threads_batch=batch_threads,
        embeddings=embeddings,
    )
    log.info(
        "starting local model server on %s:%d (n_ctx=%d, n_threads=%d, n_threads_batch=%d)",
        host, port, n_ctx, threads, batch_threads,
    )
    process, server_pid, log_path = _start_supervised(cmd, state, port)
    info = ServerInfo(
        pid=server_pid,
        host=host,
        port=port,
        base_url=f"http://{host}:{port}/v1",
        model=EMBED_MODEL_ALIAS if embeddings else MODEL_ALIAS,
        log_path=str(log_path),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=batch_threads,
        started_at=time.time(),
        supervisor_pid=process.pid,
    )
    path = pid_path(port, state)
    # written whole or not at all (a temporary file renamed over it): `status`, `stop` and a
    # second `serve` read it at any moment, and an empty file would read as no server
    write_json(path, asdict(info))
    handle = ServerHandle(process=process, info=info, pid_path=path)
    try:
        _wait_until_answering(handle, wait_s, should_stop)
    except BaseException:
        # interrupted (Ctrl-C, SIGTERM turned into KeyboardInterrupt) or failed: never leave a
        # half-started server behind
        handle.stop()
        raise
    return handle


def _start_supervised(cmd: list[str], state: Path, port: int) -> tuple[subprocess.Popen[bytes], int, Path]:
    """Start the server `cmd` under its supervisor, in a session of its own (it outlives the
    calling command) logging to `DIR/server-PORT.log`; return the supervisor, the server's pid
    (as the supervisor records it) and the log's path. A supervisor that records no pid is
    stopped before the error is raised."""
    log_path = state / f"server-{port}.log"
    record = exit_path(port, state)
    record.unlink(missing_ok=True)
    supervisor = [
        sys.executable,
        "-c",
        "import sys; from consumer.localmodel.process import supervise; "
        "sys.exit(supervise(sys.argv[1], sys.argv[2:]))",
        str(record),
        *cmd,
    ]
    with log_path.open("wb") as log_fh:
        process = subprocess.Popen(
            supervisor,
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        server_pid = _wait_for_child_pid(process, record)
    except BaseException:
        terminate(process.pid, STOP_WAIT_S, popen=process)
        raise
    return process, server_pid, log_path


class StopRequested(Exception):
    """A stop was asked for while the server was starting (it has been stopped)."""


def _wait_for_child_pid(process: subprocess.Popen[bytes], record: Path, timeout_s: float = 30.0) -> int:
    """The server's pid, as its supervisor records it right after starting it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(json.loads(record.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if process.poll() is not None:
            raise LocalModelError(
                f"the local model server's supervisor exited with code {process.returncode}"
            )
        time.sleep(0.02)
    raise LocalModelError(f"the local model server did not start within {timeout_s:.0f} s")


def _wait_until_answering(
    handle: ServerHandle, wait_s: float, should_stop: Callable[[], bool] | None = None
) -> None:
    """Wait until the model is listed and a real completion is answered, or the server dies."""
    process, base_url, path = handle.process, handle.info.base_url, handle.pid_path
    log_path = Path(handle.info.log_path)
    deadline = time.monotonic() + wait_s
    why = "it did not answer"

    def died() -> LocalModelError | None:
        if process.poll() is None:
            return None
        path.unlink(missing_ok=True)
        ended = read_exit(exit_path(handle.info.port, path.parent))
        how = ended.how if ended is not None else f"exit code {process.returncode}"
        return LocalModelError(
            f"local model server exited with {how} before answering; log {log_path}:\n{log_tail(log_path)}"
        )

    while True:
        if (dead := died()) is not None:
            raise dead
        models = served_models(base_url, timeout_s=1.0)
        if models is not None and handle.info.model in models:
            probe = embeds if handle.info.model == EMBED_MODEL_ALIAS else completes
            problem = probe(base_url, timeout_s=max(1.0, min(60.0, deadline - time.monotonic())))
            if problem is None:
                return
            why = problem
            if (dead := died()) is not None:
                raise dead
        if should_stop is not None and should_stop():
            raise StopRequested
        if time.monotonic() >= deadline:
            raise LocalModelError(
                f"local model server did not answer a completion at {base_url} within {wait_s:.0f} s "
                f"({why}); it was stopped. log {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(POLL_INTERVAL_S)


def status(port: int = DEFAULT_PORT, directory: Path | None = None) -> ServerStatus:
    """Whether the recorded server on `port` runs and answers, or how it crashed.

    A pid file whose process is gone is removed, unless the server crashed: then the crash
    (how it ended, the tail of its log) is reported until `stop` or the next `serve`.
    """
    info = read_info(port, directory)
    if info is None:
        return ServerStatus(running=False, answering=False, info=None)
    if not is_our_server(info.pid):
        ended = read_exit(exit_path(port, directory))
        if ended is not None and not ended.stopped:
            tail = log_tail(Path(info.log_path), lines=8)
            return ServerStatus(False, False, info, crashed=True, exit=ended, log_tail=tail)
        forget(port, directory)
        return ServerStatus(running=False, answering=False, info=None)
    models = served_models(info.base_url)
    return ServerStatus(running=True, answering=models is not None, info=info, models=models or ())


def stop(port: int = DEFAULT_PORT, directory: Path | None = None, timeout_s: float = STOP_WAIT_S) -> bool:
    """Stop the recorded server on `port`. Returns False when none was running."""
    info = read_info(port, directory)
    if info is None:
        return False
    if not is_our_server(info.pid):
        forget(port, directory)
        return False
    terminate(info.pid, timeout_s)
    forget(port, directory)
    return True
