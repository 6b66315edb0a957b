#!/usr/bin/env bash
# Row 8: a receiver on the wrong baseline. One relay's store holds v2 (or
# v3) while the tree refits v0 -> v1; SEED picks whether it is the head b0
# (mid-tree: it must still forward to b1, b2) or the leaf b1, and
# min_commit. The relay refuses the plan (needs catch-up at plan), applies
# nothing (its bits stay the wrong version), and is excluded: min_commit
# all -> aborted (1), every store as it was; min_commit 5 ->
# committed-partial (3), everyone else at v1.
# Usage: 08_wrong_baseline.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=8
source "$(dirname "$0")/lib.sh"
fault_model
if ((SEED % 2 == 0)); then WHO=b0; else WHO=b1; fi
WRONG=$V/v$((2 + SEED / 2 % 2)).safetensors
if ((SEED / 4 % 2 == 0)); then MC=5; else MC=all; fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_seed "$WRONG" "$WHO"
fault_start_all
fault_snapshot
fault_refit "$V/v1.safetensors"
FAULTS[wrong_baseline]=1
if [[ $MC == all ]]; then want=aborted excl="${RELAYS[*]}"; else want=committed-partial excl=$WHO; fi
fault_check "$V/v1.safetensors" --expect-outcome "$want" --excluded "$excl"
cp "$T/report.json" "$T/out"
node_json "$WHO" 'not n["committed"] and n["code"] == "needs catch-up" and n["phase"] == "plan" and n["chunks_applied"] == 0'
expect 0 "$DCR" verify "$T/$WHO.safetensors" "$WRONG"
if [[ $want == committed-partial ]]; then verify_all "$V/v1.safetensors" $(printf '%s\n' "${RELAYS[@]}" | grep -vx "$WHO"); fi
echo "row 8 (SEED=$SEED, $WHO on $(basename "$WRONG"), min_commit $MC): ok"
