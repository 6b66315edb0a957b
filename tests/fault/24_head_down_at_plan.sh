#!/usr/bin/env bash
# Row 24: a cluster head is down before the refit starts (its port refuses
# connections; issue 15, chaos finding 3). The root re-parents the head's
# live children at PLAN as it does when a head fails mid-refit (it adopts
# them: the only ancestor they take a new refit's PLAN from), and the
# refit commits on the 5 live relays with min_commit 4 (exit 3, only the
# head excluded, reported unreachable). Before the fix the refused
# connection was final: its children were reported unreachable behind it
# and the refit aborted (3 of 6 took the plan). SEED picks the head.
# Usage: 24_head_down_at_plan.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=24
source "$(dirname "$0")/lib.sh"
fault_model
if ((SEED % 2 == 0)); then HEAD=b0; else HEAD=a0; fi
fault_topology 4
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  [[ $n == "$HEAD" ]] || fault_start "$n"
done
fault_snapshot
FAULTS[down]=1
fault_refit "$V/v1.safetensors"
fault_check "$V/v1.safetensors" --expect-outcome committed-partial --excluded "$HEAD"
node_json "$HEAD" 'n["code"] == "unreachable" and "its children were adopted" in n["detail"]'
json 'd["adoptions"] == 2'
echo "row 24 (SEED=$SEED, $HEAD down): ok"
