#!/usr/bin/env python3
"""StateSync side by side with Redis and NATS JetStream KV, one workload, one sitting.

The workload (issue #17): three nodes of each system on this host; one writer on node 1 keeps 32
writes in flight (a new one as soon as one is acknowledged) over 1,000 keys with 64-octet
values; one watcher on node 3 records every change it is told of, with the old value when the
system gives one. Every value carries its write's sequence number and the writer's
CLOCK_MONOTONIC send time, so the watcher measures set -> watch event latency and which writes it
never saw, and checks an old value against the key's previous write.

Every system is driven by the same loop in Python over its own wire protocol (ZeroMQ client API,
RESP, the NATS text protocol), so no client library's batching or threading favours one of them.

    python3 Benchmarks/peers/peers.py run --bin .build/release [--writes 100000] [--out FILE]

`run` starts and stops every server itself, in a fresh temporary directory; Benchmarks/peers/run.sh
installs what is missing and builds StateSync first. The `write` and `watch` subcommands are the
two client processes `run` starts (each on its own core's worth of Python).
"""

import argparse
import json
import os
import resource
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

KEYS = 1000
VALUE_BYTES = 64
WINDOW = 32


def value_for(seq, sent_ns):
    """64 ASCII octets: the write's sequence number, its send time, padding."""
    text = f"{seq:012d}:{sent_ns:020d}:"
    return (text + "x" * VALUE_BYTES)[:VALUE_BYTES]


def parse_value(text):
    """(seq, sent_ns) of a value written by value_for, or None."""
    if not isinstance(text, str) or len(text) < 34 or text[12] != ":":
        return None
    try:
        return int(text[:12]), int(text[13:33])
    except ValueError:
        return None


def key_for(seq):
    return f"k{seq % KEYS:04d}"


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


# --------------------------------------------------------------------------------------------
# StateSync client API (docs/PROTOCOL.md section 10): a DEALER, two frames per message.


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def string(text):
    data = text.encode()
    return varint(len(data)) + data


def statesync_set_body(channel, model, prop, text):
    # SET body (10.3): channel, model, property count, (name, property value: tag 05 string).
    return string(channel) + string(model) + varint(1) + string(prop) + b"\x05" + string(text)


class StateSyncWriter:
    def __init__(self, endpoint):
        import zmq

        self.zmq = zmq
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.next_id = 1

    def send(self, key, text):
        request_id = self.next_id
        self.next_id += 1
        # Version, SET, request id, flags: batched replies (10.1.1), as StateSyncClient asks.
        header = b"\x01\x01" + struct.pack(">Q", request_id) + b"\x01"
        self.socket.send_multipart([header, statesync_set_body("bench", key, "value", text)])
        return request_id

    def receive(self, timeout_s):
        """Request ids of the replies that arrived (an ERROR raises)."""
        if not self.socket.poll(int(timeout_s * 1000)):
            return []
        done = []
        while True:
            try:
                frames = self.socket.recv_multipart(self.zmq.NOBLOCK)
            except self.zmq.Again:
                return done
            header = frames[0]
            if header[1] == 0x81:
                raise RuntimeError(f"SET refused: {frames[1]!r}")
            if header[1] == 0x80:  # a node older than OKS messages: one OK per request
                done.append(struct.unpack(">Q", header[2:10])[0])
            elif header[1] == 0x83:  # OKS: count, then each request id and its OK body (a blob)
                done += oks_request_ids(frames[1])

    def close(self):
        self.socket.close()
        self.context.term()


def oks_request_ids(body):
    """The request ids an OKS message answers (PROTOCOL.md 10.1.1)."""
    count, at = read_varint(body, 0)
    ids = []
    for _ in range(count):
        ids.append(struct.unpack_from(">Q", body, at)[0])
        length, at = read_varint(body, at + 8)
        at += length
    return ids


def read_varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fill(sock, buffer, timeout_s, name):
    """Appends what `sock` has to `buffer` (waiting up to timeout_s); False when nothing came."""
    ready, _, _ = select.select([sock], [], [], timeout_s)
    if not ready:
        return False
    data = sock.recv(1 << 20)
    if not data:
        raise RuntimeError(f"{name} closed the connection")
    buffer += data
    return True


