#!/usr/bin/python3
"""Pause figures of a serving process on a relay's store (issue 18;
docs/PLACEMENT.md §"Serving processes").

A root and one serving relay (rank 0 of a tensor-parallel-2 layout of a
~1.2 GB traingen model, shm store, serving socket) on loopback, and a
Python server (dcr.Receiver) that polls between 1 ms "generation steps".
For BF16 and FP8 stores, at about 1% and 3% change per step, three delta
refits each; per refit it reports:

  refit     dcr refit's own time (PLAN to the decision)
  pause     COMMIT reaching the node to the server's "flipped" (the relay's
            dcr_relay_serving_pause_seconds), plus the server's re-pointing
            of its parameters at the new image's views
  reload    the alternative, measured in the same server after each move:
            copying the whole committed image into its own weights
  pagecache reading the target checkpoint (cached) into memory
  catch-up  the relay's copy of the live image over the old one (off the
            pause)

Targets: pause <= 10% of the refit and <= 5% of the full reload.
Writes bench/results/serving_pause.json. About 6 min on 2 cores.

Usage: bench/serving_pause.py [--quick] [--build build] [--work DIR]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def server_main(argv):
    """The serving process: python3 serving_pause.py --server ..."""
    pydir, store, sock, out = argv
    sys.path.insert(0, pydir)
    import torch
    import dcr
    r = dcr.Receiver(store, socket=sock, wait=120.0)
    views = r.tensors()
    params = {n: torch.empty(0, dtype=v.dtype) for n, v in views.items()}
    for n, v in views.items():
        params[n].data = v
    own = {n: torch.empty_like(v) for n, v in views.items()}
    with open(out, "a") as log:
        while True:
            t0 = time.perf_counter()
            moved = r.poll()
            if moved:
                views = r.tensors()
                for n, v in views.items():
                    params[n].data = v
                repoint = time.perf_counter() - t0
                t1 = time.perf_counter()
                for n, v in views.items():
                    own[n].copy_(v)
                reload = time.perf_counter() - t1
                log.write(json.dumps({"step": r.step, "repoint": repoint,
                                      "reload": reload}) + "\n")
                log.flush()
            time.sleep(0.001)


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    return p


def layouts(work, hidden, layers, inter, block):
    src = open(os.path.join(ROOT, "layouts/traingen-serve-tp2.yaml")).read()
    text = (src.replace("1024", str(hidden)).replace("2752", str(inter))
            .replace("layers: 8", f"layers: {layers}")
            .replace("head_dim: 64", f"head_dim: {hidden // 16}"))
    bf16 = os.path.join(work, "bf16.yaml")
    open(bf16, "w").write(text)
    out = []
    for line in text.splitlines(True):
        out.append(line)
        if "order: stacked" in line or "split: gate_up" in line:
            out.append(f"    fp8: {{block: [{block}, {block}]}}\n")
    fp8 = os.path.join(work, "fp8.yaml")
    open(fp8, "w").write("".join(out))
    return {"bf16": bf16, "fp8": fp8}


def one_config(args, work, ckpt, layout, kind, refits):
    dcr = os.path.join(args.build, "src/cli/dcr")
    relay = os.path.join(args.build, "src/cli/dcr-relay")
    shm = f"dcr-pause-{os.getpid()}-{kind}"
    sock = os.path.join(work, f"{kind}.sock")
    p_root, p_s0, p_metrics = free_ports(3)
    topo = os.path.join(work, f"{kind}.yaml.topo")
    state = os.path.join(work, f"root-{kind}")
    shutil.copy(os.path.join(ckpt, "v0.safetensors"),
                os.path.join(work, "base.safetensors"))
    open(topo, "w").write(f"""version: 1
defaults: {{transport: tcp}}
root: {{name: trainer, host: 127.0.0.1, port: {p_root}, cluster: train, state_dir: "{state}", baseline: "{work}/base.safetensors"}}
clusters:
  - name: train
  - name: serve
    nodes:
      - {{name: s0, host: 127.0.0.1, port: {p_s0}, metrics_port: {p_metrics}, store: {{kind: shm, path: /{shm}}}, serving: {{layout: "{layout}", rank: 0, socket: "{sock}"}}}}
links:
  - {{from: train, to: serve, bandwidth: 100Gbps, latency: 1ms}}
