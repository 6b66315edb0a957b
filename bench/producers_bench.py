#!/usr/bin/python3
"""Producers' refits against the canonical-file refit (issue 17's figures).

A traingen model (default: hidden 2048, 8 layers, about 1 GB BF16) is
written as canonical files and as the shards of an 8-rank layout (tp 4 x
pp 2). On one topology (root.baseline and two relays on loopback, file
stores) the same step is refitted, alternately:
  - canonical: `dcr refit --target v1.safetensors` (the root reads and
    diffs the gathered checkpoint);
  - producers: `dcr refit --producers 8`, with eight `producer_run`
    processes (C++ producers reading their rank's shard files).
Each run starts from copies of v0 and refits two trainer steps, v0 -> v1
-> v2, with the same relays, coordinator and producers throughout, as a
training run would; the second refit is the one measured (the first pays
what a run pays once: the producers' baseline copies and hashes, the
stores' first mappings). The first refit's write-back is done before the
measured one starts (sync(2); the producers' `--settle`), as it would be
by the end of a training step: otherwise the measured refit starts while
the kernel still flushes the first one's pages to the one disk the root
and both relays share. Each refit dirties nearly every page of the three
stores (2.9 GB at 2.7% change), past the kernel's background threshold
here (10% of memory), so part of that flush lands inside each measured
refit: in a canonical refit mostly in its commit (root.baseline's
durability, the report's `baseline_waited`), in a producers' refit mostly
in its vote (the relays' journal syncs queue behind it; `-v` relay logs
give each vote's hash and sync time). Each run is checked with `dcr
verify` against v2.
Reported: the refit's time (the producers' includes their construction;
the canonical one leaves out the gather and export a trainer would need
first), per producer the bytes of shard files it mapped, what the library
holds, its peak RSS and its construction time; and construction
throughput per core with 1, 2, 4 and 8 producers diffing at once
(`producer_run --diff-only`).

Usage: bench/producers_bench.py [--build build] [--dir D] [--rounds N]
                                [--store-dir S]  (stores, state: e.g. a tmpfs)
       bench/producers_bench.py --only producers [--perf FILE]  (profiling)
       DCR_BENCH_VERBOSE=1 bench/producers_bench.py ...  (debug logs in --dir)
Writes bench/results/producers.json.
"""
import argparse
import atexit
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# DCR_BENCH_VERBOSE=1: the relays and the coordinator log debug detail
# (into DIR/a.log, b.log, coord.log).
VERBOSE = ["-v"] if os.environ.get("DCR_BENCH_VERBOSE") else []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def finish(p):
    """Reads a child's stdout to the end and reaps it: (stdout, CPU seconds
    it used), its returncode set."""
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return out, ru.ru_utime + ru.ru_stime


