#!/usr/bin/env bash
# Row 12 (waits for Ed25519 root signatures; not in ctest): a peer with the
# hop key (HMAC) but not the root's signing key injects a CHUNK into a live
# refit. The proxy in front of b1 injects a well-formed CHUNK of the live
# refit (valid frame and chunk checksums; with a key it would carry a valid
# hop tag) after chunk K. Wanted: b1 drops it as unsigned, never applies
# it, and the refit commits everywhere (0). Today b1 tries to apply it and
# votes no, so the refit aborts.
# Usage: 12_forged_chunk.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=12
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$((CHUNKS + 1))")
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then fault_start b1 "" --behind-proxy; else fault_start "$n"; fi
done
fault_proxy b1 --bomb-after "$K"  # any forged chunk will do
fault_snapshot
fault_refit "$V/v1.safetensors"
grep -q '"event": "bomb"' "$T/proxy-b1.log" || fail "nothing injected"
FAULTS[forged_chunk]=1
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
echo "row 12 (SEED=$SEED): ok"
