"""llama-cpp-python's server for an embedding model with mean pooling (`serve --embeddings`).

`python -m consumer.localmodel.embedserver ARGS` is `python -m llama_cpp.server ARGS` with
every model it loads set to mean pooling: the server has no setting for the pooling type, and
a chat model's GGUF names none, so llama.cpp would answer one vector per TOKEN. Mean pooling
averages the last hidden states of the input's tokens into one vector per input (what
sentence-embedding models do, and what `llama-server --embeddings --pooling mean` does).
"""

from __future__ import annotations

import functools


def main() -> None:
    """Run llama-cpp-python's server with mean pooling (its arguments are the server's)."""
    import llama_cpp
    from llama_cpp.server.__main__ import main as server_main

    pooled = functools.partialmethod(llama_cpp.Llama.__init__, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    llama_cpp.Llama.__init__ = pooled  # type: ignore[method-assign,assignment]
    server_main()


if __name__ == "__main__":
    main()
