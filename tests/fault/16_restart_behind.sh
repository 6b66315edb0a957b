#!/usr/bin/env bash
# Row 16: a relay restarts versions behind and catches up.
#  1. The leaf a1 is down while the tree goes v0 -> v1 -> v2 (min_commit 5:
#     committed-partial twice), then restarts at v0, two versions behind.
#     The refit v2 -> v3 commits the others, then brings a1 from v0 to v3
#     with the composition of the three deltas in root.state_dir/history:
#     committed everywhere (exit 0), every store v3 bit for bit.
#  2. a1 misses v4; the history is lost; a1 restarts at v3. The refit to
#     v5 falls back to a dense copy for a1: committed everywhere again.
# Usage: 16_restart_behind.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=16
source "$(dirname "$0")/lib.sh"
fault_model 5
fault_topology 5
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do [[ $n == a1 ]] || fault_start "$n"; done
# The refits that fill the history send context-coded chunks: the history
# must still hold base-independent ones, since the catch-up composes them
# with no base.
for v in 1 2; do
  fault_refit "$V/v$v.safetensors" --context on
  [[ $RC -eq 3 ]] || fail "refit to v$v exited $RC, want 3"
  python3 -S -c "import json, sys; sys.exit(json.load(open('$T/report.json'))['context_chunks'] == 0)" ||
    fail "refit to v$v should have sent context-coded chunks"
done
[[ $(ls "$T/root/history" | wc -l) -eq 2 ]] || fail "the history should hold 2 deltas"
fault_start a1
FAULTS[restart_behind]=1
fault_snapshot
fault_refit "$V/v3.safetensors" --context on
fault_check "$V/v3.safetensors" --expect-outcome committed --excluded ""
catch_up() {  # catch_up KEY: the report's first catch-up entry's KEY
  python3 -S -c "import json, sys; print(json.load(open('$T/report.json'))['catch_up'][0][sys.argv[1]])" "$1"
}
[[ $(catch_up method) == history && $(catch_up deltas) == 3 ]] ||
  fail "a1 should catch up from 3 history deltas: $(catch_up method) $(catch_up deltas)"

stop_relay a1
fault_refit "$V/v4.safetensors"
[[ $RC -eq 3 ]] || fail "refit to v4 exited $RC, want 3"
rm -f "$T/root/history/"*
fault_start a1
fault_snapshot
fault_refit "$V/v5.safetensors"
fault_check "$V/v5.safetensors" --expect-outcome committed --excluded ""
[[ $(catch_up method) == dense ]] || fail "without history a1 should get a dense copy"
echo "row 16 (SEED=$SEED): ok"