def proc_cpu(pid):
    """CPU seconds a running process used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def shape_lo(rate, port):
    """Traffic to `port` on lo through an HTB class of `rate`, the rest
    through one of 40 Gbit/s (this VM's kernel has htb and tbf, not prio);
    undone at exit."""
    def tc(*args, check=True):
        subprocess.run(["tc"] + list(args), check=check,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shown = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True,
                           text=True, check=True).stdout
    if shown.split()[:2] != ["qdisc", "noqueue"]:
        sys.exit(f"--wan: lo already has a root qdisc ({shown.strip()}); remove it first")
    atexit.register(tc, "qdisc", "del", "dev", "lo", "root", check=False)
    tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20")
    # Bursts above lo's 64 KiB segments.
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
       "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k")
    tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
       "rate", "40gbit", "ceil", "40gbit")
    tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1",
       "u32", "match", "ip", "dport", str(port), "0xffff", "flowid", "1:10")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dir", default="/tmp/dcr-producers-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--only", choices=("canonical", "producers"))
    ap.add_argument("--perf", help="with --only producers: `perf record -g` the "
                    "coordinator over the second refit into this file")
    ap.add_argument("--store-dir",
                    help="where root.baseline, the relays' stores and the root's "
                    "state go (default: --dir); e.g. a tmpfs, to take the one "
                    "disk they share on this VM out of both refits")
    ap.add_argument("--context", choices=("off", "on", "auto"), default="off",
                    help="dcr refit --context for both refits (default off: "
                    "loopback links gain nothing from it; on: the payload a WAN "
                    "would carry, the root coding every changed span in context)")
    ap.add_argument("--wan", metavar="RATE",
                    help="shape the root's link into the rollout cluster (loopback "
                    "traffic to the head relay's port) to RATE with tc htb, e.g. "
                    "20mbit, and declare it in the topology: a refit bound by its WAN "
                    "rather than by these two cores (root; changes lo's qdisc while "
                    "it runs)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/producers.json"))
    a = ap.parse_args()
    dcr = os.path.join(a.build, "src/cli/dcr")
    relay = os.path.join(a.build, "src/cli/dcr-relay")
    traingen = os.path.join(a.build, "tools/dcr-traingen")
    prun = os.path.join(a.build, "bench/producer_run")
    d = a.dir
    os.makedirs(d, exist_ok=True)
    sd = a.store_dir or d  # the stores and state
    os.makedirs(sd, exist_ok=True)
    layout = os.path.join(d, "l8.yaml")
    with open(os.path.join(ROOT, "layouts/traingen-tp2-pp2.yaml")) as f:
        text = f.read()
    h, ffn = a.hidden, (a.hidden * 43 // 16 + 63) // 64 * 64
    text = (text.replace("tp: 2, pp: 2", "tp: 4, pp: 2")
            .replace("1024", str(h)).replace("2752", str(ffn))
            .replace("head_dim: 64", f"head_dim: {h // 16}")
            .replace("layers: 8", f"layers: {a.layers}"))
    with open(layout, "w") as f:
        f.write(text)
    ck = os.path.join(d, "ck")
    if not os.path.exists(os.path.join(ck, "v2.shards")):
        subprocess.run([traingen, "--hidden", str(h), "--layers", str(a.layers),
                        "--steps", "2", "--layout", layout, "--out", ck],
                       check=True, stdout=subprocess.DEVNULL)
    v0, v1, v2 = (os.path.join(ck, f"v{i}.safetensors") for i in range(3))
    model_bytes = os.path.getsize(v2)

    ports = [free_port() for _ in range(3)]
    coord_port = free_port()
    topo = os.path.join(d, "tree.yaml")
    link_rate = "10Gbps"
    if a.wan:
        # tc's "20mbit" is the topology's "20Mbps" (bits per second).
        m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", a.wan.lower())
        if not m:
            sys.exit(f"--wan {a.wan}: give a rate as tc writes it, e.g. 20mbit")
        link_rate = m.group(1) + {"kbit": "Kbps", "mbit": "Mbps", "gbit": "Gbps"}[m.group(2)]
    with open(topo, "w") as f:
        f.write(f"""version: 1
defaults: {{transport: tcp, fanout: 2}}
root: {{name: trainer, host: 127.0.0.1, port: {ports[0]}, cluster: train, state_dir: "{sd}/state", baseline: "{sd}/root.safetensors"}}
clusters:
  - name: train
  - name: rollout
    nodes:
      - {{name: a, host: 127.0.0.1, port: {ports[1]}, store: {{kind: file, path: "{sd}/a.safetensors"}}}}
      - {{name: b, host: 127.0.0.1, port: {ports[2]}, store: {{kind: file, path: "{sd}/b.safetensors"}}}}
links:
  - {{from: train, to: rollout, bandwidth: {link_rate}, latency: 1ms}}
""")
    if a.wan:
        shape_lo(a.wan, ports[1])

    def reset():
        # Every store back to v0, records and state gone: the same start.
        for n in ("root", "a", "b"):
            for suffix in (".dcr-version", ".dcr-journal", ".dcr-epoch"):
                p = os.path.join(sd, n + ".safetensors" + suffix)
                if os.path.exists(p):
                    os.remove(p)
            shutil.copyfile(v0, os.path.join(sd, n + ".safetensors"))
        shutil.rmtree(os.path.join(sd, "state"), ignore_errors=True)
        # The copies' write-back must not run during the refit it prepares.
        os.sync()

    def verify():
        for n in ("root", "a", "b"):
            subprocess.run([dcr, "verify", os.path.join(sd, n + ".safetensors"), v2],
                           check=True, stdout=subprocess.DEVNULL)

    relays = []

    def start_relays():
        for n in ("a", "b"):
            ready = os.path.join(d, n + ".ready")
            if os.path.exists(ready):
                os.remove(ready)
            relays.append(subprocess.Popen(
                [relay, "--topology", topo, "--node", n, "--ready-file", ready] + VERBOSE,
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, n + ".log"), "a")))
            for _ in range(200):
                if os.path.exists(ready) and os.path.getsize(ready) > 0:
                    break
                time.sleep(0.05)

    def relays_cpu():
        return sum(proc_cpu(p.pid) for p in relays)

    def stop_relays():
        for p in relays:
            p.terminate()
        for p in relays:
            p.wait()
        relays.clear()

    def canonical_refit(target):
        t = time.monotonic()
        p = subprocess.Popen([dcr, "refit", "--topology", topo, "--target", target,
                              "--progress", "never", "-o", "json", "--context", a.context],
                             stdout=subprocess.PIPE,
                             stderr=open(os.path.join(d, "coord.log"), "a"), text=True)
        out, cpu = finish(p)
        wall = time.monotonic() - t
        if p.returncode != 0:
            stop_relays()
            sys.exit("canonical refit failed: see coord.log")
        return {"wall_seconds": wall, "report": json.loads(out), "root_cpu_seconds": cpu}

    def canonical():
        reset()
        start_relays()
        canonical_refit(v1)
        # The first refit's write-back finishes before the measured one, as
        # it does during a training step (the producers' --settle).
        os.sync()
        before = relays_cpu()
        r = canonical_refit(v2)
        r["relays_cpu_seconds"] = relays_cpu() - before
        stop_relays()
        verify()
        return r

    def producers():
        reset()
        start_relays()
        coord = subprocess.Popen(
            [dcr] + VERBOSE
            + ["refit", "--topology", topo, "--producers", "8", "--layout", layout,
             "--listen", f"127.0.0.1:{coord_port}", "--refits", "2",
             "--progress", "never", "-o", "json", "--context", a.context],
            stdout=subprocess.PIPE, stderr=open(os.path.join(d, "coord.log"), "w"),
            text=True)
        # The ranks connect once the coordinator listens (it says so).
        for _ in range(600):
            with open(os.path.join(d, "coord.log")) as f:
                if "waiting for 8 producers" in f.read():
                    break
            if coord.poll() is not None:
                sys.exit("the coordinator exited: see coord.log")
            time.sleep(0.05)
        t = time.monotonic()
        procs = [subprocess.Popen(
            [prun, "--layout", layout, "--rank", str(r), "--base", ck + "/v0.shards",
             "--target", ck + "/v1.shards", "--target", ck + "/v2.shards",
             "--coordinator", f"127.0.0.1:{coord_port}",
             "--step", "1", "--settle"], stdout=subprocess.PIPE, text=True) for r in range(8)]
        # The coordinator's CPU for the second refit: its total less what it
        # had used when it reported the first.
        first = coord.stdout.readline()
        cpu_first = proc_cpu(coord.pid)
        relays_first = relays_cpu()
        perf = None
        if a.perf:
            # The coordinator's profile over the measured refit.
            perf = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "999",
                                     "-g", "-p", str(coord.pid), "-o", a.perf],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        outs = [json.loads(p.communicate()[0]) for p in procs]
        out, root_cpu = finish(coord)
        if perf:
            perf.send_signal(2)
            perf.wait()
        out = first + out
        root_cpu -= cpu_first
        # The second refit, measured: its report (the coordinator's second
        # line) and each producer's second step.
        rep = json.loads(out.splitlines()[-1])
        wall = max(o["refit_seconds"] for o in outs)
        relays_used = relays_cpu() - relays_first
        stop_relays()
        if coord.returncode != 0 or any(o["outcome"] != "committed" for o in outs):
            sys.exit(f"producers' refit failed: {rep.get('reason')}, {outs}")
        verify()
        return {"wall_seconds": wall, "report": rep, "producers": outs,
                "root_cpu_seconds": root_cpu, "relays_cpu_seconds": relays_used}

    runs = {"canonical": [], "producers": []}
    if a.only:
        # One kind of refit once (profiling): no table, no JSON.
        r = canonical() if a.only == "canonical" else producers()
        out = {"seconds": r["report"]["seconds"], "root_cpu": r["root_cpu_seconds"],
               "relays_cpu": r["relays_cpu_seconds"]}
        if "producers" in r:
            # Each rank's CPU for the measured step: in all, and on the
            # thread that diffs (the rest: the link's threads).
            out["ranks_cpu"] = [[o["refit_cpu_seconds"], o.get("refit_thread_cpu_seconds")]
                                for o in r["producers"]]
        print(json.dumps(out))
        return
    for _ in range(a.rounds):
        runs["canonical"].append(canonical())
        runs["producers"].append(producers())

    # Construction alone: 1, 2, 4 and 8 producers diffing at once.
    scaling = []
    for n in (1, 2, 4, 8):
        t = time.monotonic()
        procs = [subprocess.Popen(
            [prun, "--layout", layout, "--rank", str(r), "--base", ck + "/v0.shards",
             "--target", ck + "/v1.shards", "--diff-only"],
            stdout=subprocess.PIPE, text=True) for r in range(n)]
        outs = [json.loads(p.communicate()[0]) for p in procs]
        wall = time.monotonic() - t
        shard = sum(o["shard_bytes"] for o in outs)
        cpu = sum(o["diff_cpu_seconds"] for o in outs)
        scaling.append({"producers": n, "shard_bytes": shard,
                        "diff_cpu_seconds": cpu,
                        "per_core_GBps": shard / cpu / 1e9,
                        "max_diff_seconds": max(o["diff_seconds"] for o in outs),
                        "wall_seconds": wall})

    c_tot = median([r["report"]["seconds"]["total"] for r in runs["canonical"]])
    p_tot = median([r["report"]["seconds"]["total"] for r in runs["producers"]])
    c_wall = median([r["wall_seconds"] for r in runs["canonical"]])
    p_wall = median([r["wall_seconds"] for r in runs["producers"]])
    last = runs["producers"][-1]["producers"]
    print(f"model {model_bytes / 1e9:.2f} GB, 8 ranks ({layout}), "
          f"{a.rounds} rounds, medians; stores and state in {sd}")
    print(f"--context {a.context}" + (f", the root's link shaped to {a.wan}" if a.wan else ""))
    print(f"{'refit':<12}{'report s':>10}{'wall s':>10}{'payload MB':>12}{'chunks':>8}"
          f"{'in context':>11}")
    for name, tot, wall in (("canonical", c_tot, c_wall), ("producers", p_tot, p_wall)):
        rep = runs[name][-1]["report"]
        print(f"{name:<12}{tot:>10.3f}{wall:>10.3f}{rep['payload_bytes'] / 1e6:>12.2f}"
              f"{rep['chunks']:>8}{rep.get('context_chunks', 0):>11}")
    print(f"producers / canonical (wall): {p_wall / c_wall:.2f}")
    c_cpu = median([r["root_cpu_seconds"] for r in runs["canonical"]])
    p_cpu = median([r["root_cpu_seconds"] for r in runs["producers"]])
    prod_cpu = median([sum(o["refit_cpu_seconds"] for o in r["producers"])
                       for r in runs["producers"]])
    c_rel = median([r["relays_cpu_seconds"] for r in runs["canonical"]])
    p_rel = median([r["relays_cpu_seconds"] for r in runs["producers"]])
    print(f"CPU seconds: the root {c_cpu:.2f} (canonical) vs {p_cpu:.2f} "
          f"(producers); the 8 producers' refits together {prod_cpu:.2f}; "
          f"the two relays {c_rel:.2f} vs {p_rel:.2f}")
    print(f"{'rank':>4}{'shard MB':>10}{'mapped MB':>11}{'library MB':>12}"
          f"{'peak RSS MB':>13}{'diff s':>8}{'refit s':>9}")
    for o in last:
        print(f"{o['rank']:>4}{o['shard_bytes'] / 1e6:>10.1f}"
              f"{o['mapped_file_bytes'] / 1e6:>11.1f}{o['library_bytes'] / 1e6:>12.1f}"
              f"{o['peak_rss_bytes'] / 1e6:>13.1f}{o['diff_seconds']:>8.3f}"
              f"{o['refit_seconds']:>9.3f}")
    print(f"{'producers':>10}{'shard GB':>10}{'GB/s/core':>11}{'max diff s':>12}{'wall s':>8}")
    for s in scaling:
        print(f"{s['producers']:>10}{s['shard_bytes'] / 1e9:>10.2f}"
              f"{s['per_core_GBps']:>11.2f}{s['max_diff_seconds']:>12.3f}"
              f"{s['wall_seconds']:>8.2f}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"model_bytes": model_bytes, "layout": "tp4 x pp2 (8 ranks)",
                   "rounds": a.rounds, "cores": os.cpu_count(), "store_dir": sd,
                   "context": a.context, "wan": a.wan,
                   "canonical_total_seconds": c_tot, "producers_total_seconds": p_tot,
                   "canonical_wall_seconds": c_wall, "producers_wall_seconds": p_wall,
                   "canonical_root_cpu_seconds": c_cpu,
                   "producers_root_cpu_seconds": p_cpu,
                   "producers_cpu_seconds": prod_cpu,
                   "canonical_relays_cpu_seconds": c_rel,
                   "producers_relays_cpu_seconds": p_rel,
                   "runs": runs, "scaling": scaling}, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
