#!/usr/bin/env python3
"""Codec figures (DESIGN.md §6, issue: foundation) on traingen pairs.

For each change rate (1%, 3%, 5% by default) it generates a consecutive
checkpoint pair with tools' dcr-traingen (real Adam steps, BF16), then:
  - codec_bench sizes: payload vs the order-0 entropy floor and vs the dense
    XOR mask through zstd -1 (same pair);
  - dcr diff / apply / verify end to end (file size, bit-exact check);
  - zstd --patch-from and xdelta3 sizes on the same pair, when installed;
  - codec_bench speed: diff+encode and decode+apply throughput with 1 and 2
    threads (ratios are measured in the same run).
Prints a table and writes bench/results/codec.json.

Usage: bench/codec_figures.py [--build-dir build] [--work /tmp/dcr-bench]
                              [--rates 1,3,5] [--quick] [--no-external]
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# lr giving about this change rate per step on the default traingen model
# (measured: tools/src/traingen.cc --help).
LR_FOR_RATE = {1: 6e-7, 3: 2.2e-6, 5: 4.2e-6}
TARGETS = {
    "payload_over_floor": 1.10,
    "payload_over_dense_zstd1": 0.55,
    "encode_gbps_1t": 1.0,
    "decode_apply_gbps_1t": 2.0,
    "encode_scaling_2t": 1.7,
    "decode_apply_scaling_2t": 1.7,
}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def gen_pair(args, rate, model):
    d = os.path.join(args.work, f"rate{rate}" + ("-quick" if args.quick else ""))
    stamp = os.path.join(d, "traingen.json")
    key = {"lr": LR_FOR_RATE[rate], **model}
    if os.path.exists(stamp):
        with open(stamp) as f:
            old = json.load(f)
        if old.get("key") == key:
            return d, old["report"]
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd = [os.path.join(args.build_dir, "tools", "dcr-traingen"), "--out", d,
           "--steps", "1", "--lr", str(LR_FOR_RATE[rate]), "-o", "json"]
    for k, v in model.items():
        cmd += [f"--{k}", str(v)]
    report = json.loads(run(cmd).stdout)
    with open(stamp, "w") as f:
        json.dump({"key": key, "report": report}, f)
    return d, report


def external_sizes(d):
    out = {}
    v0, v1 = os.path.join(d, "v0.safetensors"), os.path.join(d, "v1.safetensors")
    if shutil.which("zstd"):
        p = os.path.join(d, "patch.zst")
        t = time.time()
        run(["zstd", "-q", "-f", "-3", "--long=30", f"--patch-from={v0}", v1, "-o", p])
        out["zstd_patch_from_bytes"] = os.path.getsize(p)
        out["zstd_patch_from_seconds"] = time.time() - t
        os.remove(p)
    if shutil.which("xdelta3"):
        p = os.path.join(d, "patch.vcdiff")
        t = time.time()
        run(["xdelta3", "-e", "-f", "-B", str(1 << 30), "-s", v0, v1, p])
        out["xdelta3_bytes"] = os.path.getsize(p)
        out["xdelta3_seconds"] = time.time() - t
        os.remove(p)
    return out


def end_to_end(args, d):
    dcr = os.path.join(args.build_dir, "src", "cli", "dcr")
    v0, v1 = os.path.join(d, "v0.safetensors"), os.path.join(d, "v1.safetensors")
    delta, work = os.path.join(d, "v1.dcr"), os.path.join(d, "work.safetensors")
    diff = json.loads(run([dcr, "diff", v0, v1, "-o", delta, "--format", "json"]).stdout)
    shutil.copyfile(v0, work)
    apply = json.loads(run([dcr, "apply", delta, work, "-o", "json"]).stdout)
    run([dcr, "verify", work, v1])  # exit 0 iff bit-identical
    os.remove(work)
    return {"file_bytes": diff["file_bytes"], "diff_seconds": diff["seconds"],
            "apply_seconds": apply["seconds"], "verified": True}


def speed(args, d):
    bench = os.path.join(args.build_dir, "bench", "codec_bench")
    v0, v1 = os.path.join(d, "v0.safetensors"), os.path.join(d, "v1.safetensors")
    out = run([bench, "speed", "--base", v0, "--target", v1,
               "--benchmark_format=json", "--benchmark_repetitions=3",
               f"--benchmark_min_time={0.2 if args.quick else 1}"]).stdout
    res = {}
    # The median of three repetitions: these machines are shared and noisy.
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            res[b["run_name"].replace("/real_time", "")] = b["bytes_per_second"] / 1e9
    return {
        "encode_gbps_1t": res["BM_Encode/1"],
        "encode_gbps_2t": res["BM_Encode/2"],
        "decode_apply_gbps_1t": res["BM_DecodeApply/1"],
        "decode_apply_gbps_2t": res["BM_DecodeApply/2"],
        "encode_scaling_2t": res["BM_Encode/2"] / res["BM_Encode/1"],
        "decode_apply_scaling_2t": res["BM_DecodeApply/2"] / res["BM_DecodeApply/1"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="/tmp/dcr-bench-codec")
    ap.add_argument("--rates", default="1,3,5")
    ap.add_argument("--quick", action="store_true",
                    help="small model (smoke run; figures not representative)")
    ap.add_argument("--no-external", action="store_true",
                    help="skip zstd --patch-from and xdelta3")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "codec.json"))
    args = ap.parse_args()
    model = ({"hidden": 256, "layers": 2, "vocab": 4000} if args.quick else
             {"hidden": 1024, "layers": 8, "vocab": 32000})
    rows = []
    for rate in [int(r) for r in args.rates.split(",")]:
        print(f"rate {rate}%: generating pair", file=sys.stderr)
        d, report = gen_pair(args, rate, model)
        bench = os.path.join(args.build_dir, "bench", "codec_bench")
        sizes = json.loads(run([bench, "sizes", "--base", os.path.join(d, "v0.safetensors"),
                                "--target", os.path.join(d, "v1.safetensors")]).stdout)
        row = {"nominal_rate_pct": rate, "lr": LR_FOR_RATE[rate], **sizes}
        row["payload_over_floor"] = sizes["payload_bytes"] / sizes["floor_bytes"]
        row["payload_over_dense_zstd1"] = sizes["payload_bytes"] / sizes["dense_xor_zstd1_bytes"]
        row["traingen_floor_bytes"] = report["steps"][0]["floor_bytes"]
        print(f"rate {rate}%: dcr diff/apply/verify", file=sys.stderr)
        row.update(end_to_end(args, d))
        if not args.no_external:
            print(f"rate {rate}%: zstd --patch-from, xdelta3", file=sys.stderr)
            row.update(external_sizes(d))
        print(f"rate {rate}%: throughput", file=sys.stderr)
        row.update(speed(args, d))
        rows.append(row)

    def fmt_mb(b):
        return f"{b / 1e6:8.2f}" if b is not None else "       -"

    print()
    print(f"model: {rows[0]['elements']:,} BF16 elements, checkpoint "
          f"{rows[0]['checkpoint_bytes'] / 1e6:.1f} MB; sizes in MB, speeds in GB/s of canonical bytes")
    hdr = (f"{'change':>7} {'floor':>8} {'dcr':>8} {'dcr/floor':>9} {'xor+zstd1':>9} "
           f"{'dcr/xz1':>7} {'patch-from':>10} {'xdelta3':>8} {'enc 1t':>6} {'enc 2t':>6} "
           f"{'dec 1t':>6} {'dec 2t':>6}")
    print(hdr)
    for r in rows:
        print(f"{100 * r['change_rate']:6.2f}% {fmt_mb(r['floor_bytes'])} {fmt_mb(r['payload_bytes'])} "
              f"{r['payload_over_floor']:9.3f} {fmt_mb(r['dense_xor_zstd1_bytes'])} "
              f"{r['payload_over_dense_zstd1']:7.3f} "
              f"{fmt_mb(r.get('zstd_patch_from_bytes')):>10} {fmt_mb(r.get('xdelta3_bytes'))} "
              f"{r['encode_gbps_1t']:6.2f} {r['encode_gbps_2t']:6.2f} "
              f"{r['decode_apply_gbps_1t']:6.2f} {r['decode_apply_gbps_2t']:6.2f}")
    checks = {}
    for key, target in TARGETS.items():
        vals = [r[key] for r in rows]
        ok = all(v <= target for v in vals) if key.startswith("payload") else all(v >= target for v in vals)
        checks[key] = {"target": target, "worst": max(vals) if key.startswith("payload") else min(vals),
                       "pass": ok}
    print()
    for key, c in checks.items():
        rel = "<=" if key.startswith("payload") else ">="
        print(f"  {'PASS' if c['pass'] else 'MISS'}  {key:26s} worst {c['worst']:.3f} (target {rel} {c['target']})")
    result = {
        "benchmark": "codec",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "quick": args.quick,
        "model": model,
        "rows": rows,
        "checks": checks,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}")
    return 0 if all(c["pass"] for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
