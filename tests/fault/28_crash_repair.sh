#!/usr/bin/env bash
# Row 28: a crashed relay repairs itself, no operator step.
#  1. The head a0 and the leaf b1 exit in the middle of XOR apply of the
#     refit v0 -> v1 (relay.apply_chunk=exit@N, seed-chosen N each) with
#     min_commit 4 of 6: the refit commits on the four others (exit 3).
#  2. Both restart after it ended, their stores a mix of v0 and v1 with
#     nothing left to restore them by themselves (FAULT_REPAIR_BY=root, the
#     default, removes any journal first: the host-crash path; =relay keeps
#     it). The refit v1 -> v2 commits everywhere (exit 0): the root repairs
#     both, whatever else it does, and every store is v2 bit for bit.
#  3. The same with min_commit all (the crashed refit aborts): the refit
#     v2 -> v3 and the repairs commit everywhere.
#  4. b1 exits mid-apply of v3 -> v4 (min_commit 4 again) and stays down
#     for v4 -> v5 too: back, it is repaired and caught up in one rejoin
#     by the refit v5 -> v6 (the change sets of the chain from v3).
#  5. A crash of the host: a2's write-back of v6 -> v7 is held
#     (store.data_sync=delay), a2 is killed -9, a seed-chosen half of the
#     pages v7 changed go back to v6's bits (what never reached the disk)
#     and its record gets another boot's id. Restarted, a2 finds its bits
#     are not v7 and records them as the mix they are (never claiming a
#     version it does not hold); the refit v7 -> v8 repairs it.
# Prints the repair bytes of each repaired node over the crashed refit's
# payload (repair_ratio).
# Usage: 28_crash_repair.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=28
source "$(dirname "$0")/lib.sh"
fault_model 8
BY=${FAULT_REPAIR_BY:-root}
report() {  # report EXPR: EXPR over the report (r)
  python3 -S -c "import json; r = json.load(open('$T/report.json')); print($1)"
}
forget_journals() {
  [[ $BY == relay ]] || rm -f "$T"/*.journal "$T"/*.dcr-journal* 2>/dev/null || true
}
crash_round() {  # crash_round MIN_COMMIT FROM TO WANT_RC
  local from=$2 to=$3 want=$4 na nb
  na=$(pick 2 "$((CHUNKS + 1))" "$to")
  nb=$(pick 2 "$((CHUNKS + 1))" "$((to + 10))")
  stop_relay a0
  stop_relay b1
  fault_start a0 "relay.apply_chunk=exit@$na"
  fault_start b1 "relay.apply_chunk=exit@$nb"
  fault_refit "$V/v$to.safetensors"
  [[ $RC -eq $want ]] || fail "refit to v$to exited $RC, want $want: $(cat "$T/refit.err" | tail -3)"
  fault_wait_exit a0 86
  fault_wait_exit b1 86
  CRASHED_PAYLOAD=$(report 'r["payload_bytes"]')
  forget_journals
  fault_start a0
  fault_start b1
  FAULT_T0=$(date +%s.%N)
}

# 1-2. min_commit 4: the crashed refit commits without them.
fault_topology 4
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do fault_start "$n"; done
crash_round 4 0 1 3
FAULTS[crash_apply]=2
fault_snapshot
fault_refit "$V/v2.safetensors"
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
ratios() {  # per repaired node: (its repair bytes - the refit's payload) / the crashed refit's payload
  # (a node the refit itself brought to the target, its base restored by
  # its journal, got nothing beyond the payload)
  report '" ".join("%s=%.3f" % (n, max(0, sum(c["payload_bytes"] for c in r["catch_up"] if n in c["nodes"]) - (r["payload_bytes"] if any(n in c["nodes"] for c in r["catch_up"]) else 0)) / '"$CRASHED_PAYLOAD"') for n in ("a0", "b1"))'
}
restart_to_committed() {  # seconds from the restart to the end of the refit that repaired them
  python3 -S -c "print('%.2f' % ($REFIT_END - $FAULT_T0))"
}
echo "row 28: repair bytes / crashed payload after a commit: $(ratios) (payload $(report 'r["payload_bytes"]'), crashed refit's $CRASHED_PAYLOAD; repairs $(report '" ".join("%s %s %.2f s" % (c["nodes"][0], c["method"], c["seconds"]) for c in r["catch_up"])'); restart to committed $(restart_to_committed) s)"
[[ $BY == relay ]] || [[ $(report 'sorted(c["method"] for c in r["catch_up"])') == "['repair', 'repair']" ]] ||
  fail "both should be repaired from the history: $(report 'r["catch_up"]')"

# 3. min_commit all: the crashed refit aborts.
MIN_COMMIT=all
sed -i 's/min_commit: 4/min_commit: all/' "$TOPO"
crash_round all 2 3 1
[[ $(report 'r["outcome"]') == aborted ]] || fail "the refit to v3 should abort"
fault_snapshot
fault_refit "$V/v3.safetensors"
fault_check "$V/v3.safetensors" --expect-outcome committed --excluded ""
echo "row 28: repair bytes / crashed payload after an abort: $(ratios) (payload $(report 'r["payload_bytes"]'), crashed refit's $CRASHED_PAYLOAD; repairs $(report '" ".join("%s %s %.2f s" % (c["nodes"][0], c["method"], c["seconds"]) for c in r["catch_up"])'); restart to committed $(restart_to_committed) s)"

# 4. Down for two refits after crashing mid-apply of the first.
sed -i 's/min_commit: all/min_commit: 4/' "$TOPO"
MIN_COMMIT=4
stop_relay b1
fault_start b1 "relay.apply_chunk=exit@$(pick 2 "$((CHUNKS + 1))" 4)"
fault_refit "$V/v4.safetensors"
[[ $RC -eq 3 ]] || fail "refit to v4 exited $RC, want 3"
fault_wait_exit b1 86
CRASHED_PAYLOAD=$(report 'r["payload_bytes"]')
fault_refit "$V/v5.safetensors"
[[ $RC -eq 3 ]] || fail "refit to v5 exited $RC, want 3"
forget_journals
fault_start b1
FAULT_T0=$(date +%s.%N)
fault_snapshot
fault_refit "$V/v6.safetensors"
fault_check "$V/v6.safetensors" --expect-outcome committed --excluded ""
[[ $BY == relay ]] || [[ $(report '[c["method"] for c in r["catch_up"]]') == "['repair']" && $(report 'r["catch_up"][0]["deltas"]') == 3 ]] ||
  fail "b1 should be repaired from the chain v3 -> v6: $(report 'r["catch_up"]')"
echo "row 28: down for two refits: b1 repaired from $(report 'r["catch_up"][0]["deltas"]') deltas, $(report 'r["catch_up"][0]["payload_bytes"]') bytes; restart to committed $(restart_to_committed) s"

# 5. A crash of the host during a2's write-back.
stop_relay a2
fault_start a2 "store.data_sync=delay(600000)"
fault_refit "$V/v7.safetensors"
[[ $RC -eq 0 ]] || fail "refit to v7 exited $RC, want 0"
CRASHED_PAYLOAD=$(report 'r["payload_bytes"]')
python3 -S -c "import json; assert json.load(open('$T/a2.safetensors.dcr-version'))['unsynced']['synced']['step'] == 6" ||
  fail "a2's record does not say v6 was on disk: $(cat "$T/a2.safetensors.dcr-version")"
fault_kill9 a2
python3 -S - "$T/a2.safetensors" "$V/v6.safetensors" "$T/a2.safetensors.dcr-version" "$SEED" <<'PY'
import json, random, sys
store, old, record, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(seed)
a, b = open(store, "rb").read(), open(old, "rb").read()
pages = [p for p in range(0, len(a), 4096) if a[p:p + 4096] != b[p:p + 4096]]
lost = [p for p in pages if rng.random() < 0.5] or pages[:1]
with open(store, "r+b") as f:
    for p in lost:
        f.seek(p)
        f.write(b[p:p + 4096])
r = json.load(open(record))
r["unsynced"]["boot_id"] = "00000000-1111-2222-3333-444444444444"
open(record, "w").write(json.dumps(r, separators=(",", ":")) + "\n")
print(f"row 28: host crash: {len(lost)} of {len(pages)} changed pages lost")
PY
fault_start a2
FAULT_T0=$(date +%s.%N)
python3 -S -c "import json; r = json.load(open('$T/a2.safetensors.dcr-version')); assert r['committed'] is None and r['in_progress']['base']['step'] == 6 and r['in_progress']['target']['step'] == 7" ||
  fail "a2's record does not say its bits are a mix of v6 and v7: $(cat "$T/a2.safetensors.dcr-version")"
expect 1 "$DCR" status --topology "$TOPO" -o json
node_json a2 'n["state"] == "unfinished" and n["committed"] is None'
fault_snapshot
fault_refit "$V/v8.safetensors"
fault_check "$V/v8.safetensors" --expect-outcome committed --excluded ""
[[ $(report '[c["method"] for c in r["catch_up"]]') == "['repair']" ]] ||
  fail "a2 should be repaired from the history: $(report 'r["catch_up"]')"
echo "row 28: host crash: (a2's repair bytes - payload) / v6 -> v7 payload: $(report '"%.3f" % ((r["catch_up"][0]["payload_bytes"] - r["payload_bytes"]) / '"$CRASHED_PAYLOAD"')'); restart to committed $(restart_to_committed) s"
echo "row 28 (SEED=$SEED): ok"
