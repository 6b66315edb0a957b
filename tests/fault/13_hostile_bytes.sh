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
# b1 runs without --memory-limit (the default limit, derived from the
# machine, bounds it) and with a 1 s HELLO deadline. Each peer it cuts off
# is logged (one line each, rate-limited, naming the address and the
# reason) and counted in dcr_relay_peers_cut_total{reason}: bad headers
# (bad_frame), the truncated header (truncated), a HELLO naming a node the
# topology does not have (unknown_node, answered with an ERROR). Then 200
# links that never greet: those beyond the default limit's slots are
# closed as they open (links_full, summarized once the log's rate is
# spent) and the rest at the HELLO deadline (hello_timeout), RSS flat.
# Frames above the default cap's bound (40 MiB) are refused at their
# header, and after 12 links sent 32 MiB of frames each and closed, b1's
# RssAnon returns to within 32 MiB of where it was (freed frames given
# back to the system).
# Then 80 links that greet and stay silent fill every slot: `dcr status`
# still gets in within a few seconds, taking the slot of one silent for
# 2 s (evicted). b2 applies slowly (25 ms a chunk) under a 300 ms idle
# timeout, and the last refit runs without heartbeats: its parent link,
# silent while b2 applies, is never cut.
# Usage: 13_hostile_bytes.sh [DCR DCR_RELAY TRAINGEN]
set -euo pipefail
ROW=13
source "$(dirname "$0")/lib.sh"
fault_model
K=$(pick 1 "$((CHUNKS + 1))")
fault_topology all
fault_seed "$V/v0.safetensors" "${RELAYS[@]}" base
for n in "${RELAYS[@]}"; do
  if [[ $n == b1 ]]; then
    fault_start b1 "" --behind-proxy --hello-timeout 1s
  elif [[ $n == b2 ]]; then
    fault_start b2 "relay.apply_chunk=delay(25)" --idle-timeout 300ms
  else
    fault_start "$n"
  fi
done
fault_proxy b1 --bomb-after "$K"
rss() { awk '/^VmRSS/ {print $2}' "/proc/${PID[b1]}/status"; }
RSS0=$(rss)
python3 "$FAULT_DIR/wire.py" hostile --port "${SPARE[b1]}" --events "$T/hostile.log" >"$T/out" ||
  fail "hostile client"
cat "$T/out" >&2
# Bad headers: the link is closed at once. The well-formed HELLO is answered
# (a HELLO frame, 56+ bytes) and the CHUNK outside a refit is dropped.
# A HELLO naming a node the topology does not have is refused with an
# ERROR (a frame: 56+ bytes), then closed.
json 'all(d[k].startswith(("closed by the relay", "reset")) for k in ("length_2^63", "length_2^32-1", "truncated_header"))' \
  'd["bomb_outside_refit"].startswith("open after") and int(d["bomb_outside_refit"].split(", ")[1].split()[0]) > 56' \
  'd["unknown_node"].startswith("closed by the relay after") and int(d["unknown_node"].split()[5]) > 56'
kill -0 "${PID[b1]}" || fail "b1 died of hostile bytes"
RSS1=$(rss)
((RSS1 - RSS0 < 16384)) || fail "b1's RSS grew from $RSS0 kB to $RSS1 kB"
expect 0 "$DCR" status --topology "$TOPO" -o json
node_json b1 'n["reachable"] and n["detail"].startswith("idle")'
FAULTS[hostile_frames]=5
# Each cut-off peer left a line naming its address and the reason.
for why in bad_frame truncated unknown_node; do
  grep -Eq "b1: cut off 127\.0\.0\.1:[0-9]+: $why: " "$T/b1.log" ||
    { cat "$T/b1.log" >&2; fail "b1 logged no cut-off for $why"; }
done
grep -q "b1: default memory limit " "$T/b1.log" || fail "b1 did not log its default memory limit"
metrics() {
  python3 -S - "$T/$1.ready" <<'PY'
import json, sys, urllib.request
port = json.load(open(sys.argv[1]))["metrics_port"]
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
PY
}
cut() { awk -v r="reason=\"$2\"" 'index($0, "dcr_relay_peers_cut_total{") == 1 && index($0, r) {print $2}' <<<"$1"; }

# Links that never greet: beyond the slots closed at once, the rest at the
# HELLO deadline; none left open, RSS flat.
python3 "$FAULT_DIR/wire.py" squat --port "${SPARE[b1]}" --conns 200 --hold 6 >"$T/out" ||
  fail "squat client"
cat "$T/out" >&2
json 'd["opened"] >= 100' 'd["open_at_end"] == 0' 'd["refused"] >= 1' \
  'd["closed_later"] >= 1 and all(0.8 <= t <= 3 for t in d["closed_after_s"] if t >= 0.5)'
