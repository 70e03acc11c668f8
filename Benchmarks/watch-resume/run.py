#!/usr/bin/env python3
"""What a resumed watch costs its node (issue #17, README "The thirty-second sitting").

Starts one statesyncd (Config/node1.yaml with free ports of 127.0.0.1, no peers, a fresh data
directory, storage.fsync: interval) on this host, writes with the peers benchmark's writer until its journal holds SMALL, then LARGE
deltas, and at each size sends, over and over, a WATCH of channel "bench" from the node's latest
cursor and its UNWATCH (PROTOCOL.md 10.5, with pyzmq), waiting for each answer. Prints the wall
time and the node's CPU time (from /proc) per WATCH + UNWATCH. The node is stopped at the end.

    /usr/bin/python3 Benchmarks/watch-resume/run.py .build/release [--small 1000] [--large 100000]

(Debian's Python: it has python3-zmq, which `bash .ci/setup --peers` installs.)
"""
import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "Benchmarks", "peers"))
from peers import StateSyncWriter, string, varint  # noqa: E402



def free_port():
    """A TCP port of 127.0.0.1 nothing listens on now (the node binds it right after)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


# node1's own ports, free ones: a cluster of the quick start, or another run, may hold 7001/7101.
API = f"tcp://127.0.0.1:{free_port()}"


def node_cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write(count, start):
    writer = StateSyncWriter(API)
    in_flight = set()
    sent = 0
    deadline = time.monotonic() + 300
    while (sent < count or in_flight) and time.monotonic() < deadline:
        while sent < count and len(in_flight) < 32:
            in_flight.add(writer.send(f"key-{(start + sent) % 1000}", f"value-{start + sent}"))
            sent += 1
        for done in writer.receive(5):
            in_flight.discard(done)
    writer.close()
    if in_flight:
        sys.exit(f"{len(in_flight)} writes unanswered")


def cycles(pid, sequence, count):
    import zmq

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(API)

    def call(command, request_id, body):
        socket.send_multipart([b"\x01" + bytes([command]) + struct.pack(">Q", request_id), body])
        while True:
            if not socket.poll(10_000):
                sys.exit("no answer from the node within 10 s")
            frames = socket.recv_multipart()
            if struct.unpack(">Q", frames[0][2:10])[0] == request_id and frames[0][1] in (0x80, 0x81):
                if frames[0][1] == 0x81:
                    sys.exit(f"refused: {frames[1]!r}")
                return

    # WATCH flags: a cursor follows (bit 0), batched events (bit 3); the cursor: node1 at `sequence`.
    body = string("bench") + bytes([1 | 8]) + varint(1) + string("node1") + varint(sequence)
    request_id = 1
    for measured in (False, True):
        rounds = count if measured else 20
        cpu, wall = node_cpu_s(pid), time.perf_counter()
        for _ in range(rounds):
            call(3, request_id, body)
            call(4, request_id + 1, struct.pack(">Q", request_id))
            request_id += 2
    socket.close()
    context.term()
    return (time.perf_counter() - wall) / count, (node_cpu_s(pid) - cpu) / count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bin", help="directory holding statesyncd (release build)")
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=100_000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="statesync-watch-resume-")
    env = dict(os.environ, STATESYNC_NODE_DATA_DIR=os.path.join(work, "node1"), STATESYNC_NETWORK_API=API,
               STATESYNC_NETWORK_PUBLISH=f"tcp://127.0.0.1:{free_port()}", STATESYNC_NETWORK_PEERS="",
               STATESYNC_HTTP_LISTEN=f"127.0.0.1:{free_port()}", STATESYNC_STORAGE_FSYNC="interval")
    log = open(os.path.join(work, "node1.log"), "w")
    node = subprocess.Popen([os.path.join(args.bin, "statesyncd"), "--config", "Config/node1.yaml"],
                            cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        written = 0
        for size in (args.small, args.large):
            write(size - written, written)
            written = size
            count = 2000 if size <= 10_000 else 200
            wall, cpu = cycles(node.pid, written, count)
            print(f"journal {size:,} deltas: {wall * 1e3:.2f} ms wall, node CPU {cpu * 1e3:.2f} ms "
                  f"per WATCH + UNWATCH ({count} of them)")
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
