#!/usr/bin/python3
"""Trainer ranks for producers_test.sh: one thread per rank, each with a
dcr.Producer, refits the versions `dcr-traingen --layout` wrote as rank
shard files, one per step, against `dcr refit --producers`.

Usage: producers_driver.py MODULE_DIR LAYOUT COORDINATOR CKPT_DIR
           --base K --steps K1,K2,... [--ranks R,...] [--step-label N]
           [--die-after-chunks RANK] [--verify CMD]
Rank r's baseline is CKPT_DIR/vK.shards/rank-r.safetensors (K = --base);
each step k refits CKPT_DIR/vk.shards. Prints one JSON line per step: the
decision of every rank. --verify runs CMD with {k} replaced after each
step that committed (exit 1 if it fails).

Reads safetensors with the standard library and NumPy only: the shards
cross as uint8 buffers.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import threading

import numpy as np


def read_shards(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=np.uint8)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("module")
    p.add_argument("layout")
    p.add_argument("coordinator")
    p.add_argument("ckpt")
    p.add_argument("--base", type=int, default=0)
    p.add_argument("--steps", required=True)
    p.add_argument("--ranks", default="")
    p.add_argument("--step-label", type=int, default=-1,
                   help="the trainer step every rank names (default: k)")
    p.add_argument("--verify", default="")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--no-baseline", default="",
                   help="ranks started without a baseline (the coordinator "
                   "sends them the tree's)")
    p.add_argument("--mutate-rank", type=int, default=-1,
                   help="at the first step, this rank's trainer changes a "
                   "shard byte --mutate-after seconds into its refit")
    p.add_argument("--mutate-after", type=float, default=1.0)
    p.add_argument("--step-log-bytes", type=int, default=-1,
                   help="dcr.Producer's step_log_bytes (-1: its default; 0: "
                   "no change log, a commit checks and copies the shards)")
    p.add_argument("--auth-key-file", default="",
                   help="the topology's defaults.auth_key_file")
    args = p.parse_args()
    sys.path.insert(0, args.module)
    import dcr

    layout = dcr.Layout(args.layout)
    ranks = ([int(r) for r in args.ranks.split(",")] if args.ranks
             else list(range(layout.ranks)))
    steps = [int(k) for k in args.steps.split(",")]
    producers = {}
    for r in ranks:
        pr = dcr.Producer(layout, r, args.coordinator, timeout_s=args.timeout,
                          auth_key_file=args.auth_key_file,
                          step_log_bytes=args.step_log_bytes)
        if str(r) not in args.no_baseline.split(","):
            pr.set_baseline(read_shards(
                os.path.join(args.ckpt, f"v{args.base}.shards",
                             f"rank-{r:05d}.safetensors")))
        producers[r] = pr
    failed = False
    for k in steps:
        results = {}

        def run(r):
            try:
                shards = read_shards(os.path.join(
                    args.ckpt, f"v{k}.shards", f"rank-{r:05d}.safetensors"))
                if r == args.mutate_rank and k == steps[0]:
                    # The trainer steps again before the decision came.
                    shards = {n: a.copy() for n, a in shards.items()}
                    first = next(iter(shards.values()))
                    timer = threading.Timer(
                        args.mutate_after,
                        lambda: first.__setitem__(0, first[0] ^ 1))
                    timer.start()
                label = k if args.step_label < 0 else args.step_label
                results[r] = producers[r].refit(label, shards)
            except Exception as e:  # reported in the JSON line
                results[r] = {"error": f"{type(e).__name__}: {e}"}

        threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(json.dumps({"step": k, "ranks": {str(r): results[r]
                                               for r in ranks}}), flush=True)
        committed = all(res.get("committed") for res in results.values())
        if committed and args.verify:
            rc = subprocess.call(args.verify.replace("{k}", str(k)),
                                 shell=True)
            if rc != 0:
                print(f"verify failed after step {k}", file=sys.stderr)
                failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
