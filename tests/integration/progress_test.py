#!/usr/bin/env python3
"""dcr refit's progress tells the truth about a paced link.

A root and a chain of two relays (trainer -> a0 -> a1) on loopback; the
root's link is paced (dcr refit --link-rate) so that a delta's payload
takes a few seconds to cross it, although the root queues all of it at
once. The refit runs with --progress json; meanwhile this script scrapes
each relay's dcr_relay_bytes_in_total (the bytes its link delivered) every
50 ms. Then:

  - the stream phase lasts until every receiver applied every chunk: its
    bar moves through the drain (many reports after the last chunk was
    queued, with delivered bytes rising), and "vote" comes only once
    delivered reaches the payload;
  - the bar's fraction never runs ahead of the link's counters (what a
    relay applied, it received), nor behind them by more than the report
    lag (250 ms per hop plus the root's 100 ms cadence; 1 s allowed);
  - a paced --full refit: the same, its total estimated from the diff's
    progress until the last chunk is queued.

Usage: progress_test.py DCR DCR_RELAY DCR_TRAINGEN
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

DCR, RELAY, TRAINGEN = (os.path.abspath(a) for a in sys.argv[1:4])
T = tempfile.mkdtemp(prefix="dcr-progress-")
PROCS = []


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def free_ports(n):
    socks, ports = [], []
    for port in random.sample(range(10000, 30000), 400):
        if len(ports) == n:
            break
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        socks.append(s)
        ports.append(port)
    for s in socks:
        s.close()
    return ports


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        fail("%s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout,
                                    r.stderr))
    return r


def start_relays(topo, nodes):
    ports = {}
    for n in nodes:
        ready = os.path.join(T, n + ".ready")
        log = open(os.path.join(T, n + ".log"), "w")
        PROCS.append(subprocess.Popen(
            [RELAY, "--topology", topo, "--node", n, "--metrics-port", "0",
             "--metrics-host", "127.0.0.1", "--ready-file", ready],
            stdout=log, stderr=log))
        for _ in range(100):
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                break
            time.sleep(0.1)
        else:
            fail("relay %s not ready:\n%s" %
                 (n, open(os.path.join(T, n + ".log")).read()))
        ports[n] = json.load(open(ready))["metrics_port"]
    return ports


def bytes_in(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dcr_relay_bytes_in_total"):
                return float(line.split()[-1])
    fail("no dcr_relay_bytes_in_total in the scrape")


def paced_refit(topo, target, metrics, rate, extra):
    """Runs the refit, scraping the relays meanwhile: (progress lines,
    scrapes [(time, {node: bytes_in})], the report)."""
    scrapes, stop = [], threading.Event()

    def scrape():
        while not stop.is_set():
            t = time.time()
            scrapes.append((t, {n: bytes_in(p) for n, p in metrics.items()}))
            time.sleep(0.05)

    base = {n: bytes_in(p) for n, p in metrics.items()}
    th = threading.Thread(target=scrape)
    th.start()
    r = subprocess.run(
        [DCR, "refit", "--topology", topo, "--target", target, "--progress",
         "json", "--link-rate", rate, "-o", "json"] + extra,
        capture_output=True, text=True)
    stop.set()
    th.join()
    if r.returncode != 0:
        fail("dcr refit exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    if os.environ.get("DCR_PROGRESS_DEBUG"):
        print(r.stderr, file=sys.stderr)
    lines = []
    for l in r.stderr.splitlines():
        if l.startswith("{"):
            lines.append(json.loads(l))
    report = json.loads(r.stdout)
    # Each relay's bytes of this refit.
    scrapes = [(t, {n: b[n] - base[n] for n in b}) for t, b in scrapes]
    return lines, scrapes, report


def link_fraction(scrapes, t, total):
    """The least fraction of its refit bytes any relay had received at
    time t (the last scrape at or before t)."""
    seen = [b for ts, b in scrapes if ts <= t]
    if not seen:
        return 0.0
    return min(v / total[n] for n, v in seen[-1].items())


def check(name, lines, scrapes, report):
    payload = report["payload_bytes"]
    if report["outcome"] != "committed":
        fail("%s: outcome %s" % (name, report["outcome"]))
    phases = [l["phase"] for l in lines]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    if os.environ.get("DCR_PROGRESS_DEBUG"):
        for l in lines:
            print(l, file=sys.stderr)
    if "stream" not in order or "vote" not in order or order[-1] != "commit":
        fail("%s: phases %s, want stream, vote, commit" % (name, order))
    if order.index("vote") < order.index("stream"):
        fail("%s: phases %s" % (name, order))
    stream = [l for l in lines if l["phase"] == "stream"]
    for a, b in zip(stream, stream[1:]):
        if (b["delivered_bytes"] or 0) < (a["delivered_bytes"] or 0):
            fail("%s: delivered went down: %s then %s" % (name, a, b))
    if any(l["delivered_bytes"] is None for l in stream):
        fail("%s: relays did not report delivered bytes" % name)
    # The drain: after the last chunk was queued, the bar still moves.
    draining = [l for l in stream
                if l["payload_final"] and l["delivered_bytes"] < payload]
    if len(draining) < 6:
        fail("%s: only %d reports while the queued payload drained (%s)" %
             (name, len(draining), draining))
    if len({l["delivered_bytes"] for l in draining}) < 4:
        fail("%s: the bar did not move during the drain: %s" %
             (name, [l["delivered_bytes"] for l in draining]))
    first_vote = next(l for l in lines if l["phase"] == "vote")
    if first_vote["delivered_bytes"] != payload:
        fail("%s: vote began at %s of %d bytes delivered" %
             (name, first_vote["delivered_bytes"], payload))
    # Against the link counters. Relays count whole frames (headers, PLAN,
    # END): compare fractions of each relay's bytes at the end.
    total = scrapes[-1][1]
    worst_ahead = worst_behind = -1.0
    for l in stream:
        if not l["payload_final"] and l["payload_bytes"] == 0:
            continue
        d = l["delivered_bytes"] / payload
        ahead = d - link_fraction(scrapes, l["time"] + 0.15, total)
        behind = link_fraction(scrapes, l["time"] - 1.0, total) - d
        worst_ahead = max(worst_ahead, ahead)
        worst_behind = max(worst_behind, behind)
    if worst_ahead > 0.03:
        fail("%s: the bar ran %.1f%% ahead of the link's bytes" %
             (name, 100 * worst_ahead))
    if worst_behind > 0.05:
        fail("%s: the bar lagged the link's bytes of 1 s before by %.1f%%" %
             (name, 100 * worst_behind))
    drain_s = draining[-1]["elapsed"] - draining[0]["elapsed"]
    # The report tells the drain from the vote too.
    sec = report["seconds"]
    if not (0.5 * drain_s <= sec["applied"] <= sec["vote"] + 1e-3):
        fail("%s: report seconds.applied %.3f (vote %.3f, drain %.1f s)" %
             (name, sec["applied"], sec["vote"], drain_s))
    print("ok: %s: %d B payload; %d reports, %d while draining for %.1f s; "
          "phases %s; bar minus link: at most %+.1f%% (0.15 s later), link "
          "1 s earlier minus bar: at most %+.1f%%; report: all applied %.2f s "
          "into the vote's %.2f s" %
          (name, payload, len(lines), len(draining), drain_s,
           " -> ".join(order), 100 * worst_ahead, 100 * worst_behind,
           sec["applied"], sec["vote"]))


def main():
    run([TRAINGEN, "--out", os.path.join(T, "ck"), "--hidden", "256",
         "--layers", "2", "--vocab", "8000", "--lr", "2e-6", "--steps", "2"])
    ck = os.path.join(T, "ck")
    ports = free_ports(3)
    topo = os.path.join(T, "tree.yaml")
    nodes = ["a0", "a1"]
    with open(topo, "w") as f:
        f.write("version: 1\n")
        f.write("defaults: {transport: tcp, fanout: 1}\n")
        f.write('root: {name: trainer, host: 127.0.0.1, port: %d, cluster: '
                'train, state_dir: "%s/root", baseline: "%s/base.safetensors"}'
                "\n" % (ports[0], T, T))
        f.write("clusters:\n  - name: train\n  - name: rollout\n    nodes:\n")
        for i, n in enumerate(nodes):
            f.write('      - {name: %s, host: 127.0.0.1, port: %d, store: '
                    '{kind: file, path: "%s/%s.safetensors"}}\n' %
                    (n, ports[i + 1], T, n))
        f.write("links:\n  - {from: train, to: rollout, bandwidth: 1Gbps, "
                "latency: 1ms}\n")
    for n in nodes + ["base"]:
        shutil.copy(os.path.join(ck, "v0.safetensors"),
                    os.path.join(T, n + ".safetensors"))
    metrics = start_relays(topo, nodes)

    lines, scrapes, report = paced_refit(
        topo, os.path.join(ck, "v1.safetensors"), metrics, "500kbps", [])
    check("delta", lines, scrapes, report)
    lines, scrapes, report = paced_refit(
        topo, os.path.join(ck, "v2.safetensors"), metrics, "16Mbps",
        ["--full"])
    check("full", lines, scrapes, report)


try:
    main()
finally:
    for p in PROCS:
        p.send_signal(signal.SIGTERM)
    for p in PROCS:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(T, ignore_errors=True)
print("PASS")
