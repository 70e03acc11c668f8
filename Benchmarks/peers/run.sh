#!/usr/bin/env bash
# StateSync side by side with Redis (primary + 2 replicas, keyspace events) and NATS JetStream KV
# (3 nodes, R3), in one sitting: the same Python client loop (32 writes in flight, 1,000 keys,
# 64 B values) writes on node 1, a watcher on node 3 records what it is told. Installs what is
# missing (.ci/setup --peers: libzmq3-dev, redis-server, nats-server, python3-zmq), builds
# StateSync's release binaries, runs every system in turn and prints a Markdown table; see
# Benchmarks/peers/README.md.
#
#   bash Benchmarks/peers/run.sh [--writes N] [--systems statesync-always,redis-always,...] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup --peers
echo "==> building statesyncd and statesync (release; the first build takes several minutes)" >&2
bash .ci/build -c release
bin="$(swift build -c release --show-bin-path)"
# Debian's python3 has python3-zmq; a pyenv or venv python on PATH may not.
PATH="/usr/sbin:$PATH" exec /usr/bin/python3 Benchmarks/peers/peers.py run --bin "$bin" "$@"
