#!/usr/bin/env bash
# The relay tree as an operator runs it: real dcr-relay processes on free
# loopback ports, a topology of its own (root + a cluster of 3 and one of
# 2, fanout 2, file stores), and `dcr refit` / `dcr status` against it:
#   a. help and usage errors (exit 2, one-line error)
#   b. delta refits v0 -> v1 -> v2, every store verified bit for bit
#   c. dcr status: every node at step 2 with the target's digest
#   d. a relay whose store was deleted: the delta refit commits on the
#      others and seeds it with a dense copy, no operator step
#   e. min_commit = relays-1 and a leaf killed -9: committed-partial (3)
#   f. Prometheus metrics of a relay started with --metrics-port 0
#   g. SIGTERM stops a relay cleanly (exit 0, "stopping" logged)
# Usage: refit_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
T=$(mktemp -d /tmp/dcr-refit-test.XXXXXX)
declare -A PID=()  # relay name -> pid of the running dcr-relay

trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# --- Models, ports, topologies -------------------------------------------
"$TRAINGEN" --out "$T/ck" --hidden 256 --layers 2 --vocab 8000 --lr 2e-6 \
  --steps 3 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
"$TRAINGEN" --out "$T/other" --hidden 64 --layers 2 --vocab 512 --steps 1 \
  >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen (other)"; }
V=$T/ck

