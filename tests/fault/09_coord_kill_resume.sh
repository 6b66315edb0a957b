#!/usr/bin/env bash
# Row 9 (waits for dcr refit --resume; not in ctest): the coordinator exits
# after prepare, before commit (coord.before_commit=exit: the decision is
# durable), then `dcr refit --resume` finishes the refit. Wanted: exit 0,
# every store and the baseline at v1. Today the relays restore v0 when the
# root's link drops and there is no --resume.
# Usage: 09_coord_kill_resume.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=9
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all
fault_snapshot
COORD_FAILPOINTS=coord.before_commit=exit fault_refit "$V/v1.safetensors"
[[ $RC -eq 86 ]] || fail "dcr refit exited $RC, want 86"
FAULTS[coord_kill]=1
fault_wait_idle
fault_refit "$V/v1.safetensors" --resume
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
echo "row 9 (SEED=$SEED): ok"
