#!/usr/bin/env bash
# Row 25: a slow WAN link is not a slow node (issue 15, "Slow is not
# dead"). A --full --no-compress refit where the root paces each of its
# links to R Mbit/s (--link-rate: a WAN slower than the 1 Gbit/s the
# topology declares), heartbeats every 500 ms so that the slow-child hold
# (8 intervals, 4 s) passes well within the stream (and a process that
# stalls for a second on a loaded machine is not silent: 4 intervals),
# 512 KiB chunks, a 2 MiB window. No fault: every relay reads what the root sends as fast as it
# arrives and applies it at once.
# Before the fix the root dropped both heads as "too slow" after 1.6 s and
# adopted their children across the same paced links (more WAN crossings):
# the row failed on every seed tried (adoptions > 0).
# Now the heads report that they keep up (their receive backlog stays
# empty), the root names the link as the bottleneck and cuts no one:
# committed everywhere (exit 0), no adoption, no "too slow" anywhere.
# Usage: 25_slow_link.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=25
source "$(dirname "$0")/lib.sh"
SPAN=262144 # 512 KiB BF16 chunks
RATE=$(pick 20 29)
# About 13 M BF16 parameters (27 MB): some 7.5-11 s per paced link.
"$TRAINGEN" --out "$T/ck" --hidden 256 --layers 8 --vocab 16384 --steps 1 \
  --warmup 1 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck
fault_topology all "window_bytes: 2MiB"
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
fault_start_all
fault_snapshot
REFIT_TIMEOUT=60s
FAULTS[slow_link]=1
t0=$(date +%s.%N)
fault_refit "$V/v1.safetensors" --full --no-compress --link-rate "${RATE}Mbps" \
  --heartbeat 500ms
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded ""
[[ $RC -eq 0 ]] || fail "dcr refit exited $RC"
json 'd["adoptions"] == 0'
for f in "$T/refit.err" "$T"/{a,b}?.log; do
  if grep -E "too slow|out of the refit|adopting|placing" "$f" >&2; then
    fail "$(basename "$f"): a node was cut out or re-parented (above)"
  fi
done
# The root did see the hold, and named the link, not the node.
grep -q "link to a0: the link (or the subtree below) is the bottleneck" "$T/refit.err" ||
  fail "the root never judged its paced link to a0 (no hold?)"
secs=$(python3 -S -c "print(f'{$REFIT_END - $t0:.1f}')")
echo "row 25 (SEED=$SEED, root links paced to $RATE Mbit/s on a 1 Gbit/s topology, $secs s): ok"
