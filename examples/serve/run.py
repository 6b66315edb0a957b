#!/usr/bin/python3
"""examples/serve: a model served from relays' stores across refits.

A stand-in trainer (dcr-traingen: real Adam steps, checkpoints v0..vN)
refits a local tree after every step: a cluster `bf16` of two relays that
keep the tensor-parallel ranks 0 and 1 of a BF16 server (fused qkv and
gate/up, vLLM's names), each with a serving process, the two joined by a
gloo all-reduce; and a cluster `fp8` of one relay whose server computes on
FP8 weights with 32x32 block scales. After every commit each server moves
to the new version between two generation steps and checks that its
logits on a fixed prompt are bit-identical to those of the same model
loaded from the target's rank files (written by dcr-traingen through the
same layout, FP8 codes by its quantizer). Exit 0 when all agree.

Usage: examples/serve/run.py [--build DIR] [--steps N] [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The model: 2 layers, hidden 128, 4 heads (2 kv), vocabulary 1024: 0.5 M
# parameters, small enough for a test, the shapes of a real server's.
DIMS = {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 32,
        "intermediate": 512, "vocab": 1024}
FP8_BLOCK = 32


def ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    out = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return out


def layouts(work):
    src = open(os.path.join(ROOT, "layouts/traingen-serve-tp2.yaml")).read()
    d = DIMS
    text = (src.replace("1024", str(d["hidden"])).replace("32000", str(d["vocab"]))
            .replace("2752", str(d["intermediate"]))
            .replace("layers: 8", f"layers: {d['layers']}")
            .replace("heads: 16", f"heads: {d['heads']}")
            .replace("kv_heads: 4", f"kv_heads: {d['kv_heads']}")
            .replace("head_dim: 64", f"head_dim: {d['head_dim']}"))
    bf16 = os.path.join(work, "serve-tp2.yaml")
    open(bf16, "w").write(text)
    fp8 = []
    for line in text.replace("parallel: {tp: 2}", "parallel: {tp: 1}").splitlines(True):
        fp8.append(line)
        if "order: stacked" in line or "split: gate_up" in line or "split: row" in line:
            fp8.append(f"    fp8: {{block: [{FP8_BLOCK}, {FP8_BLOCK}]}}\n")
    fp8_path = os.path.join(work, "serve-fp8.yaml")
    open(fp8_path, "w").write("".join(fp8))
    return bf16, fp8_path


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    b = os.path.abspath(args.build)
    dcr, relay = os.path.join(b, "src/cli/dcr"), os.path.join(b, "src/cli/dcr-relay")
    traingen, pydir = os.path.join(b, "tools/dcr-traingen"), os.path.join(b, "python")
    work = tempfile.mkdtemp(prefix="dcr-serve-")
    shm = f"dcr-serve-{os.getpid()}"
    procs = {}
    t_start = time.time()

    def run(cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
        return p.stdout

    try:
        bf16, fp8 = layouts(work)
        d = DIMS
        model = ["--hidden", str(d["hidden"]), "--layers", str(d["layers"]),
                 "--heads", str(d["heads"]), "--kv-heads", str(d["kv_heads"]),
                 "--intermediate", str(d["intermediate"]), "--vocab", str(d["vocab"]),
                 "--lr", "2e-5", "--steps", str(args.steps)]
        # One run per layout: the same seed gives the same checkpoints.
        ck, ck8 = os.path.join(work, "ck"), os.path.join(work, "ck8")
        run([traingen, *model, "--out", ck, "--layout", bf16, "--serving"])
        run([traingen, *model, "--out", ck8, "--layout", fp8, "--serving"])
        shutil.copy(os.path.join(ck, "v0.safetensors"), os.path.join(work, "base.safetensors"))
        p_root, p_b0, p_b1, p_f0, p_gloo = ports(5)
        topo = os.path.join(work, "tree.yaml")
        node = (lambda name, port, layout_key: f"      - {{name: {name}, host: 127.0.0.1, "
                f"port: {port}, store: {{kind: shm, path: /{shm}-{name}}}, "
                f"serving: {{{layout_key}socket: \"{work}/{name}.sock\"}}}}\n")
        open(topo, "w").write(
            "version: 1\n"
            "defaults: {transport: tcp, fanout: 2, min_commit: all}\n"
            f"root: {{name: trainer, host: 127.0.0.1, port: {p_root}, cluster: train, "
            f"state_dir: \"{work}/root\", baseline: \"{work}/base.safetensors\"}}\n"
            "clusters:\n  - name: train\n"
            f"  - name: bf16\n    serving: {{layout: \"{bf16}\"}}\n    nodes:\n"
            + node("b0", p_b0, "rank: 0, ") + node("b1", p_b1, "rank: 1, ")
            + "  - name: fp8\n    nodes:\n"
            + node("f0", p_f0, f"layout: \"{fp8}\", rank: 0, ")
            + "links:\n  - {from: train, to: bf16, bandwidth: 1Gbps, latency: 1ms}\n"
            "  - {from: train, to: fp8, bandwidth: 1Gbps, latency: 1ms}\n")
        for n in ("b0", "b1", "f0"):
            procs[n] = subprocess.Popen(
                [relay, "--topology", topo, "--node", n, "--ready-file",
                 f"{work}/{n}.ready"], stdout=open(f"{work}/{n}.log", "w"),
                stderr=subprocess.STDOUT)
        for n in ("b0", "b1", "f0"):
            for _ in range(200):
                if os.path.exists(f"{work}/{n}.ready") and os.path.getsize(f"{work}/{n}.ready"):
                    break
                if procs[n].poll() is not None:
                    raise SystemExit(open(f"{work}/{n}.log").read())
                time.sleep(0.05)
        refit = [dcr, "refit", "--topology", topo, "--progress", "never", "-o", "json",
                 "--timeout", "30s"]
        out = json.loads(run(refit + ["--target", os.path.join(ck, "v0.safetensors"), "--full"]))
        first = out["target"]["step"]
        last = first + args.steps
        dims = f"{d['layers']},{d['heads']},{d['kv_heads']},{d['head_dim']},{d['vocab']}"
        results = os.path.join(work, "servers.jsonl")
        for name, rank, world, ref, block in (("b0", 0, 2, ck, 0), ("b1", 1, 2, ck, 0),
                                              ("f0", 0, 1, ck8, FP8_BLOCK)):
            procs["srv-" + name] = subprocess.Popen(
                ["/usr/bin/python3", os.path.join(HERE, "serve.py"), "--pydir", pydir,
                 "--store", f"shm:/{shm}-{name}", "--socket", f"{work}/{name}.sock",
                 "--name", name, "--rank", str(rank), "--world", str(world),
                 "--master-port", str(p_gloo), "--reference", ref,
                 "--last-step", str(last), "--out", results, "--dims", dims,
                 "--fp8-block", str(block)],
                stdout=open(f"{work}/srv-{name}.log", "w"), stderr=subprocess.STDOUT)

        def checked(step):
            if not os.path.exists(results):
                return {}
            rows = [json.loads(l) for l in open(results)]
            return {r["name"]: r for r in rows if r["step"] == step and "identical" in r}

        def wait_step(step):
            for _ in range(600):
                got = checked(step)
                if len(got) == 3:
                    return got
                for n, p in procs.items():
                    if n.startswith("srv-") and p.poll() is not None and p.returncode != 0:
                        raise SystemExit(open(f"{work}/{n}.log").read())
                time.sleep(0.05)
            raise SystemExit(f"the servers did not all reach step {step}: {checked(step)}")

        wait_step(first)
        print(f"step {first}: v0 seeded; servers b0+b1 (BF16, tp 2) and f0 (FP8) run on it")
        failed = False
        for k in range(1, args.steps + 1):
            out = json.loads(run(refit + ["--target", os.path.join(ck, f"v{k}.safetensors")]))
            if out["outcome"] != "committed":
                raise SystemExit(f"refit to v{k}: {out['outcome']}")
            got = wait_step(first + k)
            ok = all(r["identical"] and not r["mixed"] and r["differs_from_previous"]
                     for r in got.values())
            failed |= not ok
            print(f"step {first + k}: refit {out['seconds']['total']:.3f} s, "
                  f"{out['payload_bytes']} bytes; logits "
                  + ", ".join(f"{n} {'identical' if r['identical'] else 'DIFFER'}"
                              for n, r in sorted(got.items()))
                  + ("" if all(r["differs_from_previous"] for r in got.values())
                     else " (but equal to the previous version's: not a check)"),
                  flush=True)
        for n in ("srv-b0", "srv-b1", "srv-f0"):
            procs[n].wait(timeout=30)
        mixed = [r for r in (json.loads(l) for l in open(results)) if r.get("mixed")]
        if mixed:
            failed = True
            print(f"servers computed across two versions: {mixed}")
        print(f"{'FAILED' if failed else 'ok'}: {args.steps} refits, every server "
              f"{'not ' if failed else ''}bit-identical to the target after each "
              f"commit ({time.time() - t_start:.0f} s)")
        return 1 if failed else 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in os.listdir("/dev/shm"):
            if f.startswith(shm):
                os.unlink(os.path.join("/dev/shm", f))
        if args.keep:
            print("work directory:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
