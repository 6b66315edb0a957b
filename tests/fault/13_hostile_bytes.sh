#!/usr/bin/env bash
# Row 13: hostile bytes. wire.py hostile connects to the relay b1 directly
# and sends a frame header whose length+reserved bytes read as the u64
# 2^63 (the frame length is a u32: this is the closest a frame gets), one
# with length 2^32-1, a truncated header, and HELLO + a CHUNK whose zstd
# plane declares 2^40 bytes (outside any refit). b1 must close each link
# without allocating for it: it keeps answering dcr status and its RSS does
# not grow by more than 16 MiB. Then a refit in which a proxy in front of
# b1 injects the same zstd-bomb CHUNK into the live stream after chunk K
# (valid frame and chunk checksums, SEED picks K): b1's decoder refuses it
# (bounded by the span size) and logs it; the real chunk of that span
# still applies, so b1's bits are the target's and the refit commits (the
# bits decide the vote). Then, without injection, the next refit
# commits everywhere.
# Usage: 13_hostile_bytes.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=13
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$((CHUNKS + 1))")
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then fault_start b1 "" --behind-proxy; else fault_start "$n"; fi
done
fault_proxy b1 --bomb-after "$K"
rss() { awk '/^VmRSS/ {print $2}' "/proc/${PID[b1]}/status"; }
RSS0=$(rss)
python3 "$FAULT_DIR/wire.py" hostile --port "${SPARE[b1]}" --events "$T/hostile.log" >"$T/out" ||
  fail "hostile client"
cat "$T/out" >&2
# Bad headers: the link is closed at once. The well-formed HELLO is answered
# (a HELLO frame, 56+ bytes) and the CHUNK outside a refit is dropped.
json 'all(d[k].startswith(("closed by the relay", "reset")) for k in ("length_2^63", "length_2^32-1", "truncated_header"))' \
  'd["bomb_outside_refit"].startswith("open after") and int(d["bomb_outside_refit"].split(", ")[1].split()[0]) > 56'
kill -0 "${PID[b1]}" || fail "b1 died of hostile bytes"
RSS1=$(rss)
((RSS1 - RSS0 < 16384)) || fail "b1's RSS grew from $RSS0 kB to $RSS1 kB"
expect 0 "$DCR" status --topology "$TOPO" -o json
node_json b1 'n["reachable"] and n["detail"].startswith("idle")'
FAULTS[hostile_frames]=4

fault_snapshot
fault_refit "$V/v1.safetensors"
grep -q '"event": "bomb"' "$T/proxy-b1.log" || fail "the proxy did not inject the bomb"
FAULTS[zstd_bomb]=1
DETECTED=0
grep -q "refused a chunk since the last vote: .*does not decompress to" "$T/b1.log" && DETECTED=1
fault_check "$V/v1.safetensors" --expect-outcome committed --excluded "" \
  --hostile "1:$DETECTED" --injected-frames 1
cp "$T/report.json" "$T/out"
node_json b1 'n["committed"]'
((DETECTED == 1)) || { cat "$T/b1.log" >&2; fail "b1 did not refuse the zstd bomb"; }
RSS2=$(rss)
((RSS2 - RSS0 < 65536)) || fail "b1's RSS grew from $RSS0 kB to $RSS2 kB after the bomb"

# The next refit, nothing injected (the proxy only passes frames now).
kill -KILL "${XPID[b1]}"
fault_proxy b1
fault_refit "$V/v2.safetensors"
[[ $RC -eq 0 ]] || { cat "$T/report.json" "$T/refit.err" >&2; fail "the refit after the hostile bytes exited $RC"; }
verify_all "$V/v2.safetensors" "${RELAYS[@]}" base
echo "row 13 (SEED=$SEED, bomb after chunk $K; RSS $RSS0 -> $RSS1 -> $RSS2 kB): ok"
