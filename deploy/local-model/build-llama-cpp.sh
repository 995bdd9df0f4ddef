#!/usr/bin/env bash
# Install llama-cpp-python's OpenAI-compatible server (the `promptbus[local]` extra) into the
# current Python environment, building llama.cpp from source ONCE and keeping the wheel.
#
# No prebuilt wheel of llama-cpp-python exists on the package index for Linux x86_64, so pip
# compiles llama.cpp. The CMAKE_ARGS below build only what the Python server loads:
#   LLAVA_BUILD=OFF              skip the multimodal (mtmd) library: text model only
#   LLAMA_BUILD_TESTS/EXAMPLES/TOOLS/SERVER=OFF   no C++ binaries (we use the Python server)
#   GGML_BLAS=OFF                no OpenBLAS: for a 135M model llama.cpp's own kernels suffice
#   LLAMA_OPENSSL=OFF            no HTTPS in libcommon (nothing downloads at run time)
#   GGML_NATIVE=ON               -march=native: one CPU variant for THIS machine's CPU (fastest,
#                                fewest objects); so the wheel is kept per CPU-feature set, never
#                                published, and pip's shared wheel cache is bypassed
# These skip 51 of 193 compile steps (the multimodal library); libcommon is forced on by
# llama-cpp-python. Measured: 240 s on 2 cores for `pip wheel` (download + compile).
# The built wheel goes to WHEELHOUSE/CPU_TAG (default WHEELHOUSE ${XDG_CACHE_HOME:-~/.cache}/promptbus/wheels;
# CPU_TAG a hash of the CPU flags, so a cache copied to another CPU cannot crash with SIGILL), and
# later runs install it from there in seconds.
#
# Usage: deploy/local-model/build-llama-cpp.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
CPU_TAG="$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | sha256sum | cut -c1-12)"
WHEELHOUSE="${WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/promptbus/wheels}/$(uname -m)-$CPU_TAG"
mkdir -p "$WHEELHOUSE"

if "$PYTHON" -c "import llama_cpp, llama_cpp.server, sys; sys.exit(0 if llama_cpp.__version__ == '$LLAMA_CPP_PYTHON_VERSION' else 1)" 2>/dev/null; then
  echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION with its server is already installed"
  exit 0
fi

shopt -s nullglob
wheels=("$WHEELHOUSE"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl)
if (( ${#wheels[@]} == 0 )); then
  echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (several minutes; once per machine)"
  start=$(date +%s)
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
    "$PYTHON" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -w "$WHEELHOUSE"
  echo "built in $(( $(date +%s) - start )) s -> $WHEELHOUSE"
fi
wheels=("$WHEELHOUSE"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl)
# the local wheel by path (so pip cannot pick the sdist), its server extra's deps from the index
"$PYTHON" -m pip install "${wheels[0]}[server]"
