#!/usr/bin/env bash
# Serving relays (docs/PLACEMENT.md §"Serving relays"): real dcr-relay
# processes whose stores hold a serving engine's ranks, in a tree with a
# canonical node (root -> c0; c0's cluster feeds nothing else; cluster bf16:
# s0 -> s1, a tp 2 server of vLLM names with stacked qkv and gate/up; cluster
# fp8: f0 -> f1, the same server with its attention and MLP weights in FP8:
# qkv and gate/up in blocks, o_proj with one scale per tensor):
#   a. a full refit seeds the serving stores, created as their ranks' shards
#   b. delta refits v1..v3 commit on every node; after each, c0 holds the
#      target bit for bit and every serving rank verifies against it with
#      `dcr layout verify --serving` (FP8 codes and scales as quantized from
#      the target); with --context on the tree is mixed: c0's subtree
#      gets context-coded chunks, the serving subtrees (s0, f0) each one's
#      base-independent copy at the same sequence number
#   c. two serving relays (BF16 s1, FP8 f1) killed mid-refit
#      (relay.apply_chunk=exit@10) restore their ranks' bases through their
#      maps at restart, FP8 codes and scales requantized; the next refit
#      commits
#   d. a bit flipped in a serving store between refits: `dcr inspect
#      --layout` shows other bits, `dcr verify --layout` names the element,
#      the vote names its tensor, a repair round
#      overwrites it, the refit commits
#   e. a node whose serving layout does not fit: dcr refit exits 2 naming
#      it; a relay whose store is not its rank's shards does not start
# Usage: serving_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY LAYOUTS_DIR
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
LAYOUTS=$4
T=$(mktemp -d /tmp/dcr-serving-test.XXXXXX)
declare -A PID=()  # relay name -> pid of the running dcr-relay

trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
unset DCR_FAILPOINTS

# --- Model, layouts, topology ---------------------------------------------
# About 6% of elements change per step: sparse enough for context-coded
# chunks (b).
small_serving_model 4 5e-6
fp8_serving_layout

