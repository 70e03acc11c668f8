"""Draws docs/scale.svg from the JSON lines of Benchmarks/scale/run.sh: the peer traffic into each
node as the cluster grows (simulator, log-log: it grows with the square of the size), the CPU time
each real node used in its run, and the convergence time after a healed partition (real processes
and the simulator). Standard library only."""
import json
import math
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
out = sys.argv[2]
W, H, M = 960, 300, 56
panels = [
    ("simulator: peer KiB/s into each node", "peer_kib_per_node_per_s", True),
    ("real processes: CPU s per node per run", "cpu_s_per_node", False),
    ("convergence after the heal (ms)", "convergence_ms", False),
]
series = {"real": ("#1f6fb2", "real processes"), "sim": ("#d0611c", "simulator")}
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>']
pw = (W - (len(panels) + 1) * M) / len(panels)
for p, (title, key, logy) in enumerate(panels):
    x0, y0, ph = M + p * (pw + M), 30, H - 30 - M
    points = [(r["nodes"], r[key]) for r in rows if r.get(key) is not None]
    if not points:
        continue
    xs = [math.log2(n) for n, _ in points]
    ys = [math.log10(max(v, 1)) if logy else v for _, v in points]
    xmin, xmax = min(xs), max(xs)
    ymin, ymax = (min(ys), max(ys)) if logy else (0, max(ys) * 1.1 or 1)
    if ymax == ymin:
        ymax = ymin + 1
    def sx(n):
        return x0 + (math.log2(n) - xmin) / (xmax - xmin or 1) * pw
    def sy(v):
        t = math.log10(max(v, 1)) if logy else v
        return y0 + ph - (t - ymin) / (ymax - ymin) * ph
    svg.append(f'<text x="{x0}" y="{y0 - 10}" font-weight="bold">{title}</text>')
    svg.append(f'<line x1="{x0}" y1="{y0 + ph}" x2="{x0 + pw}" y2="{y0 + ph}" stroke="black"/>')
    svg.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + ph}" stroke="black"/>')
    for n in sorted({n for n, _ in points}):
        svg.append(f'<text x="{sx(n):.1f}" y="{y0 + ph + 14}" text-anchor="middle">{n}</text>')
    svg.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 30}" text-anchor="middle">nodes</text>')
    values = sorted({v for _, v in points})
    for v in (values if len(values) <= 6 else values[:: max(1, len(values) // 5)]):
        svg.append(f'<text x="{x0 - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for kind, (color, label) in series.items():
        pts = sorted((r["nodes"], r[key]) for r in rows if r["kind"] == kind and r.get(key) is not None)
        if not pts:
            continue
        path = " ".join(f"{sx(n):.1f},{sy(v):.1f}" for n, v in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for n, v in pts:
            svg.append(f'<circle cx="{sx(n):.1f}" cy="{sy(v):.1f}" r="3" fill="{color}"/>')
for i, (kind, (color, label)) in enumerate(series.items()):
    svg.append(f'<rect x="{M + i * 140}" y="{H - 14}" width="10" height="10" fill="{color}"/>')
    svg.append(f'<text x="{M + i * 140 + 14}" y="{H - 5}">{label}</text>')
svg.append("</svg>")
open(out, "w").write("\n".join(svg) + "\n")
