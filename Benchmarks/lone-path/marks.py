"""The probe's marks, as run.py's processes leave them, and a write's way through them: shared by
timeline.py and slowest.py."""
import bisect

WRITER_MARKS = "/tmp/lat-writer.txt"
READER_MARKS = "/tmp/lat-reader.txt"


def load(path):
    """{kind: sorted times in ns} of one process's marks."""
    marks = {}
    for line in open(path):
        kind, at = line.split()
        marks.setdefault(int(kind), []).append(int(at))
    for times in marks.values():
        times.sort()
    return marks


def chains(writer, reader, steps, within_ns):
    """For each write after the first tenth of the run: (set time, [each step's duration]), where a
    step runs from the previous mark to the first mark of its kind (`steps`: (side "w"/"r", kind,
    ...)) after it. A write whose chain does not end within `within_ns` of its set is left out."""
    found = []
    starts = writer[1]
    for t0 in starts[len(starts) // 10:]:
        t, row = t0, []
        for side, kind, *_ in steps:
            times = (writer if side == "w" else reader).get(kind, [])
            i = bisect.bisect_left(times, t)
            if i == len(times) or times[i] - t0 > within_ns:
                break
            row.append(times[i] - t)
            t = times[i]
        else:
            found.append((t0, row))
    return found
