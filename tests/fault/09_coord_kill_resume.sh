#!/usr/bin/env bash
# Row 9: the coordinator exits after prepare, before commit
# (coord.before_commit=exit: the decision is durable, no COMMIT sent). The
# relays voted and wait for the decision (--prepared-wait), their bits at
# the target but not committed; root.baseline took the target's bits while
# streaming and its record still flags the refit. `dcr refit --resume`
# (same state_dir) takes the refit over at a new epoch, reads the decision
# and commits it: exit 0, every store and the baseline at v1 (bits, by
# digest, and record). (A plain refit would finish it first: row 20.)
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
[[ $RC -eq 86 ]] || { cat "$T/refit.err" >&2; fail "dcr refit exited $RC, want 86"; }
FAULT_T0=$(date +%s.%N)
FAULTS[coord_kill]=1
[[ -s $T/root/current.json ]] || fail "no current.json after the coordinator stopped"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
[[ $(baseline_state) == "0 unfinished" ]] || fail "root.baseline after the stop: $(baseline_state), want step 0 flagged unfinished"
fault_refit "" --resume
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
[[ $(baseline_state) == "1 clean" ]] || fail "root.baseline after --resume: $(baseline_state)"
[[ ! -e $T/root/current.json ]] || fail "current.json left after --resume"
fault_refit "" --resume
[[ $RC -eq 0 ]] || fail "a second --resume exited $RC, want 0 (nothing to do)"
echo "row 9 (SEED=$SEED): ok"
