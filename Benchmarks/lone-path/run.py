#!/usr/bin/env python3
"""Runs the two node processes of `statesync bench`'s latency phase (writer and reader, loopback),
with the probe's marks on (LAT_TRACE=1), at a fixed rate of timestamped sets; prints the reader's
result line. The marks land in /tmp/lat-writer.txt and /tmp/lat-reader.txt (timeline.py reads them).

usage: run.py STATESYNC_BINARY [RATE=1000] [FSYNC=always|interval] [SECONDS=3]
(STATESYNC_BINARY: a release build with probe.patch applied.)"""
import os, shutil, socket, subprocess, sys, tempfile

binary = sys.argv[1]
rate = sys.argv[2] if len(sys.argv) > 2 else "1000"
fsync = sys.argv[3] if len(sys.argv) > 3 else "always"
seconds = sys.argv[4] if len(sys.argv) > 4 else "3"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


work = tempfile.mkdtemp(prefix="statesync-lone-")
ports = [free_port(), free_port()]
env = dict(os.environ, LAT_TRACE="1")


def start(role, me):
    return subprocess.Popen(
        [binary, "bench-node", "--role", role, "--mode", "latency", "--id", role,
         "--publish", f"tcp://127.0.0.1:{ports[me]}", "--peer", f"tcp://127.0.0.1:{ports[1 - me]}",
         "--data", f"{work}/{role}", "--seconds", seconds, "--rate", rate, "--fsync", fsync],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


reader, writer = start("reader", 0), start("writer", 1)
try:
    if reader.stdout.readline().strip() != "READY" or writer.stdout.readline().strip() != "READY":
        sys.exit("a node process did not start")
    writer.stdin.write("GO\n")
    writer.stdin.flush()
    print(reader.stdout.readline().strip())
    writer.stdout.readline()
    writer.stdin.write("STOP\n")
    writer.stdin.flush()
    reader.wait(timeout=60)
    writer.wait(timeout=60)
finally:
    for process in (reader, writer):
        if process.poll() is None:
            process.kill()
    shutil.rmtree(work, ignore_errors=True)
