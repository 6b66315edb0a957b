#!/usr/bin/env bash
# Row 4: a byte corrupted above TCP (failpoint), detected, never committed.
# SEED picks the chunk N, the place and min_commit:
#   even SEED: relay.apply_chunk=corrupt@N on the leaf b2: it applies a
#     damaged copy, the chunk's checksum fails, b2 votes no;
#   odd SEED: relay.forward=corrupt@N on the head a0: a1 and a2 get a frame
#     whose checksum fails, close the link and restore their base.
#   min_commit all: aborted (1), every store at v0; min_commit = receivers -
#   victims: committed-partial (3), the victims excluded.
# Usage: 04_corrupt_byte.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=4
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 1 "$((CHUNKS + 1))")
if ((SEED % 2 == 0)); then
  WHO=b2 POINT=relay.apply_chunk VICTIMS=(b2)
else
  WHO=a0 POINT=relay.forward VICTIMS=(a1 a2)
fi
if (((SEED / 2) % 2 == 0)); then MC=all; else MC=$((${#RELAYS[@]} - ${#VICTIMS[@]})); fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == "$WHO" ]]; then fault_start "$n" "$POINT=corrupt@$N"; else fault_start "$n"; fi
done
fault_snapshot
fault_refit "$V/v1.safetensors"
fault_wait_log "$WHO" "failpoint $POINT (hit $N): corrupt"
FAULTS[corrupt]=1
# The victims vote no naming the tensor that differs; the root's repair
# round overwrites it and everyone commits, whatever min_commit.
fault_check "$V/v1.safetensors" --expect-outcome committed \
  --corrupt-victims "${VICTIMS[*]}" --excluded ""
cp "$T/report.json" "$T/out"
json 'd["repair_rounds"] >= 1'
for v in "${VICTIMS[@]}"; do node_json "$v" 'n["committed"]'; done
if [[ $POINT == relay.apply_chunk ]]; then
  grep -q "vote no (.*checksum" "$T/b2.log" || { cat "$T/b2.log" >&2; fail "b2's vote does not name the checksum"; }
fi
echo "row 4 (SEED=$SEED, $POINT=corrupt@$N on $WHO, min_commit $MC): ok"
