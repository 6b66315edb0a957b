#!/usr/bin/env python3
"""The standard-tool baseline of bench/refit_e2e: a plain TCP file copy
(what `cat file | nc host port` or scp without the encryption would do;
rsync, nc, socat and sshd are not installed on these machines), store and
forward: a node receives the whole file, then sends it on.

  tcpcopy.py recv PORT OUT [HOST:PORT...]
      Listens on PORT (prints "ready" once listening), receives one file
      into OUT, then sends OUT to every HOST:PORT at once (each a
      `tcpcopy.py recv` there; a cluster head to the other nodes of its
      cluster), waits for all of them, and only then acknowledges to its
      sender: an acknowledgement means the whole subtree holds the file.
  tcpcopy.py send FILE HOST:PORT...
      Sends FILE to every HOST:PORT at once (the root to each cluster head),
      waits for every acknowledgement, prints the seconds it took.

Data is sent with sendfile(2); the receiver writes what it reads (no
fsync: neither cat nor scp syncs). Exit 1 on any error.
"""
import os
import socket
import sys
import threading
import time

BUF = 1 << 20


def send_one(path, dest, errors):
    try:
        host, port = dest.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=600) as s, \
                open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            s.sendall(size.to_bytes(8, "little"))
            s.sendfile(f)
            if s.recv(1) != b"k":
                raise RuntimeError(f"{dest}: no acknowledgement")
    except (OSError, RuntimeError) as e:
        errors.append(f"{dest}: {e}")


def send_all(path, dests):
    errors, threads = [], []
    for d in dests:
        t = threading.Thread(target=send_one, args=(path, d, errors))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if errors:
        sys.exit("tcpcopy: " + "; ".join(errors))


def recv(port, out, dests):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    print("ready", flush=True)
    c, _ = ls.accept()
    with c:
        hdr = b""
        while len(hdr) < 8:
            b = c.recv(8 - len(hdr))
            if not b:
                sys.exit("tcpcopy: sender closed before the size")
            hdr += b
        left = int.from_bytes(hdr, "little")
        buf = bytearray(BUF)
        view = memoryview(buf)
        with open(out, "wb") as f:
            while left:
                n = c.recv_into(view[:min(BUF, left)])
                if not n:
                    sys.exit(f"tcpcopy: sender closed with {left} bytes to go")
                f.write(view[:n])
                left -= n
        if dests:
            send_all(out, dests)
        c.sendall(b"k")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "send":
        t = time.time()
        send_all(sys.argv[2], sys.argv[3:])
        print(f"{time.time() - t:.6f}")
    elif len(sys.argv) >= 4 and sys.argv[1] == "recv":
        recv(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
