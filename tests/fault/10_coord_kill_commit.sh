#!/usr/bin/env bash
# Row 10: the coordinator is killed -9 during its commit phase: b0 sits on
# COMMIT (relay.commit=wait) until the coordinator has died, while it may
# be writing the target into its baseline. a0's subtree committed already;
# b0's commits once it is let go. `dcr refit
# --resume` reads the durable decision: the relays that finished report
# how they ended, and the baseline is (re)written from the recorded target.
# Wanted: exit 0, every store and the baseline at v1.
# Usage: 10_coord_kill_commit.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=10
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b0 ]]; then fault_start b0 "relay.commit=wait($T/b0.go)"; else fault_start "$n"; fi
done
fault_snapshot
fault_refit_bg "$V/v1.safetensors"
fault_wait_log b0 "failpoint relay.commit (hit 1): wait"
COORD=$(pgrep -P "$REFIT_PID" -x dcr || true)
[[ -n $COORD ]] || { touch "$T/b0.go"; fail "no coordinator to kill"; }
kill -KILL "$COORD"
FAULT_T0=$(date +%s.%N)
touch "$T/b0.go"
FAULTS[coord_kill]=1
fault_refit_wait
[[ $RC -eq 137 ]] || fail "dcr refit exited $RC, want 137 (killed)"
fault_wait_idle
fault_refit "" --resume
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
echo "row 10 (SEED=$SEED): ok"
