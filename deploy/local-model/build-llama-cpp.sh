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
#   GGML_NATIVE=OFF + an explicit instruction set, the x86-64-v3 level (SSE4.2, AVX, AVX2, BMI2,
#                                FMA, F16C) with AVX-512, AVX-VNNI and AMX off: never -march=native.
#                                Machines of one kind can list CPU flags (AVX-512, AMX) that their VM
#                                cannot execute, so a native build dies with SIGILL on its first
#                                completion; this build runs on any x86-64-v3 CPU, whatever it lists
# These skip 51 of 193 compile steps (the multimodal library); libcommon is forced on by
# llama-cpp-python. Measured: 309 s on 2 quiet cores for `pip wheel` (download + compile).
# The built wheel goes to WHEELHOUSE/BUILD_TAG (default WHEELHOUSE ${XDG_CACHE_HOME:-~/.cache}/promptbus/wheels;
# BUILD_TAG a hash of the version and the build flags, never of the CPU: the same flags make the
# same wheel on every machine), and later runs install it from there in seconds.
#
# Usage: deploy/local-model/build-llama-cpp.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${1:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
CMAKE_FLAGS="-DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
BUILD_TAG="$(printf '%s %s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_FLAGS" | sha256sum | cut -c1-12)"
WHEELHOUSE="${WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/promptbus/wheels}/$(uname -m)-x86-64-v3-$BUILD_TAG"
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
  CMAKE_ARGS="$CMAKE_FLAGS" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
    "$PYTHON" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -w "$WHEELHOUSE"
  echo "built in $(( $(date +%s) - start )) s -> $WHEELHOUSE"
fi
wheels=("$WHEELHOUSE"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl)
# the local wheel by path (so pip cannot pick the sdist), its server extra's deps from the index
"$PYTHON" -m pip install "${wheels[0]}[server]"
