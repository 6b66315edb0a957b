#!/usr/bin/env bash
# dcr's engine adapters (integrations/dcr_engines, integrations/README.md)
# against real dcr-relay processes: root -> s0, s1 (ranks 0 and 1 of a
# vLLM-style tp 2 serving layout, shm stores with serving sockets), f0
# (rank 0 of the same server with FP8 weights: qkv and gate/up in blocks,
# o_proj with one scale) and c0 (the canonical checkpoint, shm, with a serving
# socket). The engines
# are the call-order harness (engine_harness/: not vLLM, not SGLang):
#   a. after each of 3 refits, two vLLM "direct" ranks, a vLLM "direct"
#      FP8 rank (codes into uint8 parameters, scales), a vLLM
#      "load_weights" rank (inside the layerwise reload calls) and two
#      SGLang ranks (custom weight loader) hold the target bit for bit, the
#      direct ranks in the same storage
#   b. a stale step, an uncommitted step, bad init and update requests
#      are refused, naming what is wrong
#   c. an update holds its image across a commit: the held image keeps its
#      bits, and the source moves once the update finishes
#   d. the relays' --on-commit commands ran once per commit with the
#      committed step (and, on s0, the live image) in their environment
# Usage: engine_adapters_test.sh DCR RELAY TRAINGEN LAYOUTS_DIR PYTHON_DIR
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
LAYOUTS=$4
PYDIR=$5
T=$(mktemp -d /tmp/dcr-engine-adapters-test.XXXXXX)
SHM=dcr-ea-$$
declare -A PID=()

finish() {
  cleanup
  rm -f /dev/shm/$SHM-*
}
trap finish EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
unset DCR_FAILPOINTS
REPO=$(cd "$(dirname "$0")/../.." && pwd)
STEPS=3

# The model, with each version's expected serving ranks beside it.
small_serving_layout
fp8_serving_layout
for l in serve fp8; do  # the same model twice: each layout's ranks beside it
  "$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
    --lr 2e-5 --steps $((STEPS + 1)) --out "$T/ck-$l" --layout "$T/$l.yaml" \
    --serving >/dev/null 2>"$T/traingen.log" ||
    { cat "$T/traingen.log" >&2; fail "traingen"; }
done
cmp "$T/ck-serve/v$STEPS.safetensors" "$T/ck-fp8/v$STEPS.safetensors" ||
  fail "dcr-traingen is not deterministic"

read -r -a PORTS < <(free_ports 5)
[[ ${#PORTS[@]} -eq 5 ]] || fail "could not pick free ports"
TOPO=$T/tree.yaml
cat >"$TOPO" <<YAML
version: 1
defaults: {transport: tcp, fanout: 2}
root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: "$T/root", baseline: "$T/base.safetensors"}
clusters:
  - name: train
  - name: serve
    serving: {layout: "$T/serve.yaml"}
    nodes:
      - {name: s0, host: 127.0.0.1, port: ${PORTS[1]}, store: {kind: shm, path: /$SHM-s0}, serving: {rank: 0, socket: "$T/s0.sock"}}
      - {name: s1, host: 127.0.0.1, port: ${PORTS[2]}, store: {kind: shm, path: /$SHM-s1}, serving: {rank: 1, socket: "$T/s1.sock"}}
  - name: fp8
    nodes:
      - {name: f0, host: 127.0.0.1, port: ${PORTS[4]}, store: {kind: shm, path: /$SHM-f0}, serving: {layout: "$T/fp8.yaml", rank: 0, socket: "$T/f0.sock"}}
  - name: canon
    nodes:
      - {name: c0, host: 127.0.0.1, port: ${PORTS[3]}, store: {kind: shm, path: /$SHM-c0}}
links:
  - {from: train, to: serve, bandwidth: 1Gbps, latency: 1ms}
  - {from: train, to: canon, bandwidth: 1Gbps, latency: 1ms}
  - {from: train, to: fp8, bandwidth: 1Gbps, latency: 1ms}
YAML
expect 0 "$DCR" topo validate "$TOPO"
cp "$T/ck-serve/v0.safetensors" "$T/base.safetensors"

start_relay() {  # start_relay NAME [ARG...]
  local n=$1
  shift
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    --serving-deadline 2s "$@" >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
HOOK='echo "$DCR_NODE $DCR_STEP [$DCR_IMAGE]" >>'
start_relay s0 --on-commit "$HOOK $T/hooks.log"
start_relay s1
start_relay f0
start_relay c0 --serving-socket "$T/c0.sock" --on-commit "$HOOK $T/hooks.log"
wait_ready s0 s1 f0 c0

refit_json 0 "$TOPO" --target "$T/ck-serve/v0.safetensors" --full
json 'd["outcome"] == "committed"'

/usr/bin/python3 "$(dirname "$0")/engine_adapters_check.py" "$PYDIR" "$REPO" \
  "$DCR" "$TOPO" "$T/ck" "$SHM" "$T" "$STEPS" >"$T/check.log" 2>&1 ||
  { cat "$T/check.log" >&2; for n in s0 s1 f0 c0; do tail -20 "$T/$n.log" >&2; done; fail "engine adapters"; }
cat "$T/check.log"

# d. One command per commit, after it: steps 1 (the seed) to STEPS + 2.
want=$(for k in $(seq 1 $((STEPS + 2))); do
  echo "c0 $k [shm:/$SHM-c0.$(((k - 1) % 2))]"
  echo "s0 $k [shm:/$SHM-s0.$(((k - 1) % 2))]"
done | sort)
for _ in $(seq 100); do
  [[ $(sort "$T/hooks.log" 2>/dev/null) == "$want" ]] && break
  sleep 0.1
done
[[ $(sort "$T/hooks.log") == "$want" ]] ||
  fail "on-commit commands: got $(sort "$T/hooks.log" | tr '\n' ';'), want $(echo "$want" | tr '\n' ';')"
grep -q "s0: on-commit command for step $((STEPS + 2)) exited 0" "$T/s0.log" ||
  fail "s0's log lacks its on-commit command"
echo "PASS engine adapters"
