#!/usr/bin/env python3
"""End-state checker of the fault matrix (tests/fault/README.md).

  check.py snapshot --dcr DCR --dir T --nodes "a0 a1 ..." --alive "a0 ..."
      prints, as JSON, every store's version digest and version record and
      every running relay's counters: the state before a refit.
  check.py check --dcr DCR --dir T --nodes ... --alive ... --crashed ...
      --checkpoints DIR --target CKPT --report FILE --rc N --status FILE
      --row N --seed S --faults "type=count,..." [--t0 S --t-end S]
      [--out FILE] [--expect-outcome O] [--excluded a,b] [--tainted N=FILE]
      [--corrupt-victims a,b] [--injected-frames N] [--hostile INJ:DET]
      checks the invariants after the refit (below); exit 1 with one line
      per violation. With --out, appends one JSON line of metrics.

Invariants, per receiver (store T/NAME.safetensors, record
T/NAME.safetensors.dcr-version):
  - committed at the target (record) <=> the report says committed, and
    then its bits are the target's (dcr verify);
  - otherwise its bits are exactly what it held before the refit (its base,
    or what a row damaged on purpose: --tainted), never a mix or another
    version, and it is not in the middle of a refit;
  - a relay that died mid-refit (--crashed) may hold a mix only while its
    record says the refit is unfinished (it then refuses deltas);
  - a running relay's `dcr status` version is its record's;
  - every receiver is in the report; the report's outcome matches the
    exit code (0 committed, 3 committed-partial, 1 aborted); the root's
    baseline is the target iff something committed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request


def inspect_digest(dcr, path):
    if not os.path.exists(path):
        return None
    p = subprocess.run([dcr, "inspect", path, "-o", "json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return "unreadable"
    return json.loads(p.stdout)["version_digest"]


def verify(dcr, a, b):
    return subprocess.run([dcr, "verify", a, b], capture_output=True).returncode


def record(path):
    try:
        return json.load(open(path + ".dcr-version"))
    except FileNotFoundError:
        return None


def metrics(tdir, node):
    try:
        port = json.load(open(f"{tdir}/{node}.ready"))["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=3).read().decode()
    except Exception:  # a dead relay: unknown
        return None
    out = {}
    for m in re.finditer(r"^(dcr_relay_[a-z_]+)\{([^}]*)\} (\S+)$", text, re.M):
        name, labels, value = m.groups()
        if "result=" in labels:
            name += "_" + re.search(r'result="([^"]*)"', labels).group(1)
        elif "child=" in labels:
            continue
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def words(s):
    return [w for w in (s or "").replace(",", " ").split() if w]


def snapshot(a):
    out = {"nodes": {}}
    alive = set(words(a.alive))
    for n in words(a.nodes) + ["base"]:
        path = f"{a.dir}/{n}.safetensors"
        out["nodes"][n] = {
            "digest": inspect_digest(a.dcr, path),
            "record": record(path),
            "metrics": metrics(a.dir, n) if n in alive else None,
        }
    json.dump(out, sys.stdout)


def check(a):
    bad = []
    pre = json.load(open(f"{a.dir}/pre.json"))["nodes"]
    ckpts = {}
    for f in sorted(os.listdir(a.checkpoints)):
        if f.endswith(".safetensors"):
            p = os.path.join(a.checkpoints, f)
            ckpts[inspect_digest(a.dcr, p)] = p
    target = inspect_digest(a.dcr, a.target)
    try:
        report = json.load(open(a.report))
    except (OSError, ValueError):
        report = None
    try:
        status = {n["node"]: n for n in json.load(open(a.status))["nodes"]}
    except (OSError, ValueError, KeyError):
        status = {}
    alive = set(words(a.alive))
    crashed = set(words(a.crashed))
    tainted = dict(t.split("=", 1) for t in a.tainted)

    # The coordinator's outcome and exit code.
    want_rc = {"committed": 0, "committed-partial": 3, "aborted": 1}
    if report is not None:
        if want_rc.get(report.get("outcome")) != a.rc:
            bad.append(f"report outcome {report.get('outcome')} but exit code {a.rc}")
        # null: the run ended before it hashed the target (the digest
        # comes at END), which only an abort may do.
        got = report["target"]["digest"]
        if got != target and not (got is None and report.get("outcome") == "aborted"):
            bad.append("the report's target is not the target checkpoint")
    elif a.rc in (0, 3):
        bad.append(f"exit code {a.rc} without a JSON report")
    if a.expect_outcome:
        got = report["outcome"] if report else f"no report (exit {a.rc})"
        if got != a.expect_outcome:
            bad.append(f"outcome {got}, want {a.expect_outcome}")
    rep = {n["node"]: n for n in (report or {}).get("nodes", [])}

    corrupted = partial_commits = wrong_base = double_xor = 0
    extra_chunks = counted = 0
    metrics_known = False
    excluded = []
    for n in words(a.nodes):
        path = f"{a.dir}/{n}.safetensors"
        bits = inspect_digest(a.dcr, path)
        rec = record(path)
        committed = (rec or {}).get("committed") or {}
        in_progress = (rec or {}).get("in_progress")
        # A relay that was behind commits the catch-up refit that brought
        # it to the target (the report's catch_up entries).
        refits = set() if report is None else {report["refit"]} | {
            c["refit"] for c in report.get("catch_up", [])
            if n in c["nodes"] and c["outcome"] != "aborted"}
        at_target = committed.get("digest") == target and (
            report is None or committed.get("refit") in refits)
        before = tainted.get(n)
        before_digest = inspect_digest(a.dcr, before) if before else pre[n]["digest"]
        r = rep.get(n)
        if report is not None and r is None:
            bad.append(f"{n}: missing from the report")
        if r is not None and not r["committed"]:
            excluded.append(n)
        wrong = False
        if at_target:
            if bits != target or verify(a.dcr, path, a.target) != 0:
                bad.append(f"{n}: committed the target but its bits are not the target's")
                partial_commits += 1
                wrong = True
            if r is not None and not r["committed"]:
                bad.append(f"{n}: at the target but the report excludes it")
        else:
            if r is not None and r["committed"]:
                bad.append(f"{n}: the report says committed, its record does not")
                partial_commits += 1
            if n in crashed and in_progress is not None:
                pass  # holds a mix, and says so: refuses deltas until repaired
            elif bits != before_digest:
                what = ("the target's bits without committing it" if bits == target
                        else f"version {ckpts[bits]}" if bits in ckpts
                        else "a mix of versions")
                bad.append(f"{n}: not committed and holds {what}, not what it held before")
                corrupted += 1
                wrong = True
                if report is not None and before_digest != report["base"]["digest"]:
                    wrong_base += 1
            elif before and verify(a.dcr, path, before) != 0:
                bad.append(f"{n}: dcr verify against {before} fails")
                corrupted += 1
            elif not before and before_digest in ckpts and verify(a.dcr, path, ckpts[before_digest]) != 0:
                bad.append(f"{n}: dcr verify against {ckpts[before_digest]} fails")
                corrupted += 1
            if n not in crashed and in_progress is not None:
                bad.append(f"{n}: running, yet its record says refit {in_progress.get('refit')} is unfinished")
        if n in alive:
            s = status.get(n)
            if s is None or not s.get("reachable"):
                bad.append(f"{n}: running but not answering dcr status")
            else:
                sv = (s.get("committed") or {}).get("digest")
                if sv != committed.get("digest"):
                    bad.append(f"{n}: dcr status says {sv}, its record {committed.get('digest')}")
            m0, m1 = pre[n]["metrics"], metrics(a.dir, n)
            if m0 and m1 and report is not None:
                metrics_known = True
                got = (m1.get("dcr_relay_chunks_received_total", 0)
                       - m0.get("dcr_relay_chunks_received_total", 0))
                extra = max(0, int(got) - report["chunks"])
                extra_chunks += extra
                counted += 1
                if extra and (wrong or (r is not None and r["code"] == "digest mismatch")):
                    double_xor += 1
    if a.excluded is not None and sorted(excluded) != sorted(words(a.excluded)):
        bad.append(f"excluded {sorted(excluded)}, want {sorted(words(a.excluded))}")

    # The root's baseline advances only on commit, to the target's bits.
    base_path = f"{a.dir}/base.safetensors"
    base_bits = inspect_digest(a.dcr, base_path)
    if report is not None and report["outcome"] != "aborted":
        if base_bits != target:
            bad.append("committed, but the root's baseline is not the target")
    elif base_bits != pre["base"]["digest"]:
        bad.append("nothing committed, but the root's baseline changed")

    victims = words(a.corrupt_victims)
    injected = len(victims)
    # A victim's damage was detected if it voted no: it is excluded, or the
    # root ran a repair round (only a no vote naming tensors starts one).
    repaired = bool(report and report.get("repair_rounds", 0) > 0)
    detected = sum(1 for v in victims
                   if v in rep and ((not rep[v]["committed"] and rep[v]["code"] != "ok")
                                    or (repaired and rep[v]["committed"])))
    if a.hostile:
        i, d = (int(x) for x in a.hostile.split(":"))
        injected += i
        detected += d
    retrans = max(0, extra_chunks - a.injected_frames) if metrics_known else None
    t0 = float(a.t0) if a.t0 else None
    t_end = float(a.t_end) if a.t_end else None
    line = {
        "row": a.row,
        "seed": a.seed,
        "ok": not bad,
        "outcome": report["outcome"] if report else None,
        "exit_code": a.rc,
        "faults": {k: int(v) for k, v in (f.split("=") for f in words(a.faults))},
        "receivers": len(words(a.nodes)),
        "excluded": sorted(excluded),
        "corrupted_receivers": corrupted,
        "commits_on_partial_state": partial_commits,
        "wrong_baseline_applies": wrong_base,
        "double_xor_applies": double_xor if metrics_known else None,
        "corruptions_injected": injected,
        "corruptions_detected": detected,
        "recovery_s": round(t_end - t0, 3) if t0 and t_end else None,
        # chunk frames a receiver got beyond one per chunk (resends, not the
        # duplicates a row injected), over the chunk frames of one copy
        # each; bytes are not counted per chunk by the relays.
        "retransmitted_chunks": retrans,
        "retransmit_fraction": (round(retrans / (report["chunks"] * counted), 6)
                                if retrans is not None and counted and report["chunks"]
                                else None),
        # overwrite bytes of the root's repair rounds over the payload
        "retransmitted_bytes_fraction": (
            round(report.get("repair_bytes", 0) / report["payload_bytes"], 6)
            if report and report.get("payload_bytes") else None),
        "payload_bytes": report["payload_bytes"] if report else None,
        # dcr refit --node runs the row needed (must be 0: repairs are
        # automatic), and the bytes of the root's repairs of stores left
        # with an unfinished refit's mix over the refit's payload
        "manual_repairs": a.manual_repairs,
        "repair_bytes_fraction": (
            round(sum(c["payload_bytes"] for c in report.get("catch_up", [])
                      if c.get("repaired")) / report["payload_bytes"], 6)
            if report and report.get("payload_bytes") else None),
        "violations": bad,
    }
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(line) + "\n")
    for b in bad:
        print(f"end state: {b}", file=sys.stderr)
    print(f"row {a.row} seed {a.seed}: {line['outcome']} (exit {a.rc}), "
          f"excluded {line['excluded']}, {len(bad)} violations", file=sys.stderr)
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["snapshot", "check"])
    p.add_argument("--dcr", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", required=True)
    p.add_argument("--alive", default="")
    p.add_argument("--crashed", default="")
    p.add_argument("--checkpoints")
    p.add_argument("--target")
    p.add_argument("--report")
    p.add_argument("--rc", type=int)
    p.add_argument("--status")
    p.add_argument("--row", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--faults", default="")
    p.add_argument("--t0", default="")
    p.add_argument("--t-end", default="")
    p.add_argument("--out", default="")
    p.add_argument("--expect-outcome")
    p.add_argument("--excluded")
    p.add_argument("--tainted", action="append", default=[])
    p.add_argument("--corrupt-victims", default="")
    p.add_argument("--injected-frames", type=int, default=0)
    p.add_argument("--hostile", default="")
    p.add_argument("--manual-repairs", type=int, default=0)
    a = p.parse_args()
    if a.mode == "snapshot":
        snapshot(a)
        return 0
    return check(a)


if __name__ == "__main__":
    sys.exit(main())
