"""What the local model server is started with: the model id it reports, its module, the
default host, port, context and threads, and where its state files live."""

from __future__ import annotations

import os
from pathlib import Path

#: what `promptbus local-model` runs, as its help says it
DESCRIPTION = "A real local model: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M-Instruct."

#: the model id the server reports (`/v1/models`, a tier file's `model:`), whatever the file path
MODEL_ALIAS = "smollm2-135m-instruct"

SERVER_MODULE = "llama_cpp.server"
#: `serve --embeddings`: the same model as an embedding model (mean pooling, `embedserver.py`)
EMBED_MODEL_ALIAS = "smollm2-135m-embed"
EMBED_SERVER_MODULE = "consumer.localmodel.embedserver"
#: an embedding server's context: every input is read in one physical batch of this many
#: tokens (pooling needs the whole input at once), so its compute buffers grow with it
DEFAULT_EMBED_N_CTX = 2048
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_N_CTX = 8192
DEFAULT_WAIT_S = 120.0
STOP_WAIT_S = 10.0
POLL_INTERVAL_S = 0.2
INSTALL_HINT = (
    "install the local-model extra: pip install 'promptbus[local]' "
    "(llama-cpp-python compiles llama.cpp from source the first time, several minutes on 2 cores; "
    "see deploy/local-model/build-llama-cpp.sh for the fast build flags)"
)


def default_threads() -> int:
    """Generation threads: half the cores (at least 1); `consumer.localmodel` says why."""
    return max((os.cpu_count() or 1) // 2, 1)


def default_batch_threads() -> int:
    """Prompt-processing threads: every core."""
    return max(os.cpu_count() or 1, 1)


def state_dir() -> Path:
    """`.local/local-model` under the current directory (`PROMPTBUS_LOCAL_STATE_DIR` overrides)."""
    override = os.environ.get("PROMPTBUS_LOCAL_STATE_DIR")
    return Path(override) if override else Path(".local") / "local-model"
