#!/usr/bin/env bash
# Signed refits with real processes: three dcr-relay daemons in a chain
# (the root -> r0 -> r1 -> r2) on free loopback ports, every frame keyed
# with a shared HMAC key, the root signing each refit's manifest with an
# Ed25519 key made by `dcr keygen`, and every relay holding its public key:
#   a. dcr keygen: a pair (private mode 0600), never overwritten; key file
#      errors (private key readable by others, missing public key) exit 2
#      with one line naming the file
#   b. a signed delta refit commits everywhere, verified bit for bit
#   c. r1 holds the hop key but not the signing key and forges every chunk
#      it forwards (DCR_FAILPOINTS=relay.forward=forge): r2 votes no
#      (rejected, naming the chunk), the refit aborts, every store keeps
#      its bits
#   d. an unsigned refit (no root.signing_key_file) is refused by every
#      relay holding the public key
#   e. r1 back without the failpoint: the next signed refit commits
# Usage: signing_test.sh DCR_BINARY DCR_RELAY_BINARY TRAINGEN_BINARY
set -euo pipefail
DCR=$1
RELAY=$2
TRAINGEN=$3
T=$(mktemp -d /tmp/dcr-signing-test.XXXXXX)
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
umask 022

# --- a. dcr keygen and key file errors -----------------------------------
expect 0 "$DCR" keygen --private "$T/root.key" --public "$T/root.pub"
grep -qF "wrote $T/root.key" "$T/out" || { cat "$T/out" >&2; fail "keygen output"; }
[[ $(stat -c %a "$T/root.key") == 600 ]] || fail "private key mode $(stat -c %a "$T/root.key")"
grep -q "BEGIN PUBLIC KEY" "$T/root.pub" || fail "no PEM public key"
cp "$T/root.key" "$T/saved.key"
expect 2 "$DCR" keygen --private "$T/root.key" --public "$T/new.pub"
expect_err "private key file '$T/root.key' already exists"
[[ ! -e "$T/new.pub" ]] || fail "a refused keygen wrote the public key"
cmp -s "$T/root.key" "$T/saved.key" || fail "keygen overwrote the private key"
expect 2 "$DCR" keygen --private "$T/new.key" --public "$T/root.pub"
expect_err "public key file '$T/root.pub' already exists"
[[ ! -e "$T/new.key" ]] || fail "a refused keygen left a private key"
cp "$T/root.key" "$T/open.key"
chmod 644 "$T/open.key"

RELAYS=(r0 r1 r2)  # fanout 1: the root -> r0 -> r1 -> r2
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

write_topology() {  # write_topology FILE SIGNING_KEY ("" for none) PUBLIC_KEY
  local i=1 n sign="" pub=""
  [[ -n $2 ]] && sign=", signing_key_file: \"$2\""
  [[ -n $3 ]] && pub=", signing_public_key_file: \"$3\""
  {
    echo "version: 1"
    echo "defaults: {fanout: 1, min_commit: all, auth_key_file: \"$T/frame.key\"$pub}"
    echo "root: {name: trainer, host: 127.0.0.1, port: ${PORTS[0]}, cluster: train, state_dir: \"$T/root\", baseline: \"$T/base.safetensors\"$sign}"
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
write_topology "$TOPO" "$T/root.key" "$T/root.pub"
write_topology "$T/unsigned.yaml" "" "$T/root.pub"
write_topology "$T/open.yaml" "$T/open.key" "$T/root.pub"
write_topology "$T/nopub.yaml" "$T/root.key" "$T/missing.pub"

start_relay() {  # start_relay NAME [ENV=VALUE...]: starts it in the background
  local n=$1
  shift
  rm -f "$T/$n.ready"
  env "$@" "$RELAY" --topology "$TOPO" --node "$n" --ready-file "$T/$n.ready" \
    >>"$T/$n.log" 2>&1 &
  PID[$n]=$!
}

for n in "${RELAYS[@]}"; do cp "$V/v0.safetensors" "$T/$n.safetensors"; done
cp "$V/v0.safetensors" "$T/base.safetensors"

expect 2 "$DCR" refit --topology "$T/open.yaml" --target "$V/v1.safetensors"
expect_err "open.yaml: root.signing_key_file: signing key file '$T/open.key' has mode 0644"
expect_err "chmod 600 $T/open.key"
[[ ! -e "$T/root/epoch" ]] || fail "a refused refit wrote the epoch"
expect 2 "$RELAY" --topology "$T/nopub.yaml" --node r0
expect_err "nopub.yaml: defaults.signing_public_key_file: signing public key file '$T/missing.pub' does not exist"
expect 2 "$RELAY" --topology "$TOPO" --node r0 --signing-public-key-file "$T/root.key"
expect_err "--signing-public-key-file: signing public key file '$T/root.key' is not a PEM public key"

# --- b. A signed refit commits everywhere --------------------------------
for n in "${RELAYS[@]}"; do start_relay "$n"; done
wait_ready "${RELAYS[@]}"
for n in "${RELAYS[@]}"; do
  grep -q "refits must be signed by the root" "$T/$n.log" ||
    { cat "$T/$n.log" >&2; fail "relay $n did not log its public key"; }
done
refit_json 0 "$TOPO" --target "$V/v1.safetensors"
json 'd["outcome"] == "committed" and d["chunks"] > 0' \
  'all(n["committed"] and n["code"] == "ok" for n in d["nodes"])'
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"

# --- c. r1 forges every chunk it forwards: r2 catches it -----------------
stop_relay r1
start_relay r1 DCR_FAILPOINTS=relay.forward=forge
wait_ready r1
refit_json 1 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "aborted"'
node_json r2 'n["code"] == "rejected" and n["phase"] == "vote" and "applied here with SHA-256" in n["detail"] and "signed manifest" in n["detail"]'
node_json r0 'n["code"] == "ok"'
node_json r1 'n["code"] == "ok"'
grep -q "failpoint relay.forward (hit 1): forge" "$T/r1.log" || { cat "$T/r1.log" >&2; fail "r1 did not forge"; }
grep -q "r2: vote no (chunk (tensor" "$T/r2.log" || { cat "$T/r2.log" >&2; fail "r2 did not name the chunk"; }
verify_all "$V/v1.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v1.safetensors"

# --- d. An unsigned refit is refused -------------------------------------
stop_relay r1
start_relay r1
wait_ready r1
refit_json 1 "$T/unsigned.yaml" --target "$V/v2.safetensors"
json 'd["outcome"] == "aborted"' \
  'all(n["code"] == "rejected" and n["phase"] == "vote" and "END carries no signed manifest" in n["detail"] for n in d["nodes"])'
verify_all "$V/v1.safetensors" "${RELAYS[@]}"

# --- e. The honest tree commits the next signed refit --------------------
refit_json 0 "$TOPO" --target "$V/v2.safetensors"
json 'd["outcome"] == "committed"' 'all(n["committed"] for n in d["nodes"])'
verify_all "$V/v2.safetensors" "${RELAYS[@]}"
expect 0 "$DCR" verify "$T/base.safetensors" "$V/v2.safetensors"

for n in "${RELAYS[@]}"; do stop_relay "$n"; done
echo "signed refits: ok"
