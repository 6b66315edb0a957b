#!/usr/bin/env bash
# Frame authentication with real processes: two dcr-relay daemons on free
# loopback ports (r0 heads the cluster and forwards to r1) and a topology
# whose defaults.auth_key_file names a 32-byte key file:
#   a. key file errors: mode 644, too short, missing -> exit 2, one line
#      naming the file (dcr refit, dcr status, dcr-relay)
#   b. a delta refit with the key everywhere commits on both relays; dcr
#      status reaches both
#   c. a root (or dcr status) with another key or none reaches nobody
#      (aborted, exit 1)
#   d. r1 restarted with --auth-key-file set to another key: r0 cannot
#      reach it; back with the tree's key, the next refit commits
# Usage: auth_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
T=$(mktemp -d /tmp/dcr-auth-test.XXXXXX)
declare -A PID=()  # relay name -> pid of the running dcr-relay

trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"

# --- Models, keys, ports, topologies -------------------------------------
"$TRAINGEN" --out "$T/ck" --hidden 128 --layers 2 --vocab 4000 --lr 2e-6 \
  --steps 2 >/dev/null 2>"$T/traingen.log" || { cat "$T/traingen.log" >&2; fail "traingen"; }
V=$T/ck

umask 077
head -c 32 /dev/urandom >"$T/frame.key"
head -c 32 /dev/urandom >"$T/other.key"
head -c 16 /dev/urandom >"$T/short.key"
umask 022
chmod 600 "$T/frame.key" "$T/other.key" "$T/short.key"
cp "$T/frame.key" "$T/open.key"
chmod 644 "$T/open.key"

RELAYS=(r0 r1)  # fanout 1: the root -> r0 -> r1
read -r -a PORTS < <(python3 - "$((${#RELAYS[@]} + 1))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
[[ ${#PORTS[@]} -eq $((${#RELAYS[@]} + 1)) ]] || fail "could not pick free ports"

write_topology() {  # write_topology FILE KEY_FILE ("" for none)
  local i=1 n key=""
  [[ -n $2 ]] && key=", auth_key_file: \"$2\""
  {
    echo "version: 1"
    echo "defaults: {fanout: 1, min_commit: all$key}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"}"
    echo "clusters:"
    echo "  - name: train"
    echo "  - name: rollout"
    echo "    nodes:"
    for n in "${RELAYS[@]}"; do
      echo "      - {name: $n, host: 127.0.0.1, port: ${PORTS[$i]}, store: {kind: file, path: \"$T/$n.safetensors\"}}"
      i=$((i + 1))
    done
    echo "links:"
    echo "  - {from: train, to: rollout, bandwidth: 1Gbps, latency: 1ms}"
  } >"$1"
}
TOPO=$T/tree.yaml
write_topology "$TOPO" "$T/frame.key"
write_topology "$T/other.yaml" "$T/other.key"
write_topology "$T/nokey.yaml" ""
write_topology "$T/open.yaml" "$T/open.key"
write_topology "$T/short.yaml" "$T/short.key"
write_topology "$T/missing.yaml" "$T/missing.key"
expect 0 "$DCR" topo show "$TOPO" -o json
json "d['topology']['defaults']['auth_key_file'] == '$T/frame.key'"
expect 0 "$DCR" tree --topology "$TOPO" -o json
json '[n["name"] for n in d["nodes"]] == ["trainer", "r0", "r1"]' \
  'd["nodes"][2]["parent"] == 1'

start_relay() {  # start_relay NAME ARGS...: starts it in the background
  local n=$1
  shift
  rm -f "$T/$n.ready"
  "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" "$@" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}

for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

# --- a. Key file errors ----------------------------------------------------
for cmd in "refit --target $V/v1.safetensors" "status"; do
  # shellcheck disable=SC2086
  expect 2 "$DCR" $cmd --topology "$T/open.yaml"
  expect_err "chmod 600 $T/open.key"
  expect_err "open.yaml: defaults.auth_key_file: auth key file '$T/open.key' has mode 0644"
  # shellcheck disable=SC2086
  expect 2 "$DCR" $cmd --topology "$T/short.yaml"
  expect_err "auth key file '$T/short.key' holds 16 bytes"
  # shellcheck disable=SC2086
  expect 2 "$DCR" $cmd --topology "$T/missing.yaml"
  expect_err "auth key file '$T/missing.key' does not exist"
done
expect 2 "$RELAY" --topology "$T/open.yaml" --node r0
expect_err "chmod 600 $T/open.key"
expect 2 "$RELAY" --topology "$TOPO" --node r0 --auth-key-file "$T/open.key"
expect_err "--auth-key-file: auth key file '$T/open.key' has mode 0644"
expect 2 "$RELAY" --name r0 --listen "127.0.0.1:${PORTS[1]}" \
  --store "file:$T/r0.safetensors" --auth-key-file "$T/short.key"
expect_err "holds 16 bytes"
# Nothing was written: the baseline is still v0.
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v0.safetensors"
[[ ! -e "$T/root/epoch" ]] || fail "a refused refit wrote the epoch"

# --- b. The key everywhere: a delta refit commits ------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
for n in "${RELAYS[@]}"; do
  grep -q "frames are authenticated" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "relay $n did not log its key"; }
done
refit_json 0 "$TOPO" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed" and d["mode"] == "delta" and d["chunks"] > 0' \
  'all(n["committed"] and n["code"] == "ok" for n in d["nodes"])' \
  "len(d['nodes']) == ${#RELAYS[@]}"
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
expect 0 "$DCR" status --topology "$TOPO" -o json
json 'all(n["reachable"] and n["committed"]["step"] == 1 for n in d["nodes"])'

# --- c. A root with another key, or none, reaches nobody -----------------
for topo in "$T/other.yaml" "$T/nokey.yaml"; do
  refit_json 1 "$topo" --target "$V/v2.safetensors"
  json 'd["outcome"] == "aborted" and d["chunks"] == 0' \
    'not any(n["committed"] for n in d["nodes"])' \
    '[n["code"] in ("unreachable", "rejected") for n in d["nodes"] if n["node"] == "r0"] == [True]'
  verify_all "$V/v1.safetensors" "${RELAYS[@]}"
  expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"
  expect 1 "$DCR" status --topology "$topo" -o json --timeout 2s
  json 'not any(n["reachable"] for n in d["nodes"])'
done

# --- d. --auth-key-file overrides the topology's key ---------------------
stop_relay r1
start_relay r1 --auth-key-file "$T/other.key"
wait_ready r1
grep -q "key file $T/other.key" "$T/r1.log" || { cat "$T/r1.log" >&2; fail "r1 did not take --auth-key-file"; }
refit_json 1 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "aborted"' \
  '[n["code"] in ("unreachable", "rejected") for n in d["nodes"] if n["node"] == "r1"] == [True]'
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
stop_relay r1
start_relay r1
wait_ready r1
refit_json 0 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "committed"' 'all(n["committed"] for n in d["nodes"])'
verify_all "$V/v2.safetensors" "${RELAYS[@]}"

for n in "${RELAYS[@]}"; do stop_relay "$n"; done
echo "frame authentication: ok"
