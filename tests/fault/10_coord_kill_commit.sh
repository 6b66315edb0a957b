#!/usr/bin/env bash
# Row 10 (waits for dcr refit --resume; not in ctest): the coordinator is
# killed -9 in the middle of its COMMIT broadcast: a proxy in front of b0
# would hold the COMMIT frame (a0's subtree commits, b0's does not hear
# it). Wanted: `dcr refit --resume` reads the durable decision and commits
# b0's subtree: exit 0, every store at v1. Today there is no --resume, and
# no hook between two COMMIT sends: this script is the plan, run it once
# --resume and a coord.commit_sent failpoint (or the proxy hold) exist.
# Usage: 10_coord_kill_commit.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=10
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all
fault_snapshot
# b0 sits on COMMIT for 3 s; the coordinator is killed -9 meanwhile.
fault_start b0 "relay.commit=delay(3000)" 2>/dev/null || true
fault_refit_bg "$V/v1.safetensors"
fault_wait_log b0 "failpoint relay.commit (hit 1): delay"
kill -KILL "$(pgrep -P "$REFIT_PID" -x dcr || true)" 2>/dev/null || fail "no coordinator to kill"
FAULTS[coord_kill]=1
fault_refit_wait
fault_wait_idle
fault_refit "$V/v1.safetensors" --resume
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
echo "row 10 (SEED=$SEED): ok"
