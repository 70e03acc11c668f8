#!/usr/bin/env bash
# How far the full mesh scales: real statesyncd processes (statesync harness; with --netns, as
# root, every node is a host of its own) and the simulator, at growing cluster sizes, one
# partition healed per run. Writes one JSON line per run and draws docs/scale.svg.
#
#   bash Benchmarks/scale/run.sh [OUT.jsonl]
#
# Sizes: STATESYNC_SCALE_REAL (default "3 8 16 24") and STATESYNC_SCALE_SIM (default
# "3 8 16 32 64 128").
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-Benchmarks/scale/results.jsonl}"
real_sizes="${STATESYNC_SCALE_REAL:-3 8 16 24}"
sim_sizes="${STATESYNC_SCALE_SIM:-3 8 16 32 64 128}"
bash .ci/build -c release
bin="$(swift build -c release --show-bin-path)"
netns=()
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then netns=(--netns); fi
: >"$out"
for n in $real_sizes; do
    echo "harness ${netns[*]:-loopback} --nodes $n" >&2
    if ! "$bin/statesync" harness "${netns[@]}" --nodes "$n" --ops 4000 --seed 11 --faults partition --json \
        --statesyncd "$bin/statesyncd" >/tmp/statesync-scale-run.json 2>/tmp/statesync-scale-run.err; then
        echo "{\"kind\": \"real\", \"nodes\": $n, \"passed\": false, \"error\": $(tail -1 /tmp/statesync-scale-run.err | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}" >>"$out"
        continue
    fi
    python3 -c '
import json, sys
r = json.load(sys.stdin)
res, pm = r["node_resources"], r["peer_messages_received"]
rates = [pm[k] / res[k]["uptime_s"] for k in pm if k in res and res[k]["uptime_s"] > 0]
print(json.dumps({
    "kind": "real", "netns": '"$([ ${#netns[@]} -gt 0 ] && echo True || echo False)"', "nodes": r["nodes"],
    "passed": r["passed"], "convergence_ms": r["convergence_ms"],
    "cpu_s_per_node": round(sum(v["cpu_s"] for v in res.values()) / len(res), 2),
    "max_rss_mib": round(max(v["max_rss_kb"] for v in res.values()) / 1024, 1),
    "peer_msgs_per_node_per_s": round(sum(rates) / len(rates)),
    "duration_s": r["duration_s"]}))' </tmp/statesync-scale-run.json >>"$out"
done
for n in $sim_sizes; do
    echo "simulate --nodes $n" >&2
    "$bin/statesync" simulate --nodes "$n" --ops 4000 --seed 6 --faults partition --json |
        python3 -c '
import json, sys
r = json.load(sys.stdin)
seconds = r["simulated_ms"] / 1000
print(json.dumps({
    "kind": "sim", "nodes": r["nodes"], "passed": r["passed"], "convergence_ms": r["convergence_ms"],
    "cpu_s_total": r["cpu_s"], "peer_msgs_per_node_per_s": round(r["peer_messages_per_node_per_s"]),
    "peer_kib_per_node_per_s": round(r["peer_bytes"] / r["nodes"] / seconds / 1024),
    "heartbeat_ms": int(r["parameters"]["heartbeat_ms"])}))' >>"$out"
done
python3 Benchmarks/scale/plot.py "$out" docs/scale.svg
cat "$out"
