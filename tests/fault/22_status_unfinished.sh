#!/usr/bin/env bash
# Row 22: `dcr status` says what the bits of a store left unfinished are.
# The leaf b1 exits in the middle of XOR apply (relay.apply_chunk=exit@N,
# code 86); the refit commits without it (min_commit 5 of 6,
# committed-partial). b1 is restarted after the refit ended: its record
# names the unfinished refit (base v0, target v1) and its bits are a mix
# of the two, no version. Its STATUS_REPLY carries that entry, and
# `dcr status` shows b1 "unfinished" (text: "UNFINISHED: holds a mix of
# step 0 and step 1 (refit ...)", no step or digest), counts it as not
# serving-ready and exits 1, in text and in JSON; every other relay is
# "current". SEED picks N.
# Usage: 22_status_unfinished.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=22
source "$(dirname "$0")/lib.sh"
fault_model 1
N=$(pick 2 "$((CHUNKS + 1))")
fault_topology 5
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then fault_start b1 "relay.apply_chunk=exit@$N"; else fault_start "$n"; fi
done
fault_snapshot
REFIT_TIMEOUT=5s fault_refit_bg "$V/v1.safetensors"
fault_wait_exit b1 86
FAULT_T0=$(date +%s.%N)
FAULTS[crash_apply]=1
CRASHED+=(b1)  # its store may hold a mix, flagged by its record
fault_refit_wait
fault_check "$V/v1.safetensors" --expect-outcome committed-partial --excluded b1
REFIT=$(python3 -S -c "import json; print(json.load(open('$T/report.json'))['refit'])")
python3 -S -c "import json, sys; r = json.load(open('$T/b1.safetensors.dcr-version'))['in_progress']; sys.exit(0 if r and r['refit'] == '$REFIT' else 1)" ||
  fail "b1's record does not name the unfinished refit $REFIT"

# Back after the refit ended, its journal lost (as a crash of the host
# may leave it; with the journal it would restore its base by itself).
rm -f "$T/b1.safetensors.dcr-journal"
fault_start b1
expect 1 "$DCR" status --topology "$TOPO" -o json
node_json b1 "n['reachable'] and n['state'] == 'unfinished' and not n['serving_ready'] and n['detail'].startswith('idle')"
node_json b1 "n['unfinished']['refit'] == '$REFIT' and n['unfinished']['base']['step'] == 0 and n['unfinished']['target']['step'] == 1"
node_json b1 "n['committed'] is None or n['committed']['step'] == 0"
json "all(n['state'] == 'current' and n['serving_ready'] and n['unfinished'] is None for n in d['nodes'] if n['node'] != 'b1')"
expect 1 "$DCR" status --topology "$TOPO"
grep -qE "^b1 .* - +- +UNFINISHED: holds a mix of step 0 and step 1 \(refit ${REFIT:0:12}\)" "$T/out" ||
  { cat "$T/out" >&2; fail "dcr status text does not show b1 unfinished"; }
[[ $(grep -c "UNFINISHED" "$T/out") -eq 1 ]] || { cat "$T/out" >&2; fail "a relay other than b1 shown unfinished"; }
echo "row 22 (SEED=$SEED, b1 exited at chunk $N of $CHUNKS): ok"
