#!/bin/sh
# Builds Toxiproxy's server (the network fault proxy of the fault tests, bench/netfaults.py)
# from its Go module when missing, once per machine, into ${XDG_CACHE_HOME:-~/.cache}/promptbus/bin
# where consumer/testing/toxiproxy.py looks (after PATH and TOXIPROXY_SERVER). Idempotent:
# when the binary is there it returns at once. Needs the Go toolchain; the first build takes
# about a minute on 2 cores (later ones hit Go's caches). Prints the binary's path.
set -eu
TOXIPROXY_MODULE=github.com/Shopify/toxiproxy/v2/cmd/server
TOXIPROXY_VERSION=v2.5.0
bin="${XDG_CACHE_HOME:-$HOME/.cache}/promptbus/bin"
target="$bin/toxiproxy-server-$TOXIPROXY_VERSION"
if [ -x "$target" ]; then
    echo "$target"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "deploy/toxiproxy/install.sh: no toxiproxy server and no Go toolchain to build it ($TOXIPROXY_MODULE@$TOXIPROXY_VERSION)" >&2
    exit 1
fi
mkdir -p "$bin"
# built into a temp dir and renamed: an interrupted build never looks complete, and two
# concurrent installs (pytest workers) each build their own copy and the last rename wins
tmp="$(mktemp -d "$bin/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "deploy/toxiproxy/install.sh: building toxiproxy $TOXIPROXY_VERSION into $bin (once per machine)" >&2
GOBIN="$tmp" go install "$TOXIPROXY_MODULE@$TOXIPROXY_VERSION"
mv "$tmp/server" "$target"
"$target" -version >/dev/null 2>&1 || { echo "deploy/toxiproxy/install.sh: $target does not run" >&2; exit 1; }
echo "$target"