RELAYS=(c0 s0 s1 f0 f1)
read -r -a PORTS < <(free_ports "$((${#RELAYS[@]} + 1))")
[[ ${#PORTS[@]} -eq $((${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"
port() {  # port NAME: the relay's port
  local i
  for i in "${!RELAYS[@]}"; do [[ ${RELAYS[$i]} == "$1" ]] && echo "${PORTS[$((i + 1))]}"; done
}
node() {  # node NAME [EXTRA]: a node's flow mapping
  echo "      - {name: $1, host: 127.0.0.1, port: $(port "$1"), store: {kind: file, path: \"$T/$1.safetensors\"}${2:-}}"
}
write_topology() {  # write_topology FILE BF16_LAYOUT
  {
    echo "version: 1"
    echo "defaults: {transport: tcp, fanout: 2}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
    echo "clusters:"
    echo "  - name: train"
    echo "    nodes:"
    node c0
    echo "  - name: bf16"
    echo "    serving: {layout: \"$2\"}"
    echo "    nodes:"
    node s0 ", serving: {rank: 0}"
    node s1 ", serving: {rank: 1}"
    echo "  - name: fp8"
    echo "    nodes:"
    node f0 ", serving: {layout: \"$T/fp8.yaml\", rank: 0}"
    node f1 ", serving: {layout: \"$T/fp8.yaml\", rank: 1}"
    echo "links:"
    echo "  - {from: train, to: bf16, bandwidth: 1Gbps, latency: 1ms}"
    echo "  - {from: train, to: fp8, bandwidth: 1Gbps, latency: 1ms}"
  } >"$1"
}
TOPO=$T/tree.yaml
write_topology "$TOPO" "$T/serve.yaml"
expect 0 "$DCR" topo validate "$TOPO"

start_relay() {  # start_relay NAME [ENV...]: in the background
  local n=$1
  shift
  rm -f "$T/$n.ready"
  env "$@" "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
# verify_serving STEP: every store holds vSTEP: c0 bit for bit, each serving
# rank as its layout maps (and quantizes) vSTEP.
verify_serving() {
  local k=$1 layout n r
  expect 0 "$DCR" verify "$T/c0.safetensors" "$V/v$k.safetensors"
  for layout in serve:s fp8:f; do
    rm -rf "$T/ranks"
    mkdir "$T/ranks"
    for r in 0 1; do
      n=${layout#*:}$r
      ln -s "$T/$n.safetensors" "$T/ranks/rank-0000$r.safetensors"
    done
    expect 0 "$DCR" layout verify "$T/${layout%:*}.yaml" --serving \
      --shards "$T/ranks" --canonical "$V/v$k.safetensors" -o json
    json 'd["identical"] and len(d["ranks"]) == 2'
  done
  # One store at a time, as an operator checks a node.
  expect 0 "$DCR" verify "$T/f1.safetensors" "$V/v$k.safetensors" \
    --layout "$T/fp8.yaml" --rank 1
  grep -q "^identical" "$T/out" || fail "dcr verify --layout: $(cat "$T/out")"
}

cp "$V/v0.safetensors" "$T/c0.safetensors"
cp "$V/v0.safetensors" "$T/base.safetensors"
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
grep -q "serves rank 1 of $T/fp8.yaml" "$T/f1.log" || { cat "$T/f1.log" >&2; fail "f1 does not say what it serves"; }

# --- a. A full refit seeds the serving stores ------------------------------
refit_json 0 "$TOPO" --target "$V/v0.safetensors" --full
json 'd["outcome"] == "committed"'
for n in s0 s1 f0 f1; do
  grep -q "created .*$n.safetensors for the full refit" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "$n: store not created"; }
done
verify_serving 0

# --- b. Delta refits commit everywhere --------------------------------------
for k in 1 2; do
  refit_json 0 "$TOPO" --target "$V/v$k.safetensors" --context on
  json 'd["outcome"] == "committed" and d["mode"] == "delta"' \
    'd["context_chunks"] > 0 and d["repair_rounds"] == 0' \
    'd["context_nodes"] == ["c0"]' \
    'd["plain_payload_bytes"] > d["payload_bytes"] > 0' \
    "all(n['code'] == 'ok' for n in d['nodes'])"
  verify_serving "$k"
done

# --- c. A serving relay killed mid-refit ------------------------------------
stop_relay s1
stop_relay f1
# (The pause at the 9th chunk lets the apply workers finish the 8 before.)
for n in s1 f1; do
  start_relay $n "DCR_FAILPOINTS=relay.apply_chunk=delay(300)@9;relay.apply_chunk=exit@10"
done
wait_ready s1 f1
refit_json 1 "$TOPO" --target "$V/v3.safetensors" --context on
json 'd["outcome"] == "aborted"'
for n in s1 f1; do
  for _ in $(seq 50); do kill -0 "${PID[$n]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${PID[$n]}" 2>/dev/null && fail "$n did not exit at its failpoint"
  set +e
  wait "${PID[$n]}"
  rc=$?
  set -e
  [[ $rc -eq 86 ]] || { cat "$T/$n.log" >&2; fail "$n exited $rc, want 86"; }
  unset "PID[$n]"
  start_relay $n
done
wait_ready s1 f1
# (The full refit of v0 was step 1: v2 is step 3.)
for n in s1 f1; do
  grep -Eq "$n: restored step 3 after a crash mid-refit [0-9a-f]+: [1-9][0-9]* spans" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "$n did not restore its base"; }
done
verify_serving 2
refit_json 0 "$TOPO" --target "$V/v3.safetensors" --context on
json 'd["outcome"] == "committed" and d["context_chunks"] > 0'
verify_serving 3

# --- d. A flipped bit is repaired -------------------------------------------
# dcr inspect --layout names a store's rank and its bits digest (what its
# vote compares with the root's); a flipped bit changes it.
expect 0 "$DCR" inspect "$T/f1.safetensors" --layout "$T/fp8.yaml" --rank 1 -o json
json 'd["type"] == "serving store" and d["rank"] == 1 and d["fp8_shards"] == 6' \
  'd["canonical_tensors_held"] == d["canonical_tensors"] and len(d["bits"]) == 32'
bits=$(python3 -c "import json; print(json.load(open('$T/out'))['bits'])")
expect 2 "$DCR" inspect "$T/s0.safetensors" --layout "$T/fp8.yaml" --rank 0
expect_err "does not hold the shards of serving rank 0"
python3 - "$T/f1.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    t = "model.layers.1.mlp.down_proj.weight"
    at = 8 + n + h[t]["data_offsets"][0] + 5
    f.seek(at)
    f.write(bytes([b[at] ^ 0x40]))
PY
expect 0 "$DCR" inspect "$T/f1.safetensors" --layout "$T/fp8.yaml" --rank 1 -o json
json "d['bits'] != '$bits'"
expect 1 "$DCR" verify "$T/f1.safetensors" "$V/v3.safetensors" \
  --layout "$T/fp8.yaml" --rank 1
grep -q "^rank 1 shard 'model.layers.1.mlp.down_proj.weight' element 2 holds " "$T/out" ||
  fail "dcr verify --layout misses the flipped bit: $(cat "$T/out")"
expect 2 "$DCR" verify "$T/f1.safetensors" "$V/v3.safetensors" --layout "$T/fp8.yaml"
expect_err "give --layout and --rank together"
refit_json 0 "$TOPO" --target "$V/v4.safetensors"
json 'd["outcome"] == "committed" and d["repair_rounds"] >= 1'
verify_serving 4

# --- e. Serving setups that do not fit --------------------------------------
# The layout of another model: dcr refit names the node before any relay
# is asked.
sed 's/shape: \[64\]/shape: [65]/' "$T/serve.yaml" >"$T/other.yaml"
write_topology "$T/other-tree.yaml" "$T/other.yaml"
expect 2 "$DCR" refit --topology "$T/other-tree.yaml" --target "$V/v4.safetensors" \
  --progress never
expect_err "node s0 serves rank 0 of $T/other.yaml"
# A relay whose store holds the FP8 rank's shards, started as a BF16 rank.
stop_relay s0
cp "$T/f0.safetensors" "$T/s0.safetensors"
cp "$T/f0.safetensors.dcr-version" "$T/s0.safetensors.dcr-version"
expect 2 "$RELAY" --topology "$TOPO" --node s0
grep -qF "does not hold the shards of serving rank 0 of $T/serve.yaml" "$T/err" ||
  { cat "$T/err" >&2; fail "s0 started on another rank's store"; }
echo "serving: ok"
