#!/usr/bin/env bash
# A private apt-cacher-ng (Debian's package) on 127.0.0.1 for the molecule test hosts, with its cache
# under $GPUOPS_CACHE/apt-cacher-ng, so repeated scenario runs fetch each .deb once.
#   scripts/apt-cache.sh start   -> prints the proxy URL
#   scripts/apt-cache.sh stop
set -euo pipefail
cache=${GPUOPS_CACHE:-$HOME/.cache/gpuops}
port=${GPUOPS_APT_CACHE_PORT:-31420}
dir="$cache/apt-cacher-ng"
pidfile="$dir/run/apt-cacher-ng.pid"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
  start)
    mkdir -p "$dir/cache" "$dir/log" "$dir/run" "$dir/conf"
    # Our own configuration: the package's default one remaps Debian URLs to its list of backends,
    # which need not be reachable from here; requests go to the host the client asked for instead.
    printf 'CacheDir: %s\nLogDir: %s\nSupportDir: /usr/lib/apt-cacher-ng\nReportPage: acng-report.html\n' \
      "$dir/cache" "$dir/log" > "$dir/conf/acng.conf"
    if ! running; then
      apt-cacher-ng -c "$dir/conf" ForeGround=0 Port="$port" BindAddress=127.0.0.1 \
        PidFile="$pidfile" SocketPath="$dir/run/socket" \
        ExThreshold=30 >/dev/null
      for _ in $(seq 50); do
        running && timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null && break
        sleep 0.2
      done
      running || { echo "apt-cacher-ng did not start; see $dir/log" >&2; exit 1; }
    fi
    echo "http://127.0.0.1:$port"
    ;;
  stop)
    if running; then kill "$(cat "$pidfile")"; fi
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
