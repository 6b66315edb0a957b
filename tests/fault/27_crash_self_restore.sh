#!/usr/bin/env bash
# Row 27: relays killed mid-apply restore their base by themselves. The
# head a0 and the leaf b2 exit in the middle of XOR apply
# (relay.apply_chunk=exit@N, code 86, each at its own seed-chosen chunk;
# every chunk before it is queued 20 ms apart, so that the apply workers
# have written some spans when the process dies) with min_commit 4 of 6: the refit commits on the 4 others (3) and ends
# without them. Restarted after it ended, each finds its store's record
# naming the refit unfinished and, in its journal (beside the record, from
# this boot, no yes vote), the old values of every span it touched: it
# writes them back, checks the store hashes to the base, ends the refit
# and logs "restored step 0 after a crash mid-refit". Its bits are v0
# again (dcr verify), its record has nothing unfinished. The next refit
# (v1 -> v2) catches both up from the root's history and commits
# everywhere (0), no manual repair.
# Usage: 27_crash_self_restore.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=27
source "$(dirname "$0")/lib.sh"
fault_model 2
NA=$(pick 3 "$CHUNKS")
NB=$(pick 3 "$CHUNKS" 1)
fault_topology 4
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  case $n in
    a0) fault_start a0 "relay.apply_chunk=exit@$NA;relay.apply_chunk=delay(20)" ;;
    b2) fault_start b2 "relay.apply_chunk=exit@$NB;relay.apply_chunk=delay(20)" ;;
    *) fault_start "$n" ;;
  esac
done
REFIT_TIMEOUT=20s fault_refit_bg "$V/v1.safetensors"
fault_wait_exit a0 86
fault_wait_exit b2 86
FAULT_T0=$(date +%s.%N)
FAULTS[crash_apply]=2
fault_refit_wait
[[ $RC -eq 3 ]] || { cat "$T/refit.err" >&2; fail "the refit exited $RC, want 3 (committed without a0, b2)"; }
refit=$(python3 -S -c "import json; print(json.load(open('$T/a0.safetensors.dcr-version'))['in_progress']['refit'])")
for n in a0 b2; do
  python3 -S -c "import json; assert json.load(open('$T/$n.safetensors.dcr-version'))['in_progress']['refit'] == '$refit'" ||
    fail "$n's record does not name the unfinished refit"
  [[ -s $T/$n.safetensors.dcr-journal ]] || fail "$n left no journal"
  fault_start "$n"
  grep -qE "restored step 0 after a crash mid-refit $refit: [1-9][0-9]* spans, [1-9][0-9]* bytes" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "$n did not restore its base by itself"; }
  python3 -S -c "import json; assert json.load(open('$T/$n.safetensors.dcr-version'))['in_progress'] is None" ||
    fail "$n's record still names an unfinished refit"
  [[ ! -e $T/$n.safetensors.dcr-journal ]] || fail "$n's journal was not removed"
done
verify_all "$V/v0.safetensors" a0 b2
fault_snapshot
fault_refit "$V/v2.safetensors"
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
python3 -S - "$T/report.json" <<'PY' || fail "a0 and b2 should catch up from the history"
import json, sys
d = json.load(open(sys.argv[1]))
got = {n: c["method"] for c in d["catch_up"] for n in c["nodes"]}
assert got.get("a0") == "history" and got.get("b2") == "history", got
PY
echo "row 27 (SEED=$SEED, a0 exited at chunk $NA, b2 at $NB of $CHUNKS): ok"
