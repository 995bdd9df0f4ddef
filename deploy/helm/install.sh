#!/bin/sh
# Builds Helm 4 (`helm`, for the chart's lint and template tests) from its Go module when no
# Helm 4 is found, once per machine: into `go env GOPATH`/bin, where consumer/testing/chart.py
# looks after PATH. Idempotent: when a Helm 4 is on PATH or there, it returns at once.
# Needs the Go toolchain; the first build takes a few minutes (later ones hit Go's caches).
set -eu
HELM_MODULE=helm.sh/helm/v4/cmd/helm
HELM_VERSION=v4.3.2
is_helm4() { [ -x "$1" ] && "$1" version --template '{{.Version}}' 2>/dev/null | grep -q '^v4\.'; }
found=$(command -v helm 2>/dev/null || true)
if [ -n "$found" ] && is_helm4 "$found"; then
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    echo "deploy/helm/install.sh: no Helm 4 and no Go toolchain to build it ($HELM_MODULE@$HELM_VERSION)" >&2
    exit 1
fi
bin="$(go env GOPATH | cut -d: -f1)/bin"
if is_helm4 "$bin/helm"; then
    exit 0
fi
echo "deploy/helm/install.sh: building helm $HELM_VERSION into $bin (once per machine)" >&2
GOBIN="$bin" go install "$HELM_MODULE@$HELM_VERSION"
is_helm4 "$bin/helm" || { echo "deploy/helm/install.sh: $bin/helm is not Helm 4" >&2; exit 1; }
