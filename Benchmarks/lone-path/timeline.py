#!/usr/bin/env python3
"""usage: timeline.py [always|interval]: the `storage.fsync` run.py ran with (default always).

Reads the marks run.py's processes left and prints, for the writes after the first tenth, the
p50 and p90 of each step of a set's way to the remote observer (each step: from the previous mark
to the first mark of its kind after it; a write whose chain is not complete within 5 ms is left out)."""
import sys

from marks import READER_MARKS, WRITER_MARKS, chains, load

writer, reader = load(WRITER_MARKS), load(READER_MARKS)
# With `interval` the node's own timer syncs now and then: not a step of any write.
interval = len(sys.argv) > 1 and sys.argv[1] == "interval"
steps = [
    ("w", 2, "writer: set → queued for the I/O thread"),
    ("w", 3, "writer: I/O thread woken (poll returns)"),
    ("w", 13, "writer: takes the write from the outbox"),
    ("w", 16, "writer: log record built and written (pwrite)"),
] + ([] if interval else [
    ("w", 4, "writer: fdatasync begins"),
    ("w", 5, "writer: fdatasync returns"),
    ("w", 17, "writer: the machine's step for the durable write"),
]) + [
    ("w", 6, "writer: DELTA handed to libzmq (zmq_send returns)" if interval else "writer: zmq_send returns"),
    ("r", 3, "wire: reader's I/O thread woken (poll returns)"),
    ("r", 10, "reader: message received (zmq_msg_recv)"),
    ("r", 18, "reader: machine step (decode, merge, history, log record)"),
    ("r", 8, "reader: applied to the live model, notification queued"),
    ("r", 9, "reader: observer queue's thread woken"),
    ("r", 12, "reader: observer runs"),
]
rows = [row for _, row in chains(writer, reader, steps, within_ns=5_000_000)]

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] / 1000


print(f"{len(rows)} writes ({'fsync: interval' if interval else 'fsync: always'})")
for index, (_, _, name) in enumerate(steps):
    column = [row[index] for row in rows]
    print(f"  {name:68s} p50 {pct(column, 0.5):7.1f} µs   p90 {pct(column, 0.9):7.1f}")
total = [sum(row) for row in rows]
print(f"  {'set → observer':68s} p50 {pct(total, 0.5):7.1f} µs   p90 {pct(total, 0.9):7.1f}")
