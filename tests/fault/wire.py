#!/usr/bin/env python3
"""Frame-level fault tools for the fault matrix (docs/PROTOCOL.md frames).

  wire.py proxy --listen P --to Q --ready F --events F [MODE]
      a TCP proxy on 127.0.0.1:P in front of a relay on 127.0.0.1:Q. It
      passes the relay's answers through as they are and parses what the
      parent sends into frames; on a refit link (one that carries a PLAN):
        --cut-after-chunks K  close both sides after the Kth CHUNK (between
                              frames: the link is cut, no byte is damaged);
                              once: later connections pass
        --dup-chunk K         send the Kth CHUNK twice, back to back
        --dup-late K          send the Kth CHUNK again just before END
        --bomb-after K        after the Kth CHUNK, inject a CHUNK of the
                              live refit (valid frame and chunk checksums)
                              whose zstd plane declares 2^40 bytes
      Each fault is logged as one JSON line to --events.
  wire.py hostile --port P --events F [--name N]
      connects to a relay directly, several times: a header whose length
      and reserved fields read as the u64 2^63, a header with length
      2^32-1, a truncated header, a HELLO naming a node the topology does
      not have, and HELLO (naming N, a node of the topology) + the
      zstd-bomb CHUNK outside any refit. Prints how the relay answered
      each.
  wire.py squat --port P --conns N [--hello NAME] [--hold S] [--ready F]
      N links at once that hold a slot without speaking: each sends a
      HELLO naming NAME (none without --hello) and then nothing. Once all
      are open (and greeted), writes F; after S s (or SIGTERM) prints
      {opened, refused (closed within 0.5 s), closed_later (closed after
      0.5 s: by a deadline or an eviction), open_at_end,
      closed_after_s: sorted seconds}.
  wire.py flood --port P [--conns N --frame-mib M --whole K --hold S
                --name NODE]
      N links at once, each HELLO (naming NODE, a node of the topology:
      default b0), K whole M MiB CHUNKs outside a refit and
      all but one byte of another, held S s; then one link whose first
      frame is 1 MiB. Prints {open, closed, sent_bytes, large_first_frame}.
  wire.py rss --pid P --out F --stop F2
      samples RssAnon of P until F2 exists; writes the peak to F.
Checksums: XXH3-64 (seed 0) from libxxhash, a build dependency.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import socket
import struct
import sys
import threading
import time

_xxh = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return _xxh.XXH3_64bits(bytes(b), len(b))


HDR = 56
FRAME_VERSION = 4  # include/dcr/wire.h kFrameVersion
CHUNK, END, HELLO, PLAN = 4, 5, 1, 2


def frame(ftype, payload, epoch=0, seq=0, refit=b"\0" * 16, flags=0):
    h = struct.pack("<4sBBHII QQ16s", b"DCRF", FRAME_VERSION, ftype, flags,
                    len(payload), 0, epoch, seq, refit)
    assert len(h) == 48
    return h + struct.pack("<Q", xxh3(h + payload)) + payload


def bomb_chunk(span_elems=4096):
    """An XOR dense chunk of tensor 0, span 0, BF16: plane 0 a zstd frame
    declaring 2^40 bytes (RLE blocks), plane 1 constant."""
    w = 2
    fcs = 1 << 40
    z = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", fcs)
    block = (1 << 17) - 1  # RLE block of 128 KiB - 1: 4 bytes each
    for i in range(64):
        last = 1 if i == 63 else 0
        hdr = last | (1 << 1) | (block << 3)
        z += struct.pack("<I", hdr)[:3] + b"\x07"
    planes = [(1, z), (2, b"\x00")]
    head = struct.pack("<4sBBBBIIIII BBH I", b"DCRC", 1, 1, 2, w, 0, 0, 0,
                       span_elems, span_elems, 0, w, 0, 0)
    table = b"".join(struct.pack("<BI", e, len(d)) for e, d in planes)
    body = b"".join(d for _, d in planes)
    total = len(head) + len(table) + len(body) + 8
    head = head[:8] + struct.pack("<I", total) + head[12:]
    c = head + table + body
    return c + struct.pack("<Q", xxh3(c))


class Events:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def __call__(self, **kw):
        with self.lock:
            self.f.write(json.dumps(kw) + "\n")


def read_exact(s, n):
    b = b""
    while len(b) < n:
        got = s.recv(n - len(b))
        if not got:
            return b
        b += got
    return b


CUT = threading.Event()  # the proxy cut a link already


def proxy_conn(cli, a, ev):
    try:
        srv = socket.create_connection(("127.0.0.1", a.to), timeout=10)
    except OSError:
        cli.close()
        return
    srv.settimeout(None)

    def pump_up():
        try:
            while True:
                b = srv.recv(65536)
                if not b:
                    break
                cli.sendall(b)
        except OSError:
            pass
        for s in (cli, srv):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    threading.Thread(target=pump_up, daemon=True).start()
    chunks = 0
    plan = None
    held = None
    try:
        while True:
            h = read_exact(cli, HDR)
            if len(h) < HDR:
                srv.sendall(h)
                break
            (length,) = struct.unpack_from("<I", h, 8)
            (flags,) = struct.unpack_from("<H", h, 6)
            body = read_exact(cli, length + (32 if flags & 1 else 0))
            f = h + body
            t = h[5]
            if t == PLAN:
                plan = h
            if plan is not None and t == END and held is not None:
                srv.sendall(held)
                ev(event="dup_late", chunk=a.dup_late, bytes=len(held))
                held = None
            srv.sendall(f)
            if plan is None or t != CHUNK:
                continue
            chunks += 1
            # One cut per proxy: the parent's reconnection passes.
            if chunks == a.cut_after_chunks and not CUT.is_set():
                CUT.set()
                ev(event="cut", after_chunks=chunks)
                for s in (cli, srv):
                    s.shutdown(socket.SHUT_RDWR)
                break
            if chunks == a.dup_chunk:
                srv.sendall(f)
                ev(event="dup", chunk=chunks, bytes=len(f))
            if chunks == a.dup_late:
                held = f
            if chunks == a.bomb_after:
                epoch, seq = struct.unpack_from("<QQ", h, 16)
                refit = plan[32:48]
                span = a.bomb_span_elems
                bomb = frame(CHUNK, bomb_chunk(span), epoch, 1 << 60, refit)
                srv.sendall(bomb)
                ev(event="bomb", after_chunks=chunks, bytes=len(bomb))
    except OSError:
        pass
    for s in (cli, srv):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def proxy(a):
    ev = Events(a.events)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.listen))
    ls.listen(64)
    open(a.ready, "w").write(str(os.getpid()))
    while True:
        c, _ = ls.accept()
        threading.Thread(target=proxy_conn, args=(c, a, ev), daemon=True).start()


def hello(name="intruder"):
    n = name.encode()
    # u8 version, string node (varint length), u8 role (2: relay), u64 epoch
    return struct.pack("<B", 1) + bytes([len(n)]) + n + struct.pack("<BQ", 2, 0)


def hostile(a):
    ev = Events(a.events)
    results = {}

    def attempt(name, data, wait=5):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        got = b""
        try:
            s.sendall(data)
            if name == "truncated_header":
                s.shutdown(socket.SHUT_WR)
            s.settimeout(wait)
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
            results[name] = f"closed by the relay after {len(got)} bytes"
        except socket.timeout:
            results[name] = f"open after {wait} s, {len(got)} bytes received"
        except OSError as e:
            results[name] = f"reset ({e.strerror})"
        finally:
            s.close()
        ev(event="hostile", kind=name, answer=results[name])

    h = bytearray(frame(HELLO, b""))[:HDR]
    h[8:16] = struct.pack("<Q", 1 << 63)
    attempt("length_2^63", bytes(h))
    h = bytearray(frame(HELLO, b""))[:HDR]
    h[8:12] = struct.pack("<I", 0xFFFFFFFF)
    attempt("length_2^32-1", bytes(h) + b"\0" * 4096)
    attempt("truncated_header", frame(HELLO, hello(a.name))[:23])
    attempt("unknown_node", frame(HELLO, hello("intruder")))
    attempt("bomb_outside_refit",
            frame(HELLO, hello(a.name)) +
            frame(CHUNK, bomb_chunk(), 0, 1, b"\x01" * 16),
            wait=1)
    print(json.dumps(results))


def flood(a):
    """Opens --conns links at once; on each, HELLO, --whole whole CHUNK
    frames of --frame-mib MiB outside any refit, then all but the last byte
    of one more, and holds the link for --hold seconds. Prints how many
    links stayed open and how many the relay closed."""
    size = a.frame_mib << 20
    body = os.urandom(size)
    whole = frame(CHUNK, body, 0, 1, b"\x01" * 16)
    partial = whole[:-1]
    greet = frame(HELLO, hello(a.name))
    state = {"open": 0, "closed": 0, "sent_bytes": 0}
    lock = threading.Lock()
    socks = []

    def one(i):
        try:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
        except OSError:
            with lock:
                state["closed"] += 1
            return
        socks.append(s)
        sent = 0
        try:
            s.sendall(greet)
            for _ in range(a.whole):
                s.sendall(whole)
                sent += len(whole)
            s.sendall(partial)
            sent += len(partial)
            # Still open? A closed link reads EOF or resets.
            s.settimeout(a.hold)
            while True:
                b = s.recv(65536)
                if not b:
                    raise OSError("closed")
        except socket.timeout:
            with lock:
                state["open"] += 1
                state["sent_bytes"] += sent
        except OSError:
            with lock:
                state["closed"] += 1
                state["sent_bytes"] += sent

    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A link whose first frame is large is closed at its header.
    big = bytearray(frame(HELLO, b"\0" * (1 << 20)))
    try:
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        s.sendall(bytes(big))
        s.settimeout(5)
        state["large_first_frame"] = "open" if s.recv(1) else "closed"
    except socket.timeout:
        state["large_first_frame"] = "open"
    except OSError:
        state["large_first_frame"] = "closed"
    print(json.dumps(state), flush=True)
    for s in socks:
        s.close()


def squat(a):
    """Opens --conns links that hold a slot without speaking (see the
    module doc)."""
    import selectors
    import signal
    greet = frame(HELLO, hello(a.hello)) if a.hello else b""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    socks, opened_at = [], {}
    for _ in range(a.conns):
        try:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        except OSError:
            continue
        s.setblocking(False)
        if greet:
            try:
                s.send(greet)
            except OSError:
                pass
        socks.append(s)
        opened_at[s] = time.monotonic()
    if a.ready:
        with open(a.ready, "w") as f:
            f.write(str(len(socks)))
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed = {}
    end = time.monotonic() + a.hold
    while not stop.is_set() and len(closed) < len(socks):
        left = end - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=min(left, 0.1)):
            s = key.fileobj
            try:
                b = s.recv(65536)
                if b:
                    continue  # the relay's HELLO or ERROR
            except BlockingIOError:
                continue
            except OSError:
                pass
            closed[s] = time.monotonic() - opened_at[s]
            sel.unregister(s)
    after = sorted(round(t, 2) for t in closed.values())
    print(json.dumps({
        "opened": len(socks),
        "refused": sum(1 for t in after if t < 0.5),
        "closed_later": sum(1 for t in after if t >= 0.5),
        "open_at_end": len(socks) - len(closed),
        "closed_after_s": after,
    }), flush=True)
    for s in socks:
        s.close()


def rss(a):
    """Samples RssAnon of --pid every --interval s until --stop exists or
    the process is gone; writes the peak (kB) and the sample count to
    --out as JSON."""
    peak, n = 0, 0
    while not os.path.exists(a.stop):
        try:
            with open(f"/proc/{a.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
                        n += 1
        except OSError:
            break
        time.sleep(a.interval)
    with open(a.out, "w") as f:
        json.dump({"peak_anon_kb": peak, "samples": n}, f)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("proxy")
    q.add_argument("--listen", type=int, required=True)
    q.add_argument("--to", type=int, required=True)
    q.add_argument("--ready", required=True)
    q.add_argument("--events", required=True)
    q.add_argument("--cut-after-chunks", type=int, default=0)
    q.add_argument("--dup-chunk", type=int, default=0)
    q.add_argument("--dup-late", type=int, default=0)
    q.add_argument("--bomb-after", type=int, default=0)
    q.add_argument("--bomb-span-elems", type=int, default=4096)
    h = sub.add_parser("hostile")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--events", required=True)
    h.add_argument("--name", default="b0")
    sq = sub.add_parser("squat")
    sq.add_argument("--port", type=int, required=True)
    sq.add_argument("--conns", type=int, default=20)
    sq.add_argument("--hello", default="")
    sq.add_argument("--hold", type=float, default=5)
    sq.add_argument("--ready", default="")
    f = sub.add_parser("flood")
    f.add_argument("--port", type=int, required=True)
    f.add_argument("--conns", type=int, default=64)
    f.add_argument("--frame-mib", type=int, default=8)
    f.add_argument("--whole", type=int, default=2)
    f.add_argument("--hold", type=float, default=3)
    f.add_argument("--name", default="b0")
    r = sub.add_parser("rss")
    r.add_argument("--pid", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--stop", required=True)
    r.add_argument("--interval", type=float, default=0.005)
    a = p.parse_args()
    {"proxy": proxy, "hostile": hostile, "flood": flood, "squat": squat,
     "rss": rss}[a.cmd](a)


if __name__ == "__main__":
    main()
