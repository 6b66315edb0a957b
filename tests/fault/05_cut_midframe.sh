#!/usr/bin/env bash
# Row 5: a connection cut after B bytes, mid-frame. The head a0 sends its
# children the first B bytes of the Nth CHUNK frame and closes their links
# (relay.forward=cut(B)@N); B < 56 cuts inside the header, B >= 56 inside
# the payload. a1 and a2 see their parent link drop mid-frame; a0 connects
# to them again (adoption), they vote no naming what they missed, the
# root's repair round overwrites it and everyone commits (0).
# SEED picks N, B and min_commit.
# Usage: 05_cut_midframe.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=5
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 1 "$((CHUNKS + 1))")
if ((SEED % 3 == 0)); then B=$(pick 1 56 1); else B=$(pick 57 400 1); fi
if ((SEED % 2 == 0)); then MC=all; else MC=4; fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == a0 ]]; then fault_start a0 "relay.forward=cut($B)@$N"; else fault_start "$n"; fi
done
fault_snapshot
fault_refit "$V/v1.safetensors"
fault_wait_log a0 "failpoint relay.forward (hit $N): cut"
FAULTS[cut_midframe]=1
for c in a1 a2; do fault_wait_log "$c" "parent link lost during refit"; done
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
cp "$T/report.json" "$T/out"
# What a1 and a2 lost comes back from a0's resend buffer when it holds the
# frames intact (a cut after a whole frame); a frame a0's own failpoint cut
# comes back in the root's repair round.
if grep -q "may miss chunks" "$T/a0.log" || ! grep -qE "resent [0-9]+ chunks" "$T/a0.log"; then
  json 'd["repair_rounds"] >= 1'
fi
for c in a1 a2; do node_json "$c" 'n["committed"]'; done
echo "row 5 (SEED=$SEED, cut after $B bytes of chunk $N, min_commit $MC): ok"