RSS2=$(rss)
((RSS2 - RSS0 < 16384)) || fail "b1's RSS grew from $RSS0 kB to $RSS2 kB after 200 idle links"
fault_wait_log b1 "more peers cut off and not logged: links_full " 5

# Frames are bounded without --memory-limit: a 40 MiB frame is refused at
# its header (the default cap's frame bound is at most 31 MiB).
python3 "$FAULT_DIR/wire.py" flood --port "${SPARE[b1]}" --conns 4 --frame-mib 40 --whole 0 \
  --hold 1 >"$T/out" || fail "flood client"
json 'd["open"] == 0 and d["closed"] == 4'
# Links that sent 32 MiB of frames each, then closed: their memory goes
# back to the system (RssAnon back within 32 MiB of where it was; without
# it glibc kept about 57 MiB).
anon() { awk '/^RssAnon/ {print $2}' "/proc/${PID[b1]}/status"; }
ANON0=$(anon)
python3 "$FAULT_DIR/wire.py" flood --port "${SPARE[b1]}" --conns 12 --frame-mib 8 --whole 3 \
  --hold 1 >"$T/out" || fail "flood client"
json 'd["sent_bytes"] >= (4 * 32) << 20'
for _ in $(seq 50); do (($(anon) - ANON0 < 32768)) && break; sleep 0.1; done
ANON1=$(anon)
((ANON1 - ANON0 < 32768)) || fail "b1 still holds $(((ANON1 - ANON0) / 1024)) MiB more RssAnon 5 s after the flood's links closed"

# Links that greet and stay silent hold every slot; a real peer still gets
# in (dcr status through the proxy), taking a silent one's slot.
rm -f "$T/squat.ready"
python3 "$FAULT_DIR/wire.py" squat --port "${SPARE[b1]}" --conns 80 --hello b2 --hold 20 \
  --ready "$T/squat.ready" >"$T/squat.json" &
XPID[squat]=$!
for _ in $(seq 100); do [[ -s $T/squat.ready ]] && break; sleep 0.05; done
[[ -s $T/squat.ready ]] || fail "the squat client did not open its links"
t0=$(date +%s%N) tries=0 in_after=
while (($(date +%s%N) - t0 < 10000000000)); do
  tries=$((tries + 1))
  "$DCR" status --topology "$TOPO" --timeout 1s -o json >"$T/out" 2>"$T/err" || true
  if python3 -S -c "import json,sys; sys.exit(0 if any(n['node']=='b1' and n['reachable'] for n in json.load(open('$T/out'))['nodes']) else 1)" 2>/dev/null; then
    in_after=$((($(date +%s%N) - t0) / 1000000))
    break
  fi
  sleep 0.2
done
kill -TERM "${XPID[squat]}"
wait "${XPID[squat]}" || true
unset "XPID[squat]"
cat "$T/squat.json" >&2
[[ -n $in_after ]] || fail "dcr status could not reach b1 for 10 s while 80 silent links held its slots"
# (Eviction starts after 2 s of silence; each try costs a dcr and a Python
# run: 8 s leaves room on a loaded machine.)
((in_after <= 8000)) || fail "dcr status reached b1 only after $in_after ms"
m=$(metrics b1)
for why in bad_frame truncated unknown_node links_full hello_timeout evicted; do
  n=$(cut "$m" "$why")
  ((${n:-0} >= 1)) || { grep peers_cut <<<"$m" >&2; fail "b1 counted ${n:-no} cut-offs for $why"; }
done

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
RSS3=$(rss)
((RSS3 - RSS0 < 65536)) || fail "b1's RSS grew from $RSS0 kB to $RSS3 kB after the bomb"

# The next refit, nothing injected (the proxy only passes frames now), and
# no heartbeats: b2's parent link is silent while b2 applies (about 1 s)
# and b2's idle timeout is 300 ms, yet the refit's parent keeps its link.
kill -KILL "${XPID[b1]}"
fault_proxy b1
fault_refit "$V/v2.safetensors" --heartbeat 0
[[ $RC -eq 0 ]] || { cat "$T/report.json" "$T/refit.err" >&2; fail "the refit after the hostile bytes exited $RC"; }
! grep "cut off" "$T/b2.log" || fail "b2 cut a link off during the refit without heartbeats"
verify_all "$V/v2.safetensors" "${RELAYS[@]}" base
echo "row 13 (SEED=$SEED, bomb after chunk $K; RSS $RSS0 -> $RSS1 -> $RSS2 -> $RSS3 kB; dcr status in after $in_after ms, $tries tries, past 80 silent links): ok"
