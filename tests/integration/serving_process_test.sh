#!/usr/bin/env bash
# A serving process on a relay's store (include/dcr/serving.h, docs/PROTOCOL.md
# §"The pause protocol"): real dcr-relay processes, root -> s0 -> s1, s0 and s1
# serving ranks 0 and 1 of a tp 2 layout from shm stores, s0 with a serving
# socket and a Python server (serving_server.py, dcr.Receiver) on it:
#   a. a full refit seeds s0's two images; the server maps the live one
#   b. delta refits commit; after each the server runs on the target (the
#      live image verifies against it) and s0 reports the pause
#   c. an abort after the server said ready: no flip, no pause
#   d. a server that never answers: s0 votes no after its deadline; the
#      refit aborts; the next one commits once the server answers again
#   e. a server killed mid-pause: the refit stands, the old image catches
#      up, a new server maps the live one
#   f. a relay killed while its server is paused: the server moves by the
#      header alone; the restarted relay catches up once the server
#      left the old image, and the next refit commits
#   g. a second server without a socket, in a long step: the relay does not
#      catch up the image it computes on until it moves (its reader lock)
# Throughout, the server never computes on two versions: each step's
# version stamp is the same before and after it, and the weights it read
# did not change under it.
# Usage: serving_process_test.sh DCR RELAY TRAINGEN LAYOUTS_DIR PYTHON_DIR
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
LAYOUTS=$4
PYDIR=$5
T=$(mktemp -d /tmp/dcr-serving-process-test.XXXXXX)
SHM=dcr-sp-$$
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

small_serving_model 8

