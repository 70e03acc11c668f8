#!/usr/bin/env python3
"""How long a node joining a larger cluster through one seed waits before the seed knows it.

Starts a full mesh of nine `statesyncd` (500 ms heartbeats, the default; on 127.0.0.1, ports
between 17000 and 18900), waits until node1 lists all nine alive, then TRIALS times: waits 2-7 s
(drawn from SEED), starts one more node configured with node1 alone as its peer, and times how
long until `statesync members` on node1 lists it alive; stops it and goes on (the list keeps
growing with each joiner that left). Prints each time, then one RESULT line. Everything it
starts is stopped, and its temporary directory removed, when it ends.

    swift build -c release --jobs 2 --product statesync && swift build -c release --jobs 2 --product statesyncd
    python3 Benchmarks/scale/join-through-seed.py .build/release 4 1

A list of more than eight entries rides on every tenth heartbeat and on the three after a change
of it or a new subscriber of the sender's publish socket (docs/PROTOCOL.md 7.5, "Spreading"): the
joiner may ANNOUNCE itself to node1, which does not hear it, only once it heard node1's list.
"""
import subprocess, sys, time, json, random, tempfile, shutil, signal
if len(sys.argv) != 4:
    raise SystemExit('usage: join-through-seed.py BINDIR TRIALS SEED')
bindir, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
work = tempfile.mkdtemp(prefix='statesync-join-')
base = 17000 + rnd.randrange(0, 400) * 2
def cfg(i, peers):
    return f"""node:
  id: node{i}
  data_dir: {work}/node{i}
network:
  publish: tcp://127.0.0.1:{base + i}
  api: tcp://127.0.0.1:{base + 1000 + i}
  peers: [{', '.join(f'tcp://127.0.0.1:{base + p}' for p in peers)}]
  heartbeat_ms: 500
log:
  level: warning
"""
procs = {}
def start(i, peers):
    path = f'{work}/node{i}.yaml'
    open(path, 'w').write(cfg(i, peers))
    procs[i] = subprocess.Popen([f'{bindir}/statesyncd', '--config', path], stdout=subprocess.DEVNULL, stderr=open(f'{work}/node{i}.log', 'w'))
def members():
    out = subprocess.run([f'{bindir}/statesync', 'members', '--json', '--daemon', f'tcp://127.0.0.1:{base + 1001}', '--timeout', '1'], capture_output=True, text=True)
    try: return {m['id']: m['state'] for m in json.loads(out.stdout)}
    except Exception: return {}
try:
    for i in range(1, 10): start(i, [p for p in range(1, 10) if p != i])
    deadline = time.time() + 60
    while time.time() < deadline:
        m = members()
        if sum(1 for s in m.values() if s == 'alive') == 9: break
        time.sleep(0.05)
    else: raise SystemExit('cluster did not settle')
    results = []
    for t in range(trials):
        time.sleep(2 + rnd.random() * 5)
        j = 10 + t
        t0 = time.time(); start(j, [1])
        while time.time() - t0 < 30:
            if members().get(f'node{j}') == 'alive': break
            time.sleep(0.02)
        took = time.time() - t0
        results.append(round(took, 2))
        procs[j].send_signal(signal.SIGTERM); procs[j].wait(timeout=10)
        print(f'joiner node{j}: {took:.2f} s (list {len(members())} entries)', flush=True)
    print('RESULT', bindir, results)
finally:
    for p in procs.values():
        if p.poll() is None: p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try: p.wait(timeout=10)
        except Exception: p.kill()
    shutil.rmtree(work, ignore_errors=True)
