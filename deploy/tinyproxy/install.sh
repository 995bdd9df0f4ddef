#!/bin/sh
# Installs tinyproxy (a real HTTP proxy: CONNECT tunnels, absolute-form requests, basic auth)
# from the distribution's `tinyproxy` package when it is missing, like the local broker is set
# up by the project itself. Idempotent: when the binary is there it returns at once.
# The package's service is not started here; the proxy tests start their own tinyproxy on
# 127.0.0.1 (consumer/testing/tinyproxy.py) and fail, never skip, without it.
set -eu
PATH="$PATH:/usr/sbin:/usr/bin"
if command -v tinyproxy >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "deploy/tinyproxy/install.sh: tinyproxy is missing and installing it needs root" \
         "(apt-get install tinyproxy)" >&2
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
apt-get install -y -q --no-install-recommends tinyproxy >/dev/null
command -v tinyproxy >/dev/null 2>&1 || { echo "install.sh: tinyproxy still missing" >&2; exit 1; }