read -r -a PORTS < <(free_ports 4)
[[ ${#PORTS[@]} -eq 4 ]] || fail "could not pick free ports"
SOCK=$T/s0.sock
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
      - {name: s0, host: 127.0.0.1, port: ${PORTS[1]}, store: {kind: shm, path: /$SHM-s0}, metrics_port: ${PORTS[3]}, serving: {rank: 0, socket: "$SOCK"}}
      - {name: s1, host: 127.0.0.1, port: ${PORTS[2]}, store: {kind: shm, path: /$SHM-s1}, serving: {rank: 1}}
links:
  - {from: train, to: serve, bandwidth: 1Gbps, latency: 1ms}
YAML
expect 0 "$DCR" topo validate "$TOPO"
cp "$V/v0.safetensors" "$T/base.safetensors"

start_relay() {  # start_relay NAME [ENV...]
  local n=$1
  shift
  rm -f "$T/$n.ready"
  env "$@" "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    --serving-deadline 1s >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}
CTL=$T/ctl
mkdir -p "$CTL"
start_server() {
  rm -f "$CTL/state.json"
  /usr/bin/python3 "$(dirname "$0")/serving_server.py" "$PYDIR" "shm:/$SHM-s0" \
    "$SOCK" "$CTL" >>"$T/server.log" 2>&1 &
  PID[srv]=$!
}
state() {  # state EXPR: EXPR holds for d = the server's state.json, within 10 s
  for _ in $(seq 100); do
    if [[ -s $CTL/state.json ]] && python3 -S -c "import json,sys; d=json.load(open('$CTL/state.json')); sys.exit(0 if ($1) else 1)" 2>/dev/null; then
      return 0
    fi
    kill -0 "${PID[srv]}" 2>/dev/null || { cat "$T/server.log" >&2; fail "the server exited"; }
    sleep 0.1
  done
  cat "$CTL/state.json" "$T/server.log" >&2 || true
  fail "server state: not true within 10 s: $1"
}
# live_image: the image the header names (its second byte word).
live_image() {
  python3 -S -c "import struct; print(struct.unpack_from('<Q', open('/dev/shm/$SHM-s0.live','rb').read(), 16)[0])"
}
flips() {
  python3 -S -c "import struct; print(struct.unpack_from('<Q', open('/dev/shm/$SHM-s0.live','rb').read(), 48)[0])"
}
# verify_live K: s0's live image and s1's store hold vK as their ranks map it.
verify_live() {
  expect 0 "$DCR" verify "/dev/shm/$SHM-s0.$(live_image)" "$V/v$1.safetensors" \
    --layout "$T/serve.yaml" --rank 0
  expect 0 "$DCR" verify "/dev/shm/$SHM-s1" "$V/v$1.safetensors" \
    --layout "$T/serve.yaml" --rank 1
}
wait_log() {  # wait_log NAME PATTERN: the relay's log shows it within 10 s
  for _ in $(seq 100); do grep -Eq "$2" "$T/$1.log" && return 0; sleep 0.1; done
  cat "$T/$1.log" >&2
  fail "$1's log lacks /$2/"
}

start_relay s0
start_relay s1
wait_ready s0 s1

# --- a. A full refit seeds both images ------------------------------------
refit_json 0 "$TOPO" --target "$V/v0.safetensors" --full
json 'd["outcome"] == "committed"'
wait_log s0 "image 0 is live at step 1"
wait_log s0 "shm:/$SHM-s0.1 caught up with step 1"
verify_live 0
start_server
state 'd["step"] == 1 and d["attached"] and d["image"] == 0'

# --- b. Delta refits: the server moves to each target ---------------------
for k in 1 2; do
  refit_json 0 "$TOPO" --target "$V/v$k.safetensors"
  json 'd["outcome"] == "committed"' "all(n['code'] == 'ok' for n in d['nodes'])"
  # s0 answered once its server ran on the target: the report says so.
  node_json s0 "'serving process moved in' in n['detail']"
  state "d['step'] == $((k + 1)) and d['image'] == $((k % 2))"
  wait_log s0 "runs on step $((k + 1)) \(paused [0-9.]+ ms after COMMIT"
  verify_live "$k"
done
# The pause shows in `dcr status` and the relay's metrics.
expect 0 "$DCR" status --topology "$TOPO" -o json
node_json s0 "'serving process attached, image 0 live, last pause' in n['detail']"
python3 -S - "${PORTS[3]}" <<'PY' || fail "s0's metrics lack the pauses"
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
lines = dict(l.rsplit(" ", 1) for l in text.splitlines() if l.startswith("dcr_relay_serving"))
assert lines['dcr_relay_serving_pauses_total{node="s0"}'] == "2", lines
assert 0 < float(lines['dcr_relay_serving_pause_seconds{node="s0"}']) < 1, lines
assert lines['dcr_relay_serving_attached{node="s0"}'] == "1", lines
PY

# --- c. An abort after the server said ready ------------------------------
prepares=$(python3 -S -c "import json; print(json.load(open('$CTL/state.json'))['prepares'])")
stop_relay s1
start_relay s1 "DCR_FAILPOINTS=relay.vote=exit"
wait_ready s1
f=$(flips)
refit_json 1 "$TOPO" --target "$V/v3.safetensors"
json 'd["outcome"] == "aborted"'
state "d['prepares'] > $prepares and d['step'] == 3"
[[ $(flips) -eq $f ]] || fail "an aborted refit flipped the images"
set +e; wait "${PID[s1]}"; set -e
unset "PID[s1]"
start_relay s1
wait_ready s1
# (s1 voted yes before it died: it holds v3 prepared until the root's
# decision reaches it, at the next refit.)
expect 0 "$DCR" verify "/dev/shm/$SHM-s0.$(live_image)" "$V/v2.safetensors" \
  --layout "$T/serve.yaml" --rank 0

# --- d. A server that never answers ---------------------------------------
touch "$CTL/hang"
sleep 0.3
refit_json 1 "$TOPO" --target "$V/v3.safetensors"
json 'd["outcome"] == "aborted"'
node_json s0 "'did not answer the pause request' in n['detail']"
[[ $(flips) -eq $f ]] || fail "a refit flipped under a server that did not answer"
rm "$CTL/hang"
state "d['step'] == 3"
refit_json 0 "$TOPO" --target "$V/v3.safetensors"
json 'd["outcome"] == "committed"'
state "d['step'] == 4"
verify_live 3

# --- e. A server killed mid-pause -----------------------------------------
# `hold`: the server answers the refit's pause request, then stops polling
# until the file goes: paused, however long the checks below take.
touch "$CTL/hold"
refit_json 0 "$TOPO" --target "$V/v4.safetensors"
kill -KILL "${PID[srv]}"
json 'd["outcome"] == "committed"'
node_json s0 "'serving process had not moved within 1000 ms' in n['detail']"
wait "${PID[srv]}" 2>/dev/null || true
unset "PID[srv]"
wait_log s0 "detached: .*during its pause"
wait_log s0 "caught up with step 5"
rm "$CTL/hold"
start_server
state 'd["step"] == 5 and d["attached"]'
verify_live 4

# --- f. A relay killed while its server is paused -------------------------
touch "$CTL/hold"
refit_json 0 "$TOPO" --target "$V/v5.safetensors"
json 'd["outcome"] == "committed"'
kill -KILL "${PID[s0]}"
wait "${PID[s0]}" 2>/dev/null || true
unset "PID[s0]"
# Released, the server moves by the header, with no relay to tell it.
rm "$CTL/hold"
state 'd["step"] == 6 and not d["attached"]'
start_relay s0
wait_ready s0
state 'd["attached"]'
wait_log s0 "caught up with step 6"
refit_json 0 "$TOPO" --target "$V/v6.safetensors"
json 'd["outcome"] == "committed"'
state 'd["step"] == 7'
verify_live 6

# --- g. A second server without a socket, slow ---------------------------
# No message reaches it; its reader lock alone keeps the relay off the
# image it computes on until it moves.
CTL2=$T/ctl2
mkdir -p "$CTL2"
echo 5 >"$CTL2/slow"
/usr/bin/python3 "$(dirname "$0")/serving_server.py" "$PYDIR" "shm:/$SHM-s0" \
  "" "$CTL2" >>"$T/server2.log" 2>&1 &
PID[srv2]=$!
for _ in $(seq 100); do [[ -s $CTL2/state.json ]] && break; sleep 0.1; done
[[ -s $CTL2/state.json ]] || { cat "$T/server2.log" >&2; fail "server 2 did not start"; }
sleep 0.3  # inside its 5 s step
refit_json 0 "$TOPO" --target "$V/v7.safetensors"
json 'd["outcome"] == "committed"'
state 'd["step"] == 8'
grep -q "caught up with step 8" "$T/s0.log" &&
  fail "s0 caught up while server 2 still computed on the old image"
rm "$CTL2/slow"
wait_log s0 "caught up with step 8"
touch "$CTL2/stop"
set +e; wait "${PID[srv2]}"; set -e
unset "PID[srv2]"

# --- The servers never computed on two versions ---------------------------
touch "$CTL/stop"
set +e; wait "${PID[srv]}"; set -e
unset "PID[srv]"
cat "$CTL2/steps.log" >>"$CTL/steps.log"
python3 -S - "$CTL/steps.log" <<'PY' || fail "a server computed on a mix (steps.log above)"
import sys
seen = {}
bad = []
lines = open(sys.argv[1]).read().split("\n")[:-1]
for line in lines:
    before, after, image, fp = line.split()
    if before != after or fp == "MIXED":
        bad.append(line)
    seen.setdefault(before, set()).add(fp)
bad += [f"step {s}: {len(f)} fingerprints" for s, f in seen.items() if len(f) > 1]
if bad or len(seen) < 6:
    print("\n".join(bad) or f"only steps {sorted(seen)}", file=sys.stderr)
    sys.exit(1)
PY
# --- h. A GPU server where the relay cannot map GPU buffers ---------------
# It names a CUDA IPC manifest socket (docs/PROTOCOL.md §"GPU servers").
# On this host (no GPU, or a build without CUDA) the relay refuses the
# buffers with the reason: the server is told why and is never usable.
# Where a GPU is usable the relay gets further (tests/cuda covers that).
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "h. skipped: a GPU is usable here (tests/cuda/cuda_serving_test.cc)"
else
/usr/bin/python3 - "$PYDIR" "$SOCK" "$T/ipc.sock" >"$T/gpu.out" 2>&1 <<'PY' ||
import sys
sys.path.insert(0, sys.argv[1])
import dcr
try:
    r = dcr.GpuReceiver(sys.argv[2], sys.argv[3], wait=5.0, quiesce=lambda: None)
except RuntimeError as e:
    print("refused:", e)
    sys.exit(0)
print("usable without GPU buffers:", r.usable)
sys.exit(1)
PY
  { cat "$T/gpu.out" >&2; fail "the GPU server was not refused"; }
grep -q "did not attach the GPU buffers within 5000 ms: the GPU buffers exported on $T/ipc.sock were refused" "$T/gpu.out" ||
  { cat "$T/gpu.out" >&2; fail "the refusal does not give the relay's reason"; }
grep -Eq "no usable CUDA device|built without CUDA" "$T/gpu.out" ||
  { cat "$T/gpu.out" >&2; fail "the refusal does not say why"; }
wait_log s0 "were refused"
fi
echo "PASS serving process"