# --------------------------------------------------------------------------------------------
# Redis: RESP over a plain socket.


def resp_command(*parts):
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RespReader:
    """Parses RESP replies out of a byte stream."""

    def __init__(self, sock):
        self.sock = sock
        self.buffer = bytearray()

    def fill(self, timeout_s):
        return fill(self.sock, self.buffer, timeout_s, "redis")

    def incomplete(self):
        """Whether the buffer lacks a whole reply (empty, or one cut off mid-way)."""
        return not self.buffer or self.parse() is None

    def parse(self, at=0):
        """(reply, next offset) or None when the buffer does not hold a whole reply yet."""
        end = self.buffer.find(b"\r\n", at)
        if end < 0:
            return None
        kind, line = self.buffer[at : at + 1], bytes(self.buffer[at + 1 : end])
        if kind in (b"+", b":"):
            return line.decode(), end + 2
        if kind == b"-":
            raise RuntimeError(f"redis: {line.decode()}")
        if kind == b"$":
            length = int(line)
            if length < 0:
                return None, end + 2
            if len(self.buffer) < end + 2 + length + 2:
                return None
            return bytes(self.buffer[end + 2 : end + 2 + length]).decode(), end + 2 + length + 2
        if kind == b"*":
            items, offset = [], end + 2
            for _ in range(int(line)):
                parsed = self.parse(offset)
                if parsed is None:
                    return None
                items.append(parsed[0])
                offset = parsed[1]
            return items, offset
        raise RuntimeError(f"redis: unexpected reply {bytes(self.buffer[at:at+20])!r}")

    def replies(self):
        out = []
        while self.buffer:
            parsed = self.parse()
            if parsed is None:
                break
            out.append(parsed[0])
            del self.buffer[: parsed[1]]
        return out

    def call(self, *parts, timeout_s=5):
        self.sock.sendall(resp_command(*parts))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.replies()
            if got:
                return got[0]
            self.fill(0.1)
        raise RuntimeError(f"redis: no reply to {parts[0]}")


def redis_connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class RedisWriter:
    def __init__(self, port):
        self.reader = RespReader(redis_connect(port))
        self.outstanding = []

    def send(self, key, text):
        self.reader.sock.sendall(resp_command("SET", key, text))
        self.outstanding.append(key)
        return key

    def receive(self, timeout_s):
        if self.reader.incomplete():
            self.reader.fill(timeout_s)
        done = []
        for reply in self.reader.replies():
            if reply != "OK":
                raise RuntimeError(f"SET: {reply}")
            done.append(self.outstanding.pop(0))
        return done

    def close(self):
        self.reader.sock.close()


# --------------------------------------------------------------------------------------------
# NATS: the text protocol over a plain socket; a KV put is a PUB to $KV.<bucket>.<key> with a
# reply subject, acknowledged by JetStream's PubAck.


class NatsConnection:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n')
        self.inbox = f"_INBOX.{os.getpid()}"
        self.sock.sendall(f"SUB {self.inbox}.* 1\r\n".encode())
        self.next_id = 1

    def fill(self, timeout_s):
        return fill(self.sock, self.buffer, timeout_s, "nats")

    def messages(self):
        """(subject, payload) of every whole MSG/HMSG in the buffer; answers PING."""
        out = []
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return out
            line = bytes(self.buffer[:end]).decode()
            if line.startswith("MSG ") or line.startswith("HMSG "):
                parts = line.split(" ")
                total = int(parts[-1])
                headers = int(parts[-2]) if parts[0] == "HMSG" else 0
                if len(self.buffer) < end + 2 + total + 2:
                    return out
                payload = bytes(self.buffer[end + 2 + headers : end + 2 + total])
                del self.buffer[: end + 2 + total + 2]
                out.append((parts[1], payload))
            else:
                del self.buffer[: end + 2]
                if line == "PING":
                    self.sock.sendall(b"PONG\r\n")
                elif line.startswith("-ERR"):
                    raise RuntimeError(f"nats: {line}")

    def publish(self, subject, payload, reply=None):
        data = payload if isinstance(payload, bytes) else payload.encode()
        head = f"PUB {subject} {reply} {len(data)}\r\n" if reply else f"PUB {subject} {len(data)}\r\n"
        self.sock.sendall(head.encode() + data + b"\r\n")

    def request(self, subject, payload, timeout_s=5):
        reply = f"{self.inbox}.r{self.next_id}"
        self.next_id += 1
        self.publish(subject, payload, reply)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for got_subject, data in self.messages():
                if got_subject == reply:
                    return json.loads(data)
            self.fill(0.1)
        raise RuntimeError(f"nats: no reply to {subject}")


