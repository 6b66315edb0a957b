#!/usr/bin/env bash
# Row 16 (waits for catch-up; not in ctest): the leaf a1 is down while the
# tree goes v0 -> v1 -> v2 (min_commit 5: committed-partial twice), then
# restarts at v0, two versions behind. Wanted: the next refit v2 -> v3
# brings a1 to v3 through catch-up: committed everywhere (0), every store
# v3 bit for bit. Today a1 answers needs catch-up and is excluded.
# Usage: 16_restart_behind.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=16
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology 5
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do [[ $n == a1 ]] || fault_start "$n"; done
for v in 1 2; do
  fault_refit "$V/v$v.safetensors"
  [[ $RC -eq 3 ]] || fail "refit to v$v exited $RC, want 3"
done
fault_start a1
FAULTS[restart_behind]=1
fault_snapshot
fault_refit "$V/v3.safetensors"
fault_check "$V/v3.safetensors" --expect-outcome committed --excluded ""
echo "row 16 (SEED=$SEED): ok"
