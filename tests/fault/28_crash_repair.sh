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
# Prints the repair bytes of each repaired node over the crashed refit's
# payload (repair_ratio).
# Usage: 28_crash_repair.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=28
source "$(dirname "$0")/lib.sh"
fault_model 4
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
  report '" ".join("%s=%.3f" % (n, (sum(c["payload_bytes"] for c in r["catch_up"] if n in c["nodes"]) - r["payload_bytes"]) / '"$CRASHED_PAYLOAD"') for n in ("a0", "b1"))'
}
echo "row 28: repair bytes / crashed payload after a commit: $(ratios) (payload $(report 'r["payload_bytes"]'))"
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
echo "row 28: repair bytes / crashed payload after an abort: $(ratios) (payload $(report 'r["payload_bytes"]'))"
echo "row 28 (SEED=$SEED): ok"
