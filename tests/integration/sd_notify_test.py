#!/usr/bin/env python3
"""dcr-relay under systemd, without systemd: this script plays the manager.

1. deploy/systemd/dcr-relay@.service, its ExecStart pointed at the built
   binary, passes `systemd-analyze verify` as instance dcr-relay@test
   (PID 1 here is not systemd, so it cannot be started for real).
2. The notify protocol: a relay started with NOTIFY_SOCKET (a datagram
   socket bound here) and WATCHDOG_USEC=1s sends READY=1 only once it
   accepts connections and its ready file is written, WATCHDOG=1 about
   every 0.25 s, and STOPPING=1 on SIGTERM, then exits 0.
3. "While healthy": with its event loop hung (failpoint relay.loop=hang),
   the pings stop while the process lives, and the log says why.
4. WATCHDOG_PID naming another process: no pings (the variables leaked).

Usage: sd_notify_test.py DCR_RELAY SOURCE_DIR
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

RELAY, SRC = os.path.abspath(sys.argv[1]), sys.argv[2]
TMP = tempfile.mkdtemp(prefix="dcr-sd-notify-")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def verify_unit():
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        fail("systemd-analyze not found: tools/setup installs systemd")
    unit_dir = os.path.join(TMP, "units")
    os.mkdir(unit_dir)
    with open(os.path.join(SRC, "deploy/systemd/dcr-relay@.service")) as f:
        text = f.read()
    if "/usr/local/bin/dcr-relay" not in text:
        fail("the unit's ExecStart no longer names /usr/local/bin/dcr-relay")
    with open(os.path.join(unit_dir, "dcr-relay@.service"), "w") as f:
        f.write(text.replace("/usr/local/bin/dcr-relay", RELAY))
    r = subprocess.run(
        [analyze, "verify", "--man=no",
         os.path.join(unit_dir, "dcr-relay@test.service")],
        capture_output=True, text=True)
    # verify exits 0 on unknown keys and other warnings: any output fails.
    out = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or out:
        fail("systemd-analyze verify dcr-relay@test.service (rc %d):\n%s" %
             (r.returncode, out))
    print("ok: systemd-analyze verify dcr-relay@test.service")


class Manager:
    """The NOTIFY_SOCKET side: a datagram socket that records messages."""

    def __init__(self, name):
        self.path = os.path.join(TMP, name + ".sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def receive(self, timeout):
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(4096).decode()
        except socket.timeout:
            return None

    def collect(self, seconds):
        """Messages and their arrival times over `seconds`."""
        got, end = [], time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            m = self.receive(left)
            if m is not None:
                got.append((time.monotonic(), m))
        return got


def start_relay(name, manager, extra_env):
    ready = os.path.join(TMP, name + ".ready")
    log = open(os.path.join(TMP, name + ".log"), "w")
    env = dict(os.environ)
    for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
              "DCR_FAILPOINTS"):
        env.pop(k, None)
    env["NOTIFY_SOCKET"] = manager.path
    env.update(extra_env)
    p = subprocess.Popen(
        [RELAY, "--name", name, "--listen", "127.0.0.1:0", "--store",
         "file:" + os.path.join(TMP, name + ".safetensors"), "--metrics-port", "0", "--metrics-host", "127.0.0.1",
         "--ready-file", ready], env=env, stdout=log, stderr=log)
    return p, ready


def log_of(name):
    with open(os.path.join(TMP, name + ".log")) as f:
        return f.read()


def expect_ready(name, manager, ready):
    m = manager.receive(10)
    if m is None:
        fail("%s: no READY=1 within 10 s; log:\n%s" % (name, log_of(name)))
    lines = m.split("\n")
    if lines[0] != "READY=1" or not any(
            l.startswith("STATUS=listening on port ") for l in lines):
        fail("%s: first notification %r, want READY=1 and a STATUS line" %
             (name, m))
    # READY=1 means ready: the ready file is there and the port answers.
    if not os.path.exists(ready):
        fail("%s: READY=1 before the ready file was written" % name)
    import json
    with open(ready) as f:
        port = json.load(f)["port"]
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    print("ok: %s sent %r once listening on port %d" % (name, m, port))


def notify_and_watchdog():
    mgr = Manager("healthy")
    p, ready = start_relay("healthy", mgr, {"WATCHDOG_USEC": "1000000"})
    try:
        expect_ready("healthy", mgr, ready)
        got = mgr.collect(2.6)
        pings = [t for t, m in got if m == "WATCHDOG=1"]
        others = [m for t, m in got if m != "WATCHDOG=1"]
        if others:
            fail("unexpected notifications while idle: %r" % others)
        # Every quarter interval: 10 in 2.6 s, give or take the first.
        if not 8 <= len(pings) <= 13:
            fail("%d WATCHDOG=1 in 2.6 s with WATCHDOG_USEC=1s, want about 10"
                 % len(pings))
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        if max(gaps) > 0.45:
            fail("WATCHDOG=1 gaps %r: one is near half the interval" % gaps)
        print("ok: %d WATCHDOG=1 in 2.6 s, gaps %.2f-%.2f s" %
              (len(pings), min(gaps), max(gaps)))
        p.send_signal(signal.SIGTERM)
        m = mgr.receive(5)
        while m == "WATCHDOG=1":
            m = mgr.receive(5)
        if m is None or not m.startswith("STOPPING=1"):
            fail("after SIGTERM: %r, want STOPPING=1" % m)
        rc = p.wait(30)
        if rc != 0:
            fail("relay exited %d after SIGTERM, want 0" % rc)
        print("ok: SIGTERM -> %r, exit 0" % m)
    finally:
        if p.poll() is None:
            p.kill()


def hung_loop_stops_the_pings():
    mgr = Manager("hung")
    # The loop turns about every 200 ms at idle: the 10th turn is ~2 s in.
    p, ready = start_relay("hung", mgr, {
        "WATCHDOG_USEC": "1000000", "DCR_FAILPOINTS": "relay.loop=hang@10"})
    try:
        expect_ready("hung", mgr, ready)
        got = mgr.collect(4.5)
        pings = [t for t, m in got if m == "WATCHDOG=1"]
        if not pings:
            fail("no WATCHDOG=1 before the hang")
        if p.poll() is not None:
            fail("the hung relay exited (%d)" % p.returncode)
        quiet = time.monotonic() - pings[-1]
        if quiet < 2.0:
            fail("WATCHDOG=1 %.1f s ago although the loop hangs" % quiet)
        log = log_of("hung")
        if "the event loop has not turned for" not in log:
            fail("the log does not say why the pings stopped:\n" + log)
        print("ok: loop hung: %d pings, then none for %.1f s while alive" %
              (len(pings), quiet))
    finally:
        p.kill()
        p.wait()


def watchdog_for_another_process():
    mgr = Manager("other")
    p, ready = start_relay("other", mgr, {"WATCHDOG_USEC": "1000000",
                                          "WATCHDOG_PID": "1"})
    try:
        expect_ready("other", mgr, ready)
        got = mgr.collect(1.5)
        if got:
            fail("WATCHDOG_PID=1 (not the relay): got %r" % got)
        print("ok: WATCHDOG_PID of another process: no pings")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


try:
    verify_unit()
    notify_and_watchdog()
    hung_loop_stops_the_pings()
    watchdog_for_another_process()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
print("PASS")
