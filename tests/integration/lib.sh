# Helpers shared by the integration tests. Source it after setting T (the
# test's temp dir): commands' stdout goes to $T/out, stderr to $T/err.
# shellcheck shell=bash

fail() { echo "FAIL: $*" >&2; exit 1; }

# The kind of every tree link in the topologies the tests write
# (DCR_TEST_TRANSPORT: tcp, the default, or ucx; ctest runs the link tests
# over both; refit_test.sh also takes "mixed": TCP across the WAN, UCX
# inside one cluster). UCX on loopback runs over its TCP transport.
TRANSPORT=${DCR_TEST_TRANSPORT:-tcp}
case $TRANSPORT in
  tcp) ;;
  ucx | mixed) export UCX_TLS=${UCX_TLS:-tcp} UCX_WARN_UNUSED_ENV_VARS=n ;;
  *) echo "DCR_TEST_TRANSPORT must be tcp, ucx or mixed, not '$TRANSPORT'" >&2; exit 2 ;;
esac

# expect CODE CMD...: runs CMD and checks its exit code.
expect() {
  local want=$1
  shift
  set +e
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  set -e
  [[ $got -eq $want ]] || {
    cat "$T/out" "$T/err" >&2
    fail "exit $got, want $want: $*"
  }
}

# expect_err TEXT: the last command's error is one line and contains TEXT.
expect_err() {
  [[ $(wc -l <"$T/err") -eq 1 ]] || { cat "$T/err" >&2; fail "error is not one line"; }
  grep -qF -- "$1" "$T/err" || { cat "$T/err" >&2; fail "error lacks '$1'"; }
}

# free_ports N: N distinct ports free now, printed on one line. They come
# from below the kernel's ephemeral range, so that no process's own
# ephemeral sockets (UCX's TCP transport listens on some) take a port a
# relay started later is configured to listen on.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    lo, _ = (int(x) for x in f.read().split())
lo = max(lo, 12000)
socks = []
for port in random.sample(range(10000, lo), lo - 10000):
    if len(socks) == n:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        socks.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# For tests that run dcr-relay processes: they keep their pids in the
# associative array PID (relay name -> pid) and set DCR, and their stores in
# $T/NAME.safetensors.

# A process held by a wait(FILE) failpoint that is not in PID (a
# background `dcr refit`) would keep cleanup's `wait` for the failpoint's
# hour if the test failed before letting it go: `release_on_exit FILE`
# names the file, and cleanup creates it first.
RELEASE=()
release_on_exit() { RELEASE+=("$1"); }
release_all() {
  local f
  for f in "${RELEASE[@]}"; do touch "$f" 2>/dev/null || true; done
}

# cleanup: let go of held processes (release_on_exit), SIGTERM every relay,
# SIGKILL what is left after 5 s, remove $T (kept, to read the logs of a
# run, when DCR_KEEP_TMP is set).
cleanup() {
  local n p
  release_all
  for n in "${!PID[@]}"; do kill -TERM "${PID[$n]}" 2>/dev/null || true; done
  for _ in $(seq 50); do  # at most 5 s, then SIGKILL what is left
    local alive=0
    for p in "${PID[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n ${DCR_KEEP_TMP:-} ]] || rm -rf "$T"
}

# start_relay is each script's (its arguments differ); these wait on it.
wait_ready() {  # wait_ready NAME...: every ready file within 10 s
  local n
  for n in "$@"; do
    for _ in $(seq 100); do
      [[ -s "$T/$n.ready" ]] && break
      kill -0 "${PID[$n]}" 2>/dev/null || { cat "$T/$n.log" >&2; fail "relay $n exited before it was ready"; }
      sleep 0.1
    done
    [[ -s "$T/$n.ready" ]] || { cat "$T/$n.log" >&2; fail "relay $n not ready within 10 s"; }
  done
}
stop_relay() {  # stop_relay NAME: SIGTERM, exit 0 within 5 s
  local n=$1 p=${PID[$1]} rc
  kill -TERM "$p"
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "relay $n still running 5 s after SIGTERM"
  set +e
  wait "$p"
  rc=$?
  set -e
  unset "PID[$n]"
  [[ $rc -eq 0 ]] || { cat "$T/$n.log" >&2; fail "relay $n exited $rc after SIGTERM, want 0"; }
}
refit_json() {  # refit_json CODE TOPOLOGY ARGS...: dcr refit -o json, exit CODE
  local want=$1 topo=$2
  shift 2
  expect "$want" "$DCR" refit --topology "$topo" --progress never -o json \
    --timeout 10s "$@"
}

json() {  # json EXPR...: each EXPR holds for d = the JSON on stdout of the last command
  python3 -S - "$T/out" "$@" <<'PY' || fail "JSON check failed (the output is above)"
import json, sys
d = json.load(open(sys.argv[1]))
for e in sys.argv[2:]:
    if not eval(e):
        print(json.dumps(d, indent=1), file=sys.stderr)
        print(f"not true: {e}", file=sys.stderr)
        sys.exit(1)
PY
}

node_json() {  # node_json NAME EXPR: EXPR holds for n = node NAME of d["nodes"]
  json "[n for n in d['nodes'] if n['node']=='$1'] and all($2 for n in d['nodes'] if n['node']=='$1')"
}

# small_serving_model STEPS [LR]: dcr-traingen's model at test size (hidden
# 64, 2 layers, vocabulary 300) in $T/ck (v0..vSTEPS, V set to it), and
# layouts/traingen-serve-tp2.yaml scaled to it in $T/serve.yaml. LR
# (default 2e-5, about 17% of elements changed per step) sets the change
# rate. Needs TRAINGEN and LAYOUTS.
small_serving_model() {
  "$TRAINGEN" --hidden 64 --layers 2 --heads 4 --kv-heads 2 --vocab 300 \
    --lr "${2:-2e-5}" --steps "$1" --out "$T/ck" >/dev/null 2>"$T/traingen.log" ||
    { cat "$T/traingen.log" >&2; fail "traingen"; }
  V=$T/ck
  small_serving_layout
}

# small_serving_layout: $T/serve.yaml, the vLLM-style tp 2 serving layout
# of that model.
small_serving_layout() {
  sed -e 's/32000/300/g; s/1024/64/g; s/2752/192/g; s/layers: 8/layers: 2/' \
    -e 's/heads: 16/heads: 4/; s/kv_heads: 4/kv_heads: 2/; s/head_dim: 64/head_dim: 16/' \
    -e 's/pad_to: 32/pad_to: 2/' "$LAYOUTS/traingen-serve-tp2.yaml" >"$T/serve.yaml"
}

# fp8_serving_layout: $T/fp8.yaml, $T/serve.yaml with its qkv and gate/up
# weights in FP8 blocks and o_proj with one scale per tensor.
fp8_serving_layout() {
  python3 - "$T/serve.yaml" "$T/fp8.yaml" <<'PY'
import sys
out = []
for line in open(sys.argv[1]):
    out.append(line)
    if "order: stacked" in line:
        out.append("    fp8: {block: [16, 32]}\n")
    if "split: gate_up" in line:
        out.append("    fp8: {block: [32, 32]}\n")
    if "o_proj" in line and "shard:" in line:
        out.append("    fp8: {block: tensor}\n")
open(sys.argv[2], "w").write("".join(out))
PY
}

verify_all() {  # verify_all CHECKPOINT NAME...: those stores hold it bit for bit
  local want=$1 n
  shift
  for n in "$@"; do
    expect 0 "$DCR" verify "$T/$n.safetensors" "$want"
  done
}