""")
    ready = os.path.join(work, f"s0-{kind}.ready")
    relay_log = open(os.path.join(work, f"s0-{kind}.log"), "w")
    rp = subprocess.Popen([relay, "--topology", topo, "--node", "s0",
                           "--ready-file", ready, "--serving-deadline", "30s"],
                          stdout=relay_log, stderr=subprocess.STDOUT)
    srv = None
    rows = []
    try:
        for _ in range(200):
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                break
            time.sleep(0.05)
        refit = [dcr, "refit", "--topology", topo, "--progress", "never",
                 "-o", "json", "--timeout", "120s"]
        run(refit + ["--target", os.path.join(ckpt, "v0.safetensors"), "--full"])
        server_log = os.path.join(work, f"server-{kind}.jsonl")
        srv = subprocess.Popen(
            ["/usr/bin/python3", os.path.abspath(__file__), "--server",
             os.path.join(args.build, "python"), f"shm:/{shm}", sock,
             server_log],
            stdout=subprocess.DEVNULL, stderr=open(server_log + ".err", "w"))
        for _ in range(600):
            if metric(p_metrics, "dcr_relay_serving_attached") == 1:
                break
            time.sleep(0.1)
        store_bytes = os.path.getsize(f"/dev/shm/{shm}.0")
        for k in range(1, refits + 1):
            before = metric(p_metrics, "dcr_relay_serving_pauses_total") or 0
            target = os.path.join(ckpt, f"v{k}.safetensors")
            out = json.loads(run(refit + ["--target", target]).stdout)
            assert out["outcome"] == "committed", out
            for _ in range(600):
                if (metric(p_metrics, "dcr_relay_serving_pauses_total") or 0) > before:
                    break
                time.sleep(0.05)
            pause = metric(p_metrics, "dcr_relay_serving_pause_seconds")
            for _ in range(600):
                lines = [json.loads(l) for l in open(server_log)]
                mine = [l for l in lines if l["step"] == out["target"]["step"]]
                if mine:
                    break
                time.sleep(0.05)
            t0 = time.perf_counter()
            with open(target, "rb") as f:
                buf = bytearray(os.path.getsize(target))
                f.readinto(buf)
            pagecache = time.perf_counter() - t0
            del buf
            for _ in range(100):
                catch = metric(p_metrics, "dcr_relay_serving_catch_up_seconds")
                if "caught up with step %d" % out["target"]["step"] in open(relay_log.name).read():
                    break
                time.sleep(0.05)
            rows.append({
                "refit_s": out["seconds"]["total"], "relay_pause_s": pause,
                "repoint_s": mine[0]["repoint"],
                "pause_s": pause + mine[0]["repoint"],
                "reload_s": mine[0]["reload"], "pagecache_s": pagecache,
                "catch_up_s": catch, "payload_bytes": out.get("payload_bytes"),
            })
        return {"store_bytes": store_bytes, "refits": rows}
    finally:
        if srv:
            srv.kill()
            srv.wait()
        rp.send_signal(signal.SIGTERM)
        rp.wait()
        for f in os.listdir("/dev/shm"):
            if f.startswith(shm + "."):
                os.unlink(os.path.join("/dev/shm", f))
        shutil.rmtree(state, ignore_errors=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        return server_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=None, help="scratch directory")
    ap.add_argument("--quick", action="store_true",
                    help="a ~40 MB model and one refit per configuration")
    ap.add_argument("--hidden", type=int, help="model size (with --layers)")
    ap.add_argument("--layers", type=int)
    args = ap.parse_args()
    # FP8 blocks must not straddle a rank's slice: the MLP size is chosen
    # so that half of it is a multiple of the block.
    hidden, layers, inter, block, refits = ((256, 4, 768, 32, 1) if args.quick
                                            else (2048, 10, 5632, 128, 3))
    if args.hidden:
        hidden, layers = args.hidden, args.layers or layers
        inter = hidden * 11 // 4 // 256 * 256
    work = args.work or tempfile.mkdtemp(prefix="dcr-pause-")
    os.makedirs(work, exist_ok=True)
    lay = layouts(work, hidden, layers, inter, block)
    results = {"hidden": hidden, "layers": layers, "intermediate": inter,
               "fp8_block": block, "configs": []}
    traingen = os.path.join(args.build, "tools/dcr-traingen")
    try:
        for rate, lr in (("1%", "6e-7"), ("3%", "2.2e-6")):
            ckpt = os.path.join(work, "ck")
            gen = json.loads(run([traingen, "--hidden", str(hidden), "--layers",
                                  str(layers), "--intermediate", str(inter),
                                  "--lr", lr, "--steps", str(refits),
                                  "--out", ckpt, "-o", "json"]).stdout)
            rates = [s["change_rate"] for s in gen["steps"]]
            for kind in ("bf16", "fp8"):
                r = one_config(args, work, ckpt, lay[kind], kind, refits)
                r.update({"rate": rate, "lr": lr, "change_rates": rates,
                          "kind": kind, "checkpoint_bytes": gen["checkpoint_bytes"]})
                results["configs"].append(r)
                med = {k: statistics.median(x[k] for x in r["refits"])
                       for k in ("refit_s", "pause_s", "relay_pause_s",
                                 "repoint_s", "reload_s", "pagecache_s",
                                 "catch_up_s")}
                r["median"] = med
                print(f"{kind:5} {rate} ({100 * statistics.mean(rates):.2f}%): "
                      f"refit {med['refit_s']:.3f} s, pause {med['pause_s'] * 1e3:.1f} ms "
                      f"(relay {med['relay_pause_s'] * 1e3:.1f} + repoint "
                      f"{med['repoint_s'] * 1e3:.1f}), reload {med['reload_s']:.3f} s, "
                      f"page cache {med['pagecache_s']:.3f} s, catch-up "
                      f"{med['catch_up_s']:.3f} s; pause/refit "
                      f"{med['pause_s'] / med['refit_s']:.1%}, pause/reload "
                      f"{med['pause_s'] / med['reload_s']:.1%}", flush=True)
            shutil.rmtree(ckpt)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    name = "serving_pause-quick.json" if args.quick else "serving_pause.json"
    path = os.path.join(ROOT, "bench/results", name)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
