#!/bin/sh
# Installs Prometheus (the `prometheus` server and `promtool`) from the distribution's
# `prometheus` package when promtool is missing, like the local broker is set up by the
# project itself. Idempotent: when both binaries are on PATH it returns at once.
# The package's service is not started here; the tests start their own server on 127.0.0.1.
set -eu
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "deploy/prometheus/install.sh: promtool is missing and installing it needs root" \
         "(apt-get install prometheus)" >&2
    exit 1
fi
# policy-rc.d 101 keeps apt from starting the packaged service where an init system exists.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null 2>&1 || { echo "install.sh: promtool still missing" >&2; exit 1; }