class NatsWriter:
    def __init__(self, port):
        self.connection = NatsConnection(port)

    def send(self, key, text):
        request_id = self.connection.next_id
        self.connection.next_id += 1
        self.connection.publish(f"$KV.bench.{key}", text, f"{self.connection.inbox}.{request_id}")
        return request_id

    def receive(self, timeout_s):
        found = self.connection.messages()
        if not found:
            self.connection.fill(timeout_s)
            found = self.connection.messages()
        done = []
        for subject, data in found:
            ack = json.loads(data)
            if "error" in ack:
                raise RuntimeError(f"KV put: {ack['error']}")
            done.append(int(subject.rsplit(".", 1)[1]))
        return done

    def close(self):
        self.connection.sock.close()


# --------------------------------------------------------------------------------------------
# The writer: WINDOW writes in flight, each value naming its write.


def run_writer(args):
    if args.system == "statesync":
        writer = StateSyncWriter(args.endpoint)
    elif args.system == "redis":
        writer = RedisWriter(int(args.endpoint))
    else:
        writer = NatsWriter(int(args.endpoint))
    sent_at, latencies = {}, []
    seq, acked = 0, 0
    # With --rate, write number seq is not sent before seq / rate seconds after the start (the
    # window still bounds what is in flight): a load below what the machine can take.
    rate = args.rate or 0
    print("ready", flush=True)
    start = time.monotonic_ns()
    deadline = time.monotonic() + args.limit_s
    while acked < args.writes:
        while seq < args.writes and len(sent_at) < WINDOW:
            now = time.monotonic_ns()
            if rate and seq > (now - start) / 1e9 * rate:
                break
            sent_at[writer.send(key_for(seq), value_for(seq, now))] = (now, seq)
            seq += 1
        timeout = 1.0
        if rate and seq < args.writes and len(sent_at) < WINDOW:
            # Until the next write is due (at least 1 ms: a zero poll would spin).
            timeout = min(1.0, max(0.001, seq / rate - (time.monotonic_ns() - start) / 1e9))
        for request in writer.receive(timeout):
            latencies.append(time.monotonic_ns() - sent_at.pop(request)[0])
            acked += 1
        if time.monotonic() > deadline:
            break
    elapsed = (time.monotonic_ns() - start) / 1e9
    writer.close()
    used = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "acked": acked,
                "sent": seq,
                # Writes sent but not acknowledged when the writer stopped (at its time limit).
                "unacknowledged": sorted(s for _, s in sent_at.values()),
                "elapsed_s": round(elapsed, 3),
                "acks_per_s": round(acked / elapsed),
                "ack_p50_us": round(percentile(latencies, 0.5) / 1000),
                "ack_p99_us": round(percentile(latencies, 0.99) / 1000),
                "writer_cpu_s": round(used.ru_utime + used.ru_stime, 2),
            }
        ),
        flush=True,
    )


# --------------------------------------------------------------------------------------------
# The watcher: every change it is told of; ends once it saw each key's last write, or stdin says
# the writer is done and nothing arrived for args.quiet_s.


