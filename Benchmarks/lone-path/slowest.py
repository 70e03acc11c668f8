#!/usr/bin/env python3
"""Reads the marks run.py's processes left (`storage.fsync: always`) and prints the four slowest
writes after the first tenth of the run, each with its steps that took over 200 µs, then every
mark of both processes around the slowest one whose message waited over 1 ms on the wire
(relative to its `zmq_send`). Steps as in timeline.py; a chain may take up to 100 ms here."""
from marks import READER_MARKS, WRITER_MARKS, chains, load

STEPS = [
    ("w", 2, "queued"), ("w", 3, "the I/O thread wakes"), ("w", 13, "taken"), ("w", 16, "log written"),
    ("w", 4, "fdatasync begins"), ("w", 5, "fdatasync"), ("w", 17, "machine step"), ("w", 6, "zmq_send"),
    ("r", 3, "wire (reader wakes)"), ("r", 10, "received"), ("r", 18, "reader step"), ("r", 8, "model"),
    ("r", 9, "observer queue wakes"), ("r", 12, "observer"),
]
WIRE = 8  # index of the wire step

writer, reader = load(WRITER_MARKS), load(READER_MARKS)
slowest = [(sum(row), t0, row) for t0, row in chains(writer, reader, STEPS, within_ns=100_000_000)]
slowest.sort(reverse=True)
start = writer[1][0]
for total, t0, row in slowest[:4]:
    slow = [(STEPS[i][2], round(step / 1000)) for i, step in enumerate(row) if step > 200_000]
    print(f"{total / 1000:.0f} µs, set at +{(t0 - start) / 1e6:.0f} ms; steps over 200 µs: {slow}")
held = next(((t0, row) for _, t0, row in slowest if row[WIRE] > 1_000_000), None)
if held:
    t0, row = held
    sent = t0 + sum(row[:WIRE])
    woke = sent + row[WIRE]
    around = [(t, "w", k) for k, v in writer.items() for t in v if sent - 200_000 <= t <= woke + 400_000]
    around += [(t, "r", k) for k, v in reader.items() for t in v if sent - 300_000 <= t <= woke + 400_000]
    print("marks around the slowest message on the wire (µs from its zmq_send; kinds as in probe.patch):")
    for t, side, kind in sorted(around):
        print(f"  {(t - sent) / 1000:9.1f} {side}{kind}")
