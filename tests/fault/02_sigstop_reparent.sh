#!/usr/bin/env bash
# Row 2: SIGSTOP the head a0 when its Nth CHUNK arrives (relay.forward=wait
# holds a0 there until it is stopped). The root hears no heartbeat from a0
# for 4 intervals, fails to adopt it again, adopts a1 and a2 (the repair round resends what
# they missed) and commits on every node but a0 (min_commit 5, exit 3);
# a0, woken by SIGCONT, finds its parent gone and is back at v0.
# Usage: 02_sigstop_reparent.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=2
source "$(dirname "$0")/lib.sh"
fault_model
N=$(pick 2 "$((CHUNKS + 1))")
fault_topology 5
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  # a0 may have voted when it stops: once awake it waits --prepared-wait
  # for a decision that will not come to it, then restores its base.
  if [[ $n == a0 ]]; then
    fault_start a0 "relay.forward=wait($T/a0.go)@$N" --prepared-wait 2s
  else
    fault_start "$n"
  fi
done
fault_snapshot
fault_refit_bg "$V/v1.safetensors"
fault_wait_log a0 "failpoint relay.forward (hit $N): wait"
kill -STOP "${PID[a0]}"
fault_wait_stopped a0
touch "$T/a0.go"  # a0 goes on from there once SIGCONT wakes it
FAULT_T0=$(date +%s.%N)
FAULTS[sigstop]=1
fault_refit_wait   # re-parenting must finish the refit while a0 sleeps
kill -CONT "${PID[a0]}"
fault_check "$V/v1.safetensors" --expect-outcome committed-partial --excluded a0
echo "row 2 (SEED=$SEED): ok"