class Watch:
    def __init__(self, writes):
        self.writes = writes
        self.last_seq_of_key = {key_for(s): s for s in range(max(0, writes - KEYS), writes)}
        self.seen = set()
        self.latencies = []
        self.events = 0
        self.old_checked = 0
        self.old_exact = 0
        self.first_ns = None
        self.last_ns = None
        self.finals_seen = 0

    def record(self, key, new, old, old_given, now_ns):
        parsed = parse_value(new)
        if parsed is None:
            return
        seq, sent_ns = parsed
        self.events += 1
        self.first_ns = self.first_ns or now_ns
        self.last_ns = now_ns
        self.latencies.append(now_ns - sent_ns)
        if seq not in self.seen:
            self.seen.add(seq)
            if self.last_seq_of_key.get(key) == seq:
                self.finals_seen += 1
        if old_given:
            # The previous write of this key is seq - KEYS (none for the first).
            previous = parse_value(old)
            self.old_checked += 1
            if (seq < KEYS and old is None) or (previous is not None and previous[0] == seq - KEYS):
                self.old_exact += 1

    def complete(self):
        return self.finals_seen >= min(KEYS, self.writes)

    def report(self, sent, unacknowledged):
        """`sent` writes were made (sequence numbers 0..sent-1), all acknowledged but those listed."""
        span = ((self.last_ns or 0) - (self.first_ns or 0)) / 1e9
        unacknowledged = set(unacknowledged)
        acked = sent - len(unacknowledged)
        seen_of_acked = len([s for s in self.seen if s < sent and s not in unacknowledged])
        return {
            "events": self.events,
            "distinct_writes_seen": len(self.seen),
            "changes_per_s": round(len(self.seen) / span) if span > 0 else None,
            "watch_p50_us": round(percentile(self.latencies, 0.5) / 1000) if self.latencies else None,
            "watch_p99_us": round(percentile(self.latencies, 0.99) / 1000) if self.latencies else None,
            "missed": acked - seen_of_acked,
            "old_values_given": self.old_checked,
            "old_values_exact": self.old_exact,
        }


