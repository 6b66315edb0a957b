#!/usr/bin/env bash
# Row 11 (waits for persisted relay epochs and a stale-epoch sender; not in
# ctest): a coordinator whose state_dir is a copy from before the last
# refit (older epoch) refits the tree.
#   a. relays running since the newer refit refuse its PLAN (rejected,
#      "stale coordinator epoch"): aborted (1), every store unchanged.
#      This part passes today.
#   b. the same after every relay restarted: the epoch must survive the
#      restart (persisted), so the stale PLAN is still refused.
#   c. (to write with the stale-epoch sender) chunks and COMMIT of an old
#      epoch sent on a live refit's link are dropped.
# Usage: 11_stale_coordinator.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=11
source "$(dirname "$0")/lib.sh"
fault_model
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all
cp -a "$T/base.safetensors" "$T/stale-base.safetensors"
for v in 1 2; do  # epochs 1 and 2: everyone at v2
  fault_refit "$V/v$v.safetensors"
  [[ $RC -eq 0 ]] || fail "refit to v$v exited $RC"
done
# A coordinator whose state is from before both: its run takes epoch 1 < 2.
# (A copy from between the two would reuse epoch 2, which relays accept:
# only an older epoch is refused.)
mkdir -p "$T/stale-root"
STALE=$T/stale.yaml
sed -e "s|state_dir: \"$T/root\"|state_dir: \"$T/stale-root\"|" "$TOPO" >"$STALE"
for part in a b; do
  if [[ $part == b ]]; then
    for n in "${RELAYS[@]}"; do kill -TERM "${PID[$n]}"; wait "${PID[$n]}" || true; unset "PID[$n]"; done
    fault_start_all
  fi
  fault_snapshot
  TOPO_SAVE=$TOPO TOPO=$STALE
  REFIT_TIMEOUT=3s fault_refit "$V/v3.safetensors"  # see README: the abort waits a phase timeout
  TOPO=$TOPO_SAVE
  FAULTS[stale_coordinator]=1
  fault_check "$V/v3.safetensors" --expect-outcome aborted --excluded "${RELAYS[*]}"
  cp "$T/report.json" "$T/out"
  json 'all(n["code"] == "rejected" and "stale" in n["detail"] for n in d["nodes"] if n["node"] in ("a0", "b0"))'
done
echo "row 11 (SEED=$SEED): ok"
