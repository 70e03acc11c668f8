#!/usr/bin/env bash
# StateSync side by side with Redis (primary + 2 replicas, keyspace events) and NATS JetStream KV
# (3 nodes, R3), in one sitting: the same Python client loop (32 writes in flight, 1,000 keys,
# 64 B values) writes on node 1, a watcher on node 3 records what it is told. Installs what is
# missing (Debian packages: redis-server, nats-server, python3-zmq), builds StateSync's release
# binaries, runs every system in turn and prints a Markdown table; see Benchmarks/peers/README.md.
#
#   bash Benchmarks/peers/run.sh [--writes N] [--systems statesync-always,redis-always,...] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
/usr/bin/python3 -c 'import zmq' 2>/dev/null || missing+=(python3-zmq)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}" >&2
    if [ "$(id -u)" != 0 ]; then echo "peers: run as root to install ${missing[*]}, or install them" >&2; exit 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null ||
        { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
echo "==> building statesyncd and statesync (release; the first build takes several minutes)" >&2
build_log="$(mktemp -t statesync-peers-build.XXXXXX)"
for product in statesyncd statesync; do
    # Dependencies' own warnings are not ours to show; a failure prints the whole log.
    if ! swift build -c release --jobs 2 --product "$product" >"$build_log" 2>&1; then
        cat "$build_log" >&2
        echo "peers: the build failed (log above)" >&2
        exit 1
    fi
done
rm -f "$build_log"
bin="$(swift build -c release --show-bin-path)"
# Debian's python3 has python3-zmq; a pyenv or venv python on PATH may not.
PATH="/usr/sbin:$PATH" exec /usr/bin/python3 Benchmarks/peers/peers.py run --bin "$bin" "$@"
