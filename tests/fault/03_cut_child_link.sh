#!/usr/bin/env bash
# Row 3: the link between a relay and one child is cut. A proxy between the
# head a0 and its child a1 closes both sides after the Kth CHUNK (between
# frames; SEED picks K). a1 sees its parent link drop and waits to be
# adopted; a0 connects to it again (an adoption), a1 votes no naming what it
# missed, the root's repair round overwrites it, and everyone commits (0)
# whatever min_commit (all, or 5).
# Usage: 03_cut_child_link.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=3
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$CHUNKS")
if ((SEED % 2 == 0)); then MC=all; else MC=5; fi
fault_topology "$MC"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == a1 ]]; then fault_start a1 "" --behind-proxy; else fault_start "$n"; fi
done
fault_proxy a1 --cut-after-chunks "$K"
fault_snapshot
fault_refit_bg "$V/v1.safetensors"
for _ in $(seq 200); do grep -q '"event": "cut"' "$T/proxy-a1.log" 2>/dev/null && break; sleep 0.05; done
grep -q '"event": "cut"' "$T/proxy-a1.log" || fail "the proxy did not cut the link"
FAULT_T0=$(date +%s.%N)
FAULTS[link_cut]=1
fault_refit_wait
fault_wait_log a1 "parent link lost during refit"
fault_wait_log a1 "adopted by a0"
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
cp "$T/report.json" "$T/out"
# (A repair round runs if chunks went by while a1 had no link; a0 may have
# been holding them back then.)
node_json a1 'n["committed"]'
node_json a2 "n['code'] == 'ok' and n['chunks_applied'] >= d['chunks']"
echo "row 3 (SEED=$SEED, a0 -> a1 cut after chunk $K of $CHUNKS, min_commit $MC): ok"