RELAYS=(a0 a1 a2 b0 b1)  # fanout 2: a0 -> {a1, a2}; b0 -> b1
# Free ports, chosen now (the tests may run in parallel): the root's and
# one per relay, all held open together so that they differ.
read -r -a PORTS < <(free_ports "$((${#RELAYS[@]} + 1))")
[[ ${#PORTS[@]} -eq $((${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"

write_topology() {  # write_topology FILE MIN_COMMIT
  local i=1 n
  {
    echo "version: 1"
    # mixed: TCP from the root to both heads and inside rollout-a; UCX
    # inside rollout-b (the cluster's transport; its head's own link, the
    # WAN one, stays TCP by the node's key).
    echo "defaults: {transport: ${TRANSPORT/mixed/tcp}, fanout: 2, min_commit: $2, apply_threads: 3}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
    echo "clusters:"
    echo "  - name: train"
    for c in a b; do
      echo "  - name: rollout-$c"
      echo "    fanout: 2"
      [[ $TRANSPORT == mixed && $c == b ]] && echo "    transport: ucx"
      echo "    nodes:"
      for n in "${RELAYS[@]}"; do
        [[ $n == "$c"* ]] || continue
        local kind=""
        [[ $TRANSPORT == mixed && $n == b0 ]] && kind="transport: tcp, "
        echo "      - {name: $n, ${kind}host: 127.0.0.1, port: ${PORTS[$i]}, store: {kind: file, path: \"$T/$n.safetensors\"}}"
        i=$((i + 1))
      done
    done
    echo "links:"
    echo "  - {from: train, to: rollout-a, bandwidth: 1Gbps, latency: 1ms}"
    echo "  - {from: train, to: rollout-b, bandwidth: 1Gbps, latency: 1ms}"
  } >"$1"
}
TOPO=$T/tree.yaml
TOPO_MC=$T/tree-min-commit.yaml
write_topology "$TOPO" all
write_topology "$TOPO_MC" $((${#RELAYS[@]} - 1))
expect 0 "$DCR" topo validate "$TOPO"
expect 0 "$DCR" topo validate "$TOPO_MC"
expect 0 "$DCR" tree --topology "$TOPO" -o json
json 'len(d["nodes"]) == 6' \
  '[n["name"] for n in d["nodes"] if n["name"] in ("a2", "b1") and not n["children"]] == ["a2", "b1"]'

# Relays: b1 also serves metrics on a port of its choosing.
start_relay() {  # start_relay NAME: starts it in the background (see wait_ready)
  local n=$1 extra=()
  [[ $n == b1 ]] && extra=(--metrics-port 0 --metrics-host 127.0.0.1 --apply-threads 1)
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    "${extra[@]}" >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
wait_ready() {  # wait_ready NAME...: every ready file within 10 s
  local n
  for n in "$@"; do
    for _ in $(seq 100); do
      [[ -s "$T/$n.ready" ]] && break
      kill -0 "${PID[$n]}" 2>/dev/null || { cat "$T/$n.log" >&2; fail "relay $n exited before it was ready"; }
      sleep 0.1
    done
    [[ -s "$T/$n.ready" ]] || { cat "$T/$n.log" >&2; fail "relay $n not ready within 10 s"; }
    python3 -S -c "import json; d=json.load(open('$T/$n.ready')); assert d['node']=='$n' and d['pid']==${PID[$n]} and d['port']>0, d" ||
      fail "ready file of $n"
  done
}
refit_json() {  # refit_json CODE TOPOLOGY ARGS...: dcr refit -o json, exit CODE
  local want=$1 topo=$2
  shift 2
  expect "$want" "$DCR" refit --topology "$topo" --progress never -o json "$@"
  cp "$T/out" "$T/last-refit.json"
}

# --- a. Help and bad usage -----------------------------------------------
for cmd in "$DCR" "$DCR refit" "$DCR status" "$RELAY"; do
  # shellcheck disable=SC2086
  expect 0 $cmd --help
  grep -q "Example" "$T/out" || fail "$cmd --help lacks an example"
done

# Seed: every store and the baseline are copies of v0.
for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

expect 2 "$DCR" refit --topology "$TOPO"
expect_err "--target"
expect 2 "$DCR" refit --topology "$T/nowhere.yaml" --target "$V/v1.safetensors"
expect_err "nowhere.yaml"
expect 2 "$DCR" status --topology "$T/nowhere.yaml"
expect_err "nowhere.yaml"
expect 2 "$DCR" refit --topology "$TOPO" --target "$T/missing.safetensors"
expect_err "missing.safetensors"
expect 2 "$DCR" refit --topology "$TOPO" --target "$T/other/v1.safetensors"
expect_err "does not have the baseline's tensors"
expect 2 "$DCR" refit --topology "$TOPO" --target "$V/v1.safetensors" --timeout 0
expect_err "--timeout"
expect 2 "$RELAY" --topology "$TOPO" --node nosuch
expect_err "no relay named 'nosuch'"
expect 2 "$RELAY"
expect_err "--topology"
expect 2 "$RELAY" --topology "$TOPO"
expect_err "--node"
# Usage errors happen before anything is written: the baseline is v0.
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v0.safetensors"

# --- b. Delta refits v0 -> v1 -> v2 --------------------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
# Each relay listens on the kind of the link into it.
for n in "${RELAYS[@]}"; do
  want=${TRANSPORT/mixed/tcp}
  [[ $TRANSPORT == mixed && $n == b[12] ]] && want=ucx
  grep -q "listening on .* ($want)" "$T/$n.log" || { cat "$T/$n.log" >&2; fail "$n does not listen on $want"; }
  # The topology's defaults.apply_threads, unless --apply-threads says.
  threads=3
  [[ $n == b1 ]] && threads=1
  grep -q "listening on .*; apply threads: $threads\$" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "$n does not apply on $threads threads"; }
done

# Step 1 codes its chunks in the base's context, step 2 does not; both
# end bit-exact, and the history keeps base-independent chunks either way.
for step in 1 2; do
  context=on ctx_check='0 < d["context_chunks"] <= d["chunks"]'
  [[ $step == 2 ]] && context=off ctx_check='d["context_chunks"] == 0'
  refit_json 0 "$TOPO" --target "$V/v$step.safetensors" --context "$context"
  json 'd["outcome"] == "committed" and d["mode"] == "delta" and d["reason"] == ""' \
    "d['base']['step'] == $((step - 1)) and d['target']['step'] == $step" \
    'd["chunks"] > 0 and 0 < d["payload_bytes"] < d["checkpoint_bytes"] / 10' \
    "$ctx_check" \
    '0 < d["change_rate"] < 0.2 and d["changed_elements"] > 0' \
    'd["link_class_bytes"]["wan"] > 0 and d["link_class_bytes"]["lan"] > 0' \
    'd["seconds"]["total"] > 0 and d["epoch"] == '"$step" \
    "len(d['nodes']) == ${#RELAYS[@]}" \
    'all(n["committed"] and n["code"] == "ok" and n["chunks_applied"] == d["chunks"] for n in d["nodes"])'
  verify_all "$V/v$step.safetensors" "${RELAYS[@]}"
  expect 0 "$DCR" verify "$T/base.safetensors" "$V/v$step.safetensors"
done
V2_DIGEST=$(python3 -S -c "import json; print(json.load(open('$T/last-refit.json'))['target']['digest'])")
[[ $V2_DIGEST =~ ^[0-9a-f]{16,}$ ]] || fail "target digest '$V2_DIGEST'"

# --- c. dcr status --------------------------------------------------------
expect 0 "$DCR" status --topology "$TOPO" -o json
json "d['root']['name'] == 'trainer' and d['root']['baseline_version'] == {'step': 2, 'digest': '$V2_DIGEST'}" \
  "d['last_refit']['target']['digest'] == '$V2_DIGEST' and d['last_refit']['outcome'] == 'committed'" \
  "len(d['nodes']) == ${#RELAYS[@]}" \
  "all(n['reachable'] and n['code'] == 'ok' and n['committed'] == {'step': 2, 'digest': '$V2_DIGEST'} for n in d['nodes'])" \
  'all(n["last_refit_result"] == "committed" for n in d["nodes"])'
expect 0 "$DCR" status --topology "$TOPO"
for n in "${RELAYS[@]}"; do
  [[ $(grep -cE "^$n +rollout-.* 2 +${V2_DIGEST:0:12} " "$T/out") -eq 1 ]] ||
    { cat "$T/out" >&2; fail "status text: no single line for $n at step 2"; }
done

# --- d. A relay that lost its store: the next refit seeds it ------------
stop_relay a1
grep -q "stopping" "$T/a1.log" || fail "a1 did not log 'stopping'"
rm -f "$T/a1.safetensors" "$T/a1.safetensors.dcr-version"
start_relay a1
wait_ready a1
expect 0 "$DCR" status --topology "$TOPO" -o json
node_json a1 'n["reachable"] and n["committed"] is None and n["code"] == "needs catch-up"'

refit_json 0 "$TOPO" --target "$V/v3.safetensors"
json 'd["outcome"] == "committed"' 'all(n["committed"] for n in d["nodes"])' \
  'd["catch_up"][0]["method"] == "seed" and d["catch_up"][0]["nodes"] == ["a1"]'
node_json a1 'n["committed"] and n["detail"] == "seeded with a dense copy"'
verify_all "$V/v3.safetensors" "${RELAYS[@]}" base

# --no-compress belongs to full refits.
expect 2 "$DCR" refit --topology "$TOPO" --target "$V/v2.safetensors" --no-compress
grep -q "add --full" "$T/err" || { cat "$T/err" >&2; fail "--no-compress without --full: no hint"; }
# This one in text: a summary line, then one line per node. Uncompressed
# (the transport-only reference): the same bits.
expect 0 "$DCR" refit --topology "$TOPO" --target "$V/v2.safetensors" --full --no-compress --progress never
grep -qE "^refit [0-9a-f]+ committed: step 3 -> 4 " "$T/out" || { cat "$T/out" >&2; fail "refit text summary"; }
grep -q "full refit" "$T/out" || { cat "$T/out" >&2; fail "refit text does not say full"; }
for n in "${RELAYS[@]}"; do
  [[ $(grep -cE "^  $n +rollout-[ab] +committed \([1-9][0-9]* chunks applied\)$" "$T/out") -eq 1 ]] ||
    { cat "$T/out" >&2; fail "refit text: no single line for $n"; }
done
verify_all "$V/v2.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" status --topology "$TOPO" -o json
json 'd["last_refit"]["outcome"] == "committed" and d["last_refit"]["mode"] == "full" and d["last_refit"]["chunks"] > 0' \
  "d['last_refit']['base']['step'] == 3 and d['last_refit']['target'] == {'step': 4, 'digest': '$V2_DIGEST'}" \
  "all(n['committed'] == {'step': 4, 'digest': '$V2_DIGEST'} for n in d['nodes'])"

# --- e. Partial commit: min_commit = relays-1, a leaf killed -9 ----------
disown "${PID[a2]}"  # no "Killed" notice from bash
kill -KILL "${PID[a2]}"
for _ in $(seq 50); do kill -0 "${PID[a2]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${PID[a2]}" 2>/dev/null && fail "a2 survived SIGKILL"
unset "PID[a2]"
refit_json 3 "$TOPO_MC" --target "$V/v3.safetensors"
json 'd["outcome"] == "committed-partial" and "a2" in d["reason"]' \
  "d['base']['step'] == 4 and d['target']['step'] == 5" \
  'all(n["committed"] for n in d["nodes"] if n["node"] != "a2")'
node_json a2 'not n["committed"] and n["code"] == "unreachable"'
V3_DIGEST=$(python3 -S -c "import json; print(json.load(open('$T/last-refit.json'))['target']['digest'])")
verify_all "$V/v3.safetensors" a0 a1 b0 b1
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v3.safetensors"
expect 0 "$DCR" verify "$T/a2.safetensors" "$V/v2.safetensors"  # untouched
expect 1 "$DCR" status --topology "$TOPO_MC" -o json
node_json a2 'not n["reachable"] and n["error"] != ""'

start_relay a2  # comes back at its old version
wait_ready a2
expect 0 "$DCR" status --topology "$TOPO_MC" -o json
node_json a2 "n['reachable'] and n['committed'] == {'step': 4, 'digest': '$V2_DIGEST'}"
json "all(n['committed'] == {'step': 5, 'digest': '$V3_DIGEST'} for n in d['nodes'] if n['node'] != 'a2')"

# --- e2. dcr history: every refit's report, in order ----------------------
LAST_ID=$(python3 -S -c "import json; print(json.load(open('$T/last-refit.json'))['refit'])")
expect 0 "$DCR" history --topology "$TOPO_MC" -n 0 -o json
json 'len(d["reports"]) >= 5' \
  '[r["epoch"] for r in d["reports"]] == sorted(r["epoch"] for r in d["reports"])' \
  "d['reports'][-1]['refit'] == '$LAST_ID'" \
  'd["reports"][-1]["outcome"] == "committed-partial"' \
  'all(r["ended_at"].endswith("Z") for r in d["reports"])'
expect 0 "$DCR" history --topology "$TOPO_MC" -n 2 --plot "$T/history.png"
grep -q '^ENDED  *STEP  *MODE' "$T/out" || fail "dcr history: no table header"
[[ $(grep -c ' -> ' "$T/out") -eq 2 ]] || fail "dcr history -n 2: not 2 rows"
tail -1 "$T/out" | grep -q '4 -> 5 .*committed-partial .* a2$' ||
  fail "dcr history: the last row does not show the partial commit without a2"
[[ $(head -c 8 "$T/history.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] ||
  fail "dcr history --plot: $T/history.png is not a PNG"
# A damaged report is named, the others still listed, exit 1.
DAMAGED=$(find "$T/root/reports" -name '*.json' | sort | head -1)
echo '{"format": 2}' >"$DAMAGED"
expect 1 "$DCR" history --topology "$TOPO_MC" -n 0
grep -q "$DAMAGED" "$T/err" || fail "dcr history does not name the damaged $DAMAGED"
grep -q '4 -> 5' "$T/out" || fail "dcr history: a damaged report hid the others"

# --- f. Metrics of b1 (started with --metrics-port 0) --------------------
MPORT=$(python3 -S -c "import json; print(json.load(open('$T/b1.ready'))['metrics_port'])")
[[ $MPORT -gt 0 ]] || fail "b1's ready file has no metrics port"
python3 - "$MPORT" >"$T/metrics.txt" <<'PY' || fail "cannot scrape b1's metrics"
import sys, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
print(urllib.request.urlopen(url, timeout=5).read().decode())
PY
python3 - "$T/metrics.txt" <<'PY' || { cat "$T/metrics.txt" >&2; fail "metrics"; }
import re, sys
text = open(sys.argv[1]).read()
def value(name):
    m = re.search(r"^" + name + r"\{[^}]*node=\"b1\"[^}]*\} (\S+)$", text, re.M)
    assert m, f"no sample of {name}"
    return float(m.group(1))
for fam in ("dcr_relay_chunks_applied_total", "dcr_relay_committed_step",
            "dcr_relay_bytes_in_total", "dcr_relay_refits_total"):
    assert f"# HELP {fam} " in text, f"no HELP for {fam}"
    assert re.search(rf"^# TYPE {fam} (counter|gauge)$", text, re.M), f"no TYPE for {fam}"
assert value("dcr_relay_chunks_applied_total") > 0
assert value("dcr_relay_committed_step") == 5, value("dcr_relay_committed_step")
assert value("dcr_relay_bytes_in_total") > 0
assert re.search(r'^dcr_relay_refits_total\{node="b1",result="committed"\} [1-9]', text, re.M)
PY

# --- f2. Plans only from ancestors, connections only from topology hosts ---
# A topology where a2 heads rollout-a: a2 passes the plan on to a0 and a1,
# whose own topology says their ancestors are a0 and the trainer.
sed 's|{name: a2, |{name: a2, head: true, |' "$TOPO" >"$T/alt.yaml"
expect 1 "$DCR" refit --topology "$T/alt.yaml" --target "$V/v1.safetensors" \
  --timeout 10s --progress never -o json
node_json a0 'n["code"] == "rejected" and "ancestors in the topology" in n["detail"] and "a2" in n["detail"]'
node_json a1 'n["code"] == "rejected" and "ancestors in the topology" in n["detail"]'
# A connection from an address that is no host of the topology (127.0.0.2)
# is closed at its first frame with a reason (raw frames over a TCP socket:
# TCP links only).
if [[ $TRANSPORT == tcp ]]; then
python3 - "$(dirname "$0")/../fault" "${PORTS[1]}" <<'PY' || fail "a connection from 127.0.0.2 was not refused"
import socket, sys
sys.path.insert(0, sys.argv[1])
import wire
s = socket.socket()
s.bind(("127.0.0.2", 0))
s.connect(("127.0.0.1", int(sys.argv[2])))
s.settimeout(5)
s.sendall(wire.frame(wire.HELLO, wire.hello("intruder")))
data = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    data += b
assert data[5] == 15, f"want ERROR, got frame type {data[5]}"
assert b"topology's hosts" in data, data
PY
fi
expect 0 "$DCR" status --topology "$TOPO" -o json

# --- g. Clean stop ---------------------------------------------------------
stop_relay b0
grep -q "stopping" "$T/b0.log" || { cat "$T/b0.log" >&2; fail "b0 did not log 'stopping'"; }
echo "relay tree: ok"
