#!/usr/bin/env bash
# Row 1: SIGKILL a mid-tree relay mid-chunk. The head a0 hangs on its
# actor thread when the Nth CHUNK arrives (relay.forward=hang@N: a1 and a2
# got chunks 1..N-1) and is killed -9 there. The root cannot reach a0
# again and adopts a1 and a2, which vote no (chunks missed), get a repair
# round and commit: min_commit all -> aborted (1), every live store at v0;
# min_commit 3 -> committed-partial (3), only a0 excluded.
# a0's store holds a mix and says so (its record keeps the unfinished
# refit, it refuses deltas); restarted, it restores its base from its
# journal by itself, and the next delta refit commits everywhere.
# SEED picks N and min_commit.
# Usage: 01_kill_midtree.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=1
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 2 "$((CHUNKS + 1))")
if ((SEED % 2 == 0)); then MC=all; else MC=3; fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == a0 ]]; then fault_start a0 "relay.forward=hang@$N"; else fault_start "$n"; fi
done
fault_snapshot
fault_refit_bg "$V/v1.safetensors"
fault_wait_log a0 "failpoint relay.forward (hit $N): hanging"
fault_kill9 a0
FAULTS[sigkill]=1
fault_refit_wait
if [[ $MC == all ]]; then want=aborted excl="${RELAYS[*]}"; else want=committed-partial excl="a0"; fi
fault_check "$V/v1.safetensors" --expect-outcome "$want" --excluded "$excl"
cp "$T/report.json" "$T/out"
node_json a0 'not n["committed"] and n["code"] in ("unreachable", "timeout")'
# a0's record names the unfinished refit: it takes no delta until repaired.
python3 -S -c "import json; assert json.load(open('$T/a0.safetensors.dcr-version'))['in_progress']" ||
  fail "a0's record does not say its refit is unfinished"
fault_start a0
# Restarted, a0 restores its base from its journal by itself (it never
# voted), so dcr status finds no unfinished store (exit 0).
grep -qF "restored step 0 after a crash mid-refit" "$T/a0.log" ||
  { cat "$T/a0.log" >&2; fail "a0 did not restore its base by itself"; }
expect 0 "$DCR" status --topology "$TOPO" -o json
node_json a0 'n["reachable"] and n["state"] != "unfinished"'
# The next delta refit brings the whole tree to v2, a0 included (caught up
# from the history after a commit without it): no manual step.
fault_snapshot
fault_refit "$V/v2.safetensors"
fault_check "$V/v2.safetensors" --expect-outcome committed --excluded ""
echo "row 1 (SEED=$SEED, a0 killed at chunk $N of $CHUNKS, min_commit $MC): ok"