def run_watcher(args):
    # SIGTERM (the orchestrator ending a failed run) still stops the `statesync watch` child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    watch = Watch(args.writes)
    stdin_done = None  # what the writer wrote (sent, unacknowledged), once the orchestrator says
    if args.system == "statesync":
        child = subprocess.Popen(
            [args.statesync, "watch", "bench", "--json", "--no-initial", "--daemon", args.endpoint],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # `watch` says "watching" on stderr once the node took the watch.
        line = child.stderr.readline().decode()
        if "watching" not in line:
            child.kill()
            child.wait()
            raise RuntimeError(f"statesync watch: {line.strip()}")
        source = child.stdout.fileno()
        pending = bytearray()

        def poll(timeout_s):
            nonlocal pending
            ready, _, _ = select.select([source], [], [], timeout_s)
            if not ready:
                return
            data = os.read(source, 1 << 20)
            if not data:
                raise RuntimeError("statesync watch ended")
            pending += data
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            now = time.monotonic_ns()
            for raw in lines:
                event = json.loads(raw)
                if "model" in event:
                    watch.record(event["model"], event["new"], event["old"], True, now)

        def close():
            child.terminate()
            child.wait(5)

    elif args.system == "redis":
        port = int(args.endpoint)
        getter = RespReader(redis_connect(port))
        getter.call("CONFIG", "SET", "notify-keyspace-events", "K$")
        events = RespReader(redis_connect(port))
        events.sock.sendall(resp_command("PSUBSCRIBE", "__keyspace@0__:k*"))
        while not [r for r in events.replies() if isinstance(r, list) and r[0] == "psubscribe"]:
            events.fill(1.0)

        def poll(timeout_s):
            # A keyspace event names the key, not the value: read it with GET (pipelined for every
            # event that arrived together). A later write can come first; nothing gives the old one.
            if events.incomplete():  # nothing, or a message cut off mid-way: read more
                events.fill(timeout_s)
            keys = [r[2].split(":", 1)[1] for r in events.replies() if isinstance(r, list) and r[0] == "pmessage"]
            if not keys:
                return
            getter.sock.sendall(b"".join(resp_command("GET", k) for k in keys))
            values = []
            while len(values) < len(keys):
                values += getter.replies()
                if len(values) < len(keys):
                    getter.fill(1.0)
            now = time.monotonic_ns()
            for key, value in zip(keys, values):
                watch.record(key, value, None, False, now)

        def close():
            getter.sock.close()
            events.sock.close()

    else:
        connection = NatsConnection(int(args.endpoint))
        deliver = f"watch.{os.getpid()}"
        connection.sock.sendall(f"SUB {deliver} 2\r\n".encode())
        created = connection.request(
            "$JS.API.CONSUMER.CREATE.KV_bench",
            json.dumps(
                {
                    "stream_name": "KV_bench",
                    "config": {
                        "deliver_subject": deliver,
                        "deliver_policy": "new",
                        "ack_policy": "none",
                        "replay_policy": "instant",
                        "filter_subject": "$KV.bench.>",
                        "mem_storage": True,
                        "num_replicas": 1,
                    },
                }
            ),
        )
        if "error" in created:
            raise RuntimeError(f"KV watch: {created['error']}")

        def poll(timeout_s):
            found = connection.messages()
            if not found:
                connection.fill(timeout_s)
                found = connection.messages()
            now = time.monotonic_ns()
            for subject, data in found:
                # A push consumer delivers each entry under its stream subject ($KV.bench.KEY) to
                # the deliver subscription. A KV watch entry holds the new value only.
                if subject.startswith("$KV.bench."):
                    watch.record(subject[len("$KV.bench.") :], data.decode(), None, False, now)

        def close():
            connection.sock.close()

    print("ready", flush=True)
    quiet_since = time.monotonic()
    hard_deadline = None
    try:
        while not watch.complete():
            before = watch.events
            poll(0.05)
            if watch.events != before:
                quiet_since = time.monotonic()
            if stdin_done is None and select.select([sys.stdin], [], [], 0)[0]:
                stdin_done = json.loads(sys.stdin.readline())
                hard_deadline = time.monotonic() + args.limit_s
            if stdin_done is not None and (
                time.monotonic() - quiet_since > args.quiet_s or time.monotonic() > hard_deadline
            ):
                break
        if stdin_done is None:
            stdin_done = json.loads(sys.stdin.readline())
    finally:
        close()
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    report = watch.report(stdin_done["sent"], stdin_done["unacknowledged"])
    report["watcher_cpu_s"] = round(sum(u.ru_utime + u.ru_stime for u in used), 2)
    # Of which its children (StateSync's `statesync watch`; none for the others).
    report["watcher_children_cpu_s"] = round(used[1].ru_utime + used[1].ru_stime, 2)
    print(json.dumps(report), flush=True)


# --------------------------------------------------------------------------------------------
# Clusters


def wait_for(check, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as error:  # a server still starting refuses connections
            last = error
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}" + (f" ({last})" if last else ""))


class Cluster:
    def __init__(self, work):
        self.work = work
        self.processes = []

    def spawn(self, name, argv, env=None):
        log = open(os.path.join(self.work, f"{name}.log"), "wb")
        self.processes.append(
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        )

    def cpu_s(self):
        """User + system CPU seconds each server used so far, in the order they were started."""
        ticks = os.sysconf("SC_CLK_TCK")
        used = []
        for process in self.processes:
            with open(f"/proc/{process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            used.append((int(fields[11]) + int(fields[12])) / ticks)
        return used

    def stop(self):
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_statesync(cluster, args, fsync, publish=None):
    for i in (1, 2, 3):
        env = dict(os.environ)
        env.update(
            {
                "STATESYNC_NODE_DATA_DIR": os.path.join(cluster.work, f"node{i}"),
                "STATESYNC_STORAGE_FSYNC": fsync,
                "STATESYNC_LOG_LEVEL": "warning",
            }
        )
        if publish:
            env["STATESYNC_STORAGE_PUBLISH"] = publish
        cluster.spawn(f"node{i}", [os.path.join(args.bin, "statesyncd"), "--config", f"Config/node{i}.yaml"], env)
    statesync = os.path.join(args.bin, "statesync")
    for i in (1, 2, 3):
        wait_for(
            lambda: subprocess.run(
                [statesync, "status", "--ready", "--daemon", f"tcp://127.0.0.1:710{i}", "--timeout", "0.5"],
                capture_output=True,
            ).returncode
            == 0,
            f"statesync node{i} ready",
        )
    return "tcp://127.0.0.1:7101", "tcp://127.0.0.1:7103"


REDIS_PORTS = (16391, 16392, 16393)


def start_redis(cluster, args, appendfsync):
    server = shutil.which("redis-server")
    for i, port in enumerate(REDIS_PORTS, 1):
        directory = os.path.join(cluster.work, f"redis{i}")
        os.makedirs(directory)
        argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", ""]
        argv += ["--appendonly", "yes", "--appendfsync", appendfsync, "--daemonize", "no"]
        if i > 1:
            argv += ["--replicaof", "127.0.0.1", str(REDIS_PORTS[0])]
        cluster.spawn(f"redis{i}", argv)

    def replicas_up():
        reader = RespReader(redis_connect(REDIS_PORTS[0]))
        try:
            return reader.call("INFO", "replication").count("state=online") == 2
        finally:
            reader.sock.close()

    wait_for(replicas_up, "both redis replicas online")
    return str(REDIS_PORTS[0]), str(REDIS_PORTS[2])


NATS_PORTS = (14231, 14232, 14233)
NATS_ROUTES = (16231, 16232, 16233)


def start_nats(cluster, args):
    server = shutil.which("nats-server")
    routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in NATS_ROUTES)
    for i in (1, 2, 3):
        directory = os.path.join(cluster.work, f"nats{i}")
        os.makedirs(directory)
        config = os.path.join(directory, "nats.conf")
        with open(config, "w") as f:
            f.write(
                f"server_name: n{i}\nlisten: 127.0.0.1:{NATS_PORTS[i-1]}\n"
                f'jetstream {{ store_dir: "{directory}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{NATS_ROUTES[i-1]}, routes: [{routes}] }}\n"
            )
        cluster.spawn(f"nats{i}", [server, "-c", config])
    stream = {
        "name": "KV_bench",
        "subjects": ["$KV.bench.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": 1,
        "max_msg_size": -1,
        "discard": "new",
        "storage": "file",
        "num_replicas": 3,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "allow_direct": True,
        "duplicate_window": 120_000_000_000,
    }

    def bucket_created():
        connection = NatsConnection(NATS_PORTS[0])
        try:
            reply = connection.request("$JS.API.STREAM.CREATE.KV_bench", json.dumps(stream), timeout_s=2)
        finally:
            connection.sock.close()
        return "error" not in reply

    wait_for(bucket_created, "the NATS cluster to elect its JetStream leader and create the KV bucket", 60)
    return str(NATS_PORTS[0]), str(NATS_PORTS[2])


SYSTEMS = {
    "statesync-always": ("statesync", lambda c, a: start_statesync(c, a, "always"), "fsync: always"),
    "statesync-interval": ("statesync", lambda c, a: start_statesync(c, a, "interval"), "fsync: interval (50 ms)"),
    "statesync-written": (
        "statesync",
        lambda c, a: start_statesync(c, a, "always", "written"),
        "fsync: always, publish: written",
    ),
    "redis-always": ("redis", lambda c, a: start_redis(c, a, "always"), "appendfsync always, 2 replicas"),
    "redis-everysec": ("redis", lambda c, a: start_redis(c, a, "everysec"), "appendfsync everysec, 2 replicas"),
    "nats-kv": ("nats", start_nats, "JetStream KV, R3, file storage"),
}


def run_one(name, args):
    protocol, start, setting = SYSTEMS[name]
    work = tempfile.mkdtemp(prefix=f"statesync-peers-{name}-")
    cluster = Cluster(work)
    me = os.path.abspath(__file__)
    clients = []
    try:
        writer_endpoint, watcher_endpoint = start(cluster, args)
        common = ["--system", protocol, "--writes", str(args.writes), "--limit-s", str(args.limit_s)]
        common += ["--rate", str(args.rate)]
        watcher = subprocess.Popen(
            [sys.executable, me, "watch", "--endpoint", watcher_endpoint, "--statesync",
             os.path.join(args.bin, "statesync"), "--quiet-s", str(args.quiet_s)] + common,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        clients.append(watcher)
        if watcher.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name}: the watcher did not start")
        cpu_before = cluster.cpu_s()
        writer = subprocess.Popen(
            [sys.executable, me, "write", "--endpoint", writer_endpoint] + common, stdout=subprocess.PIPE, text=True
        )
        clients.append(writer)
        if writer.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name}: the writer did not start")
        wrote = json.loads(writer.stdout.readline())
        writer.wait(10)
        watcher.stdin.write(json.dumps({"sent": wrote["sent"], "unacknowledged": wrote["unacknowledged"]}) + "\n")
        watcher.stdin.flush()
        watched = json.loads(watcher.stdout.readline())
        by_server = [after - before for before, after in zip(cpu_before, cluster.cpu_s())]
        watcher.wait(10)
        per_write = 1e6 / max(1, wrote["acked"])
        return {
            "system": name, "setting": setting, "writes": args.writes, **wrote, **watched,
            "servers_cpu_us_per_write": round(sum(by_server) * per_write),
            # The writer and the watcher (with its children: `statesync watch`), per write.
            "clients_cpu_us_per_write": round((wrote["writer_cpu_s"] + watched["watcher_cpu_s"]) * per_write),
            # What `statesync watch` (the watcher's child) cost of that, per write.
            "watch_command_cpu_us_per_write": round(watched["watcher_children_cpu_s"] * per_write, 1),
            # Node 1 takes the writes, node 3 serves the watcher.
            "servers_cpu_us_per_write_by_node": [round(cpu * per_write, 1) for cpu in by_server],
        }
    finally:
        for client in clients:  # a run that failed half-way: its clients go too
            if client.poll() is None:
                client.terminate()
                try:
                    client.wait(5)
                except subprocess.TimeoutExpired:
                    client.kill()
                    client.wait()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def table(results, title):
    def ms(us):
        return "–" if us is None else f"{us / 1000:.1f} ms"

    rows = [
        title,
        "",
        "| system | setting | acks/s | ack p50 / p99 | changes/s seen | set → watch p50 | p99 | missed | old value "
        "| server CPU per write | client CPU per write |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['system']} | {r['setting']} | failed: {r['error']} |")
            continue
        old = (
            f"yes, {r['old_values_exact']}/{r['old_values_given']} exact"
            if r["old_values_given"]
            else "no"
        )
        rows.append(
            f"| {r['system']} | {r['setting']} | {r['acks_per_s']:,} | {ms(r['ack_p50_us'])} / "
            f"{ms(r['ack_p99_us'])} | {r['changes_per_s'] or 0:,} | {ms(r['watch_p50_us'])} | "
            f"{ms(r['watch_p99_us'])} | {r['missed']:,} | {old} | {r['servers_cpu_us_per_write']} µs | "
            f"{r['clients_cpu_us_per_write']} µs |"
        )
    return "\n".join(rows)


def run(args):
    # SIGTERM ends the run like an error: every server and client it started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    for name in args.systems.split(","):
        if name not in SYSTEMS:
            sys.exit(f"peers: unknown system '{name}' (known: {', '.join(SYSTEMS)})")
    for name in args.systems.split(","):
        print(f"==> {name}", file=sys.stderr, flush=True)
        try:
            result = run_one(name, args)
        except Exception as error:  # one system failing does not hide the others' figures
            print(f"peers: {name} failed: {error}", file=sys.stderr, flush=True)
            result = {"system": name, "setting": SYSTEMS[name][2], "error": str(error)}
        print(json.dumps(result), file=sys.stderr, flush=True)
        results.append(result)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    load = os.getloadavg()
    title = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load before the last "
        f"run {load[0]:.2f}; {args.writes:,} writes of {VALUE_BYTES} B over {KEYS:,} keys, {WINDOW} in flight, "
        "3 nodes each, writer on node 1, watcher on node 3:"
    )
    print(table(results, title))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run every system's cluster, writer and watcher; print the table")
    r.add_argument("--bin", required=True, help="directory holding statesyncd and statesync (release build)")
    r.add_argument("--systems", default=",".join(SYSTEMS))
    r.add_argument("--writes", type=int, default=100_000)
    r.add_argument("--rate", type=int, default=0, help="writes a second at most (0: as fast as acks come)")
    r.add_argument("--limit-s", type=float, default=120)
    r.add_argument("--quiet-s", type=float, default=3)
    r.add_argument("--out", help="append one JSON line per system to this file")
    r.add_argument("--keep", action="store_true", help="keep the servers' directories and logs")
    for name in ("write", "watch"):
        p = sub.add_parser(name)
        p.add_argument("--system", choices=("statesync", "redis", "nats"), required=True)
        p.add_argument("--endpoint", required=True)
        p.add_argument("--writes", type=int, required=True)
        p.add_argument("--rate", type=int, default=0)
        p.add_argument("--limit-s", type=float, default=120)
        if name == "watch":
            p.add_argument("--statesync", default="statesync")
            p.add_argument("--quiet-s", type=float, default=3)
    args = parser.parse_args()
    {"run": run, "write": run_writer, "watch": run_watcher}[args.command](args)


if __name__ == "__main__":
    main()
