#!/usr/bin/env bash
# Row 6: the leaf b1 exits in the middle of XOR apply (relay.apply_chunk=
# exit@N, code 86) and is restarted at once, during the same refit. Its
# parent b0 tries it again (every half heartbeat, a few times); the
# restarted b1 finds its record naming this refit and, in its journal (no
# yes vote), what it applied: it restores its base at start, rejoins the
# refit with a normal session, votes no naming the tensors that differ
# (the chunks it missed), and the root's repair round overwrites them: the
# refit commits everywhere (0), every store v1 bit for bit.
# Usage: 06_crash_apply_restart.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=6
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 2 "$((CHUNKS + 1))")
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then fault_start b1 "relay.apply_chunk=exit@$N"; else fault_start "$n"; fi
done
fault_snapshot
# Heartbeats every 2 s: b0's tries span about 6 s, time for the restart
# (exit seen, process start, restore, ready) on a loaded machine.
REFIT_TIMEOUT=20s fault_refit_bg "$V/v1.safetensors" --heartbeat 2s
fault_wait_exit b1 86
FAULT_T0=$(date +%s.%N)
FAULTS[crash_apply]=1
fault_start b1
fault_refit_wait
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
echo "row 6 (SEED=$SEED): ok"
